"""``inspect --leakage`` opens only files under the run's input folder: duplicates.jsonl is data, and a path in
it that is absolute elsewhere or climbs out with ``..`` is refused in one line (the file, the line, the value)
before any image is opened or the sheet written. An output folder made from the dataset model and
duplicates.jsonl lines as the writer words them: no pipeline runs."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import threading

import numpy as np
import pytest
from PIL import Image

from beam_prep.errors import UnsafeName
from beam_prep.model.dataset import DatasetInfo, ImageInfo, SplitInfo
from beam_prep.tools import leakage_sheet
from beam_prep.tools.sample import picture
from pipelines import inspect_output

CELL = 40


def _output(tmp_path: pathlib.Path, input_root: str, paths: list[str], sha256: str | None = None) -> pathlib.Path:
    """An output folder whose duplicates.jsonl holds one exact group across train and validation: ``paths``,
    with the sha256 of the picture the ``tree`` fixture puts in the input (or ``sha256``)."""
    sha256 = sha256 or hashlib.sha256((tmp_path / "in" / "a" / "one.png").read_bytes()).hexdigest()
    out = tmp_path / "out"
    out.mkdir()
    info = DatasetInfo(root="", labels=("a",), image=ImageInfo(8, 8),
                       splits={"train": SplitInfo("train", ("train-00000-of-00001.tfrecord.gz",), 1),
                               "validation": SplitInfo("validation", ("validation-00000-of-00001.tfrecord.gz",), 1)})
    (out / "manifest.json").write_text(json.dumps({**info.to_json(), "options": {"input": input_root}}))
    splits = ["validation", *["train"] * (len(paths) - 1)]
    (out / "duplicates.jsonl").write_text("".join(
        json.dumps({"kind": "exact", "sha256": sha256, "split": split, "path": path}) + "\n"
        for split, path in zip(splits, paths)))
    return out


@pytest.fixture
def tree(tmp_path):
    """The run's input, with a picture in it, and a victim's picture outside it."""
    root = tmp_path / "in"
    (root / "a").mkdir(parents=True)
    picture(1, 64, 64).save(root / "a" / "one.png")
    (tmp_path / "victim").mkdir()
    picture(2, 64, 64).save(tmp_path / "victim" / "evil.png")
    return root


def test_the_files_under_the_input_are_drawn(tmp_path, tree):
    inside = str(tree / "a" / "one.png")
    out = _output(tmp_path, str(tree), [inside, "a/one.png"])  # a relative path is taken under the input
    sheet = leakage_sheet.make_leakage_sheet(str(out), cell=CELL)
    (caption, files), = sheet.rows
    assert caption == "exact copies " + hashlib.sha256((tree / "a" / "one.png").read_bytes()).hexdigest()[:12] \
        and files == (("validation", inside), ("train", inside))
    # Both cells show the picture, not the "cannot read" note: the middle pixel of each is the picture's.
    expected = np.asarray(picture(1, 64, 64).resize((CELL, CELL), Image.Resampling.LANCZOS))[CELL // 2, CELL // 2]
    pixels = np.asarray(sheet.image)
    left = sheet.image.width - leakage_sheet.PAD - 2 * (CELL + leakage_sheet.PAD)
    for column in range(2):
        x = left + column * (CELL + leakage_sheet.PAD) + CELL // 2
        got = pixels[leakage_sheet.PAD + CELL // 2, x].astype(int)
        assert np.abs(got - expected.astype(int)).max() <= 8, (column, got, expected)


def test_only_the_files_the_run_hashed_are_drawn_whatever_input_the_manifest_names(tmp_path, tree):
    """The input folder is the manifest's word: one naming ``/`` let any file be drawn (a victim's picture
    outside the run's input, a device or a pipe opened). A file is drawn only with the bytes the run
    hashed; any other cell says so."""
    victim = tmp_path / "victim" / "evil.png"
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)  # opened, it would block the sheet for good: a regression fails (after 5 s), not hangs

    def unblock() -> None:
        with contextlib.suppress(OSError):  # ENXIO: no reader opened it, as it should be
            os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))

    timer = threading.Timer(5, unblock)
    timer.start()
    try:
        out = _output(tmp_path, "/", [str(tree / "a" / "one.png"), str(victim), str(pipe)])
        sheet = leakage_sheet.make_leakage_sheet(str(out), cell=CELL)
    finally:
        timer.cancel()
    pixels = np.asarray(sheet.image).astype(int)
    left = sheet.image.width - leakage_sheet.PAD - 3 * (CELL + leakage_sheet.PAD)
    cells = [pixels[leakage_sheet.PAD:leakage_sheet.PAD + CELL, x:x + CELL]
             for x in range(left, left + 3 * (CELL + leakage_sheet.PAD), CELL + leakage_sheet.PAD)]
    coloured = [int((np.ptp(c, axis=2) > 16).sum()) for c in cells]  # the pictures' pixels; text is grey
    # The files are sorted validation first, then by path: one.png (drawn), pipe and evil.png (not drawn).
    assert coloured[0] > CELL * CELL // 4 and coloured[1:] == [0, 0], coloured


@pytest.mark.parametrize("hostile", ["{victim}", "{root}/../victim/evil.png", "../victim/evil.png",
                                     "{root}x/evil.png"])
def test_a_path_outside_the_input_is_refused_before_any_image_is_opened(tmp_path, tree, hostile, monkeypatch):
    value = hostile.format(victim=tmp_path / "victim" / "evil.png", root=tree)
    out = _output(tmp_path, str(tree), [str(tree / "a" / "one.png"), value])
    opened, real_open = [], Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: opened.append(a) or real_open(*a, **k))
    with pytest.raises(UnsafeName) as caught:
        leakage_sheet.make_leakage_sheet(str(out))
    assert str(caught.value) == (f"{out}/duplicates.jsonl: line 2's path is {value!r}, not a path under {tree} (it "
                                 "is absolute elsewhere, or holds . or ..): only files under it are opened")
    assert opened == []


def test_a_run_that_recorded_no_input_opens_nothing(tmp_path, tree):
    out = _output(tmp_path, "", [str(tree / "a" / "one.png"), str(tree / "a" / "one.png")])
    with pytest.raises(UnsafeName, match=r"line 1's path is .*, and the run recorded no input folder"):
        leakage_sheet.make_leakage_sheet(str(out))


@pytest.mark.slow  # inspect's summary stats the shards with TensorFlow
def test_inspect_leakage_exits_2_and_writes_no_sheet(tmp_path, tree, capsys):
    victim = tmp_path / "victim" / "evil.png"
    out = _output(tmp_path, str(tree), [str(tree / "a" / "one.png"), str(victim)])
    sheet = tmp_path / "leaks.png"
    assert inspect_output.main([str(out), "--leakage", str(sheet)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {out}/duplicates.jsonl: line 2's path is {str(victim)!r}, not a path under {tree} (it is "
        "absolute elsewhere, or holds . or ..): only files under it are opened")
    assert not sheet.exists()
