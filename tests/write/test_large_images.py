"""An image over Pillow's own decompression-bomb limit (about 179 MP) prepares when --max_pixels lets it
through, and is refused naming --max_pixels when it does not: one limit, ours."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from helpers import make_tree, read_split, run_prepare
from PIL import Image

pytestmark = pytest.mark.slow

# 187.5 MP: over Pillow's error limit (2 x 89,478,485 pixels), a 4.7 MB JPEG.
WIDTH, HEIGHT = 15_000, 12_500
OUT_HEIGHT, OUT_WIDTH = 125, 150  # a 100th of each side


def wave(n: int, periods: int, phase: float) -> np.ndarray:
    """0..127 along one axis, ``periods`` sine periods over ``n`` pixels, sampled at pixel centres."""
    return 63.5 + 63.5 * np.sin(2 * np.pi * periods * (np.arange(n) + 0.5) / n + phase)


def panorama(height: int, width: int) -> np.ndarray:
    """A smooth picture of any size: the same waves, so a downscale of a large one is the small one."""
    return np.add.outer(wave(height, 2, 1.0), wave(width, 3, 0.0))


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("large") / "in"
    make_tree(root, {"scans": 2}, size=(64, 48))
    big = io.BytesIO()
    Image.fromarray(np.round(panorama(HEIGHT, WIDTH)).astype(np.uint8), "L").save(big, "JPEG", quality=92)
    (root / "scans" / "panorama.jpg").write_bytes(big.getvalue())
    return root


def prepare(tree, out, max_pixels: int):
    result = run_prepare("--input", str(tree), "--output", str(out), "--image_size", f"{OUT_HEIGHT}x{OUT_WIDTH}",
                         "--resize_mode", "stretch", "--channels", "1", "--image_format", "png",
                         "--max_pixels", str(max_pixels), "--direct_num_workers", "1")
    assert result.returncode == 0, result.stderr
    return result


def test_an_image_over_pillows_limit_prepares_under_a_larger_max_pixels(tree, tmp_path):
    out = tmp_path / "out"
    result = prepare(tree, out, 300_000_000)
    assert result.stderr == ""  # no DecompressionBombWarning, no error row
    assert (out / "errors.jsonl").read_text() == ""
    (record,) = [r for r in read_split(out, "train") if r["image/filename"].endswith(b"panorama.jpg")]
    written = np.asarray(Image.open(io.BytesIO(record["image/encoded"])), dtype=np.float64)
    assert written.shape == (OUT_HEIGHT, OUT_WIDTH)
    reference = panorama(OUT_HEIGHT, OUT_WIDTH)  # the same waves, drawn at the output's size
    psnr = 10 * np.log10(255**2 / np.mean((written - reference) ** 2))
    assert psnr > 35, psnr


def test_an_image_over_max_pixels_is_one_error_row_naming_max_pixels(tree, tmp_path):
    out = tmp_path / "out"
    prepare(tree, out, 150_000_000)
    rows = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert [(row["stage"], row["path"].rsplit("/", 1)[-1]) for row in rows] == [("too_large", "panorama.jpg")]
    assert rows[0]["message"] == ("15000x12500 is 187500000 pixels, over --max_pixels 150000000: if the image is "
                                "genuine, pass --max_pixels 187500000 or more")
    assert json.loads((out / "manifest.json").read_text())["counts"]["written"] == 2
