"""The contact sheet of a dataset the JPEG one in test_inspection.py does not cover: raw grayscale pixels of
varying sizes, a label with no images, and label ids stored from 1 (--label_offset 1)."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import make_tree, prepare_here, read_split
from PIL import Image

from beam_prep.reader import load_info
from beam_prep.tools import contact_sheet

SIZES = {"a": (24, 16), "b": (16, 20)}  # (width, height) of each class's source images


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    root = tmp_path_factory.mktemp("sheet")
    make_tree(root / "tree", {"a": 3}, size=SIZES["a"], fmt="PNG", ext=".png")
    make_tree(root / "tree", {"b": 2}, size=SIZES["b"], fmt="PNG", ext=".png")
    (root / "labels.txt").write_text("a\nb\nc\n")  # c: a label with no folder, so no images
    out = root / "out"
    prepare_here("--input", str(root / "tree"), "--output", str(out), "--labels_file",
                 str(root / "labels.txt"), "--image_format", "raw", "--channels", "1",
                 "--resize_mode", "none", "--label_offset", "1")
    return out


@pytest.fixture(scope="module")
def sheet(output):
    return contact_sheet.make_contact_sheet(load_info(str(output)), "train", per_class=4)


def test_raw_grayscale_images_of_varying_size_are_shown_at_their_own_size(output, sheet):
    records: dict[int, list[np.ndarray]] = {}
    for r in read_split(output, "train"):
        h, w = int(r["image/height"]), int(r["image/width"])
        records.setdefault(int(r["image/class/label"]), []).append(
            np.frombuffer(r["image/encoded"], np.uint8).reshape(h, w))
    pixels = np.asarray(sheet.image)
    assert sorted(records) == [1, 2]  # stored from 1
    assert [len(row.boxes) for row in sheet.rows] == [3, 2, 0]
    for row, name in zip(sheet.rows, "abc"):
        for left, top, right, bottom in row.boxes:
            assert (right - left, bottom - top) == SIZES[name]  # not stretched to the cell
            cell = pixels[top:bottom, left:right]
            assert (cell[..., 0] == cell[..., 1]).all() and (cell[..., 1] == cell[..., 2]).all()
            assert any((cell[..., 0] == r).all() for r in records[row.label_id]), row.caption
            assert cell.std() > 0


def test_a_label_without_images_gets_a_captioned_row_that_says_so(sheet):
    empty = sheet.rows[2]
    assert empty.caption == "c (3)" and empty.boxes == ()  # the stored id: index 2 + offset 1
    pixels = np.asarray(sheet.image)
    assert (pixels[empty.top:empty.bottom, :empty.left] != contact_sheet.BACKGROUND).any()  # caption
    assert (pixels[empty.top:empty.bottom, empty.left:] != contact_sheet.BACKGROUND).any()  # "no examples"
    assert empty.top >= sheet.rows[1].bottom  # below b's row: label order


def test_the_default_cell_fits_the_largest_image_shown(sheet):
    assert sheet.cell == max(max(size) for size in SIZES.values())


def test_the_sheet_saves_as_png(tmp_path, sheet):
    contact_sheet.save(sheet, str(tmp_path / "s.png"))
    png = Image.open(tmp_path / "s.png")
    assert png.format == "PNG" and png.size == sheet.image.size
