"""Every image in Pillow's own test suite through the command, against an independent reference.

Pillow's Tests/images (about 700 files in the formats beam-prep reads: odd modes,
16-bit and palette transparency, EXIF and XMP rotations, CMYK and LAB, Group-4
faxes, animations, truncated and hostile files) sorted into ``<format>/`` label
folders and prepared twice: with the defaults (224x224 centre crops, 3 channels,
JPEG q90), and as 1-channel images of 64 pixels on the shorter side.

Each file must end one way (``reference_image``, ``differential``):
- the strict decoder (a full Pillow decode, truncated files refused) refuses it:
  a line of errors.jsonl at its stage (decode, or too_large), never a record;
- otherwise a record whose pixels match the reference (upright, 16-bit >> 8,
  transparency on white, the exact centre box resized with Lanczos): PSNR at
  least 20 dB, no channel's mean more than 8 levels off, a correlation of at
  least 0.9 with a reference that is not flat, and nearer the upright reference
  than any turned one; over the run, a median PSNR of at least 35 dB.
The bounds allow for beam-prep's bicubic resize, its JPEG draft decode and the
q90 encoding (correct records: lowest 21.9 dB and correlation 0.93, median
39 dB), not for a wrong image (black, sideways, a transparent colour shown:
5-15 dB). ``reference_image.mismatch`` says why each bound is where it is.
"""
from __future__ import annotations

import collections
import pathlib
import statistics

import pytest
from differential import Run, Verdicts, assert_counts_add_up, judge, prepare
from real_images import format_of, make_tree
from reference_image import Target

# Each run: what the reference makes, and the flags that ask beam-prep for it.
RUNS = {
    "default": (Target(), ()),
    "gray_shorter_side": (Target(height=64, width=64, channels=1, resize_mode="shorter_side"),
                          ("--channels", "1", "--resize_mode", "shorter_side", "--image_size", "64")),
}
MIN_MEDIAN_PSNR = 35.0


@pytest.fixture(scope="module")
def tree(pillow_images, tmp_path_factory) -> tuple[pathlib.Path, list[str]]:
    root = tmp_path_factory.mktemp("real_images") / "tree"
    return root, sorted(make_tree(pillow_images, root))


@pytest.fixture(scope="module", params=sorted(RUNS))
def outcome(request, tree, tmp_path_factory) -> tuple[Run, Verdicts]:
    target, flags = RUNS[request.param]
    root, names = tree
    run = prepare(root, tmp_path_factory.mktemp(request.param), *flags)
    return run, judge(run, root, names, target)


def test_counts_add_up(outcome, tree):
    run, _ = outcome
    assert_counts_add_up(run, tree[1])


def test_what_the_strict_decoder_refuses_is_reported_not_written(outcome):
    _, verdicts = outcome
    assert not verdicts.report(refused=True), verdicts.report(refused=True)


def test_everything_else_is_written_and_matches_the_reference(outcome):
    _, verdicts = outcome
    assert not verdicts.report(refused=False), verdicts.report(refused=False)


def test_typical_fidelity(outcome, tree, capsys):
    """The median bound, and the figures for the README (``pytest -s`` shows them)."""
    run, verdicts = outcome
    by_format = collections.Counter(format_of(name) for name in tree[1])
    with capsys.disabled():
        print(f"\n{len(tree[1])} files ({dict(sorted(by_format.items()))}): {verdicts.figures(run)}")
    assert statistics.median(verdicts.psnr.values()) >= MIN_MEDIAN_PSNR
