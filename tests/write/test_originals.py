"""``--image_format original`` end to end: the command stores source JPEGs byte for byte where it
can, makes upright JPEGs of the rest, counts both in the manifest and the summary, on both sinks;
``--no_upscale`` keeps small images at their size."""
from __future__ import annotations

import hashlib
import io
import json
import pathlib

import numpy as np
import pytest
from helpers import encode, prepare_here, read_split, run_prepare
from lazy import tf
from PIL import Image, ImageOps

from beam_prep.tools.sample import picture

SIDE = 64  # --image_size: the shorter side under shorter_side
FLAGS = ("--resize_mode", "shorter_side", "--image_size", str(SIDE), "--no_upscale",
         "--image_format", "original", "--jpeg_quality", "95", "--num_shards", "2")
# Source name -> what the run must do with it: kept byte for byte, or the reason it was re-encoded.
EXPECTED = {
    "plain/small.jpg": "kept",             # 60x45: smaller than the target, kept under --no_upscale
    "plain/progressive.jpg": "kept",       # 45x60
    "plain/exact.jpg": "kept",             # 96x64: the shorter side is the target already
    "plain/subsampled_444.jpg": "kept",    # 80x60, no chroma subsampling
    "other/drawing.png": "not_jpeg",
    "other/cmyk.jpg": "cmyk",
    "other/grey.jpg": "channels",
    "other/rotated.jpg": "rotated",
    "other/large.jpg": "resized",          # 300x200: shrunk to 96x64
}
TRUNCATED = "other/truncated.jpg"


def _rotated(upright: Image.Image) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # turn 90 degrees clockwise to see it upright
    return encode(upright.transpose(Image.Transpose.ROTATE_90), "JPEG", quality=95, exif=exif.tobytes())


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("originals") / "tree"
    sources = {
        "plain/small.jpg": encode(picture(1, 60, 45), "JPEG", quality=87),
        "plain/progressive.jpg": encode(picture(2, 45, 60), "JPEG", quality=92, progressive=True),
        "plain/exact.jpg": encode(picture(3, 96, 64), "JPEG", quality=80),
        "plain/subsampled_444.jpg": encode(picture(4, 80, 60), "JPEG", quality=90, subsampling=0),
        "other/drawing.png": encode(picture(5, 50, 40), "PNG"),
        "other/cmyk.jpg": encode(picture(6, 50, 40).convert("CMYK"), "JPEG", quality=95),
        "other/grey.jpg": encode(picture(7, 50, 40).convert("L"), "JPEG", quality=95),
        "other/rotated.jpg": _rotated(picture(8, 48, 40)),
        "other/large.jpg": encode(picture(9, 300, 200), "JPEG", quality=95),
        TRUNCATED: encode(picture(10, 200, 150), "JPEG", quality=90)[:-500],
    }
    for name, data in sources.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def _prepare(tmp_path_factory, tree: pathlib.Path, *extra: str):
    out = tmp_path_factory.mktemp("out") / "out"
    result = run_prepare("--input", str(tree), "--output", str(out), "--direct_running_mode=in_memory",
                         *FLAGS, *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result


@pytest.fixture(scope="module")
def streaming(tmp_path_factory, tree):
    return _prepare(tmp_path_factory, tree)


@pytest.fixture(scope="module")
def shuffled(tmp_path_factory, tree):
    """The distributed path: WriteToTFRecord after the runner's shuffle, GZIP'd as asked."""
    return _prepare(tmp_path_factory, tree, "--sink", "shuffle", "--compression", "gzip")


def _records(out: pathlib.Path) -> dict[str, dict]:
    return {r["image/filename"].decode(): r for r in read_split(out, "train")}


def test_plain_jpegs_are_stored_byte_for_byte(tree, streaming):
    records = _records(streaming[0])
    for name, what in EXPECTED.items():
        source = (tree / name).read_bytes()
        record = records[name]
        assert record["image/format"] == b"jpeg"
        assert record["image/key/sha256"].decode() == hashlib.sha256(source).hexdigest()
        assert (record["image/encoded"] == source) == (what == "kept"), name
        # Height and width are the stored image's, as TensorFlow reads them.
        shape = tf.image.extract_jpeg_shape(record["image/encoded"]).numpy()
        assert (record["image/height"], record["image/width"], record["image/channels"]) == (*shape[:2], 3)


def test_everything_else_decodes_with_tensorflow_to_the_upright_source_pixels(tree, streaming):
    records = _records(streaming[0])
    for name, what in EXPECTED.items():
        if what in ("kept", "resized"):
            continue
        # The upright source, as a viewer shows it; grey and CMYK as Pillow turns them into RGB.
        upright = np.asarray(ImageOps.exif_transpose(Image.open(tree / name)).convert("RGB")).astype(int)
        # TensorFlow's decode_jpeg, which knows no EXIF and no CMYK: what training code runs.
        got = tf.io.decode_jpeg(records[name]["image/encoded"], channels=3).numpy().astype(int)
        assert got.shape == upright.shape, name
        assert np.abs(got - upright).mean() < 3, name  # one JPEG encoding at q95


def test_originals_are_stored_uncompressed_unless_compression_is_asked_for(streaming, shuffled):
    # Whole JPEGs barely compress: without --compression the shards are plain .tfrecord files.
    for (out, _), compression, suffix in ((streaming, "NONE", ".tfrecord"), (shuffled, "GZIP", ".tfrecord.gz")):
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["compression"] == compression
        shards = manifest["splits"]["train"]["shards"]
        assert shards and all(name.endswith(suffix) for name in shards), shards
        first = (out / shards[0]).read_bytes()
        assert (first[:2] == b"\x1f\x8b") == (compression == "GZIP")
    assert len(read_split(shuffled[0], "train")) == len(read_split(streaming[0], "train")) == 9


def test_no_upscale_keeps_small_images_and_shrinks_large_ones(streaming):
    records = _records(streaming[0])
    sizes = {name: (int(r["image/height"]), int(r["image/width"])) for name, r in records.items()}
    assert sizes["plain/small.jpg"] == (45, 60) and sizes["plain/progressive.jpg"] == (60, 45)
    assert sizes["plain/exact.jpg"] == (64, 96) and sizes["other/large.jpg"] == (64, 96)


def test_the_manifest_and_summary_count_kept_and_reencoded_by_reason(streaming):
    out, result = streaming
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["originals"] == {
        "kept": 4, "reencoded": 5,
        "reencoded_by_reason": {"not_jpeg": 1, "cmyk": 1, "channels": 1, "rotated": 1, "resized": 1}}
    assert manifest["counts"] == {"listed": 10, "written": 9, "failed": 1, "skipped": 0}
    # The reader is told: JPEG, of varying size.
    assert manifest["image"] == {"height": None, "width": None, "channels": 3, "format": "jpeg",
                                 "resize_mode": "shorter_side"}
    assert manifest["options"]["image_format"] == "original" and manifest["options"]["no_upscale"] is True
    lines = result.stdout.splitlines()
    assert "  originals kept byte for byte: 4" in lines
    for line in ("  re-encoded, not a JPEG (PNG, GIF, WebP, BMP, TIFF...): 1", "  re-encoded, a CMYK JPEG: 1",
                 "  re-encoded, a JPEG of another channel count than --channels: 1",
                 "  re-encoded, a JPEG with an EXIF rotation: 1", "  re-encoded, a JPEG that --resize_mode resizes: 1"):
        assert line in lines, result.stdout


def test_inspect_shows_the_same_counts(streaming, capsys):
    from pipelines.inspect_output import main as inspect_main

    out, result = streaming
    assert inspect_main([str(out)]) == 0
    table = capsys.readouterr().out.splitlines()
    summary = [line for line in result.stdout.splitlines() if "originals kept" in line or "re-encoded," in line]
    assert len(summary) == 6 and [line for line in table if line in summary] == summary
    assert inspect_main([str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["originals"]["kept"] == 4


def test_a_truncated_jpeg_is_reported_not_stored(streaming):
    out, _ = streaming
    assert TRUNCATED not in _records(out)
    (failure,) = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert failure["relpath"] == TRUNCATED and failure["stage"] == "decode"
    assert "truncated" in failure["message"]


def test_the_shuffle_sink_stores_and_counts_the_same(streaming, shuffled):
    ours, theirs = (json.loads((out / "manifest.json").read_text()) for out, _ in (streaming, shuffled))
    assert theirs["sink"] == "shuffle" and theirs["originals"] == ours["originals"]
    by_name = {name: r["image/encoded"] for name, r in _records(streaming[0]).items()}
    assert {name: r["image/encoded"] for name, r in _records(shuffled[0]).items()} == by_name


def test_channels_1_keeps_grey_jpegs_and_converts_colour_ones(tmp_path):
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True)
    grey = encode(picture(1, 40, 30).convert("L"), "JPEG", quality=90)
    (tree / "a" / "grey.jpg").write_bytes(grey)
    (tree / "a" / "colour.jpg").write_bytes(encode(picture(2, 40, 30), "JPEG", quality=90))
    out = tmp_path / "out"
    prepare_here("--input", str(tree), "--output", str(out), "--resize_mode", "none", "--image_format", "original",
                 "--channels", "1")
    records = _records(out)
    assert records["a/grey.jpg"]["image/encoded"] == grey
    colour = records["a/colour.jpg"]
    assert Image.open(io.BytesIO(colour["image/encoded"])).mode == "L" and colour["image/channels"] == 1
    assert json.loads((out / "manifest.json").read_text())["originals"] == {
        "kept": 1, "reencoded": 1, "reencoded_by_reason": {"channels": 1}}


@pytest.mark.parametrize("mode", ["center_crop", "stretch", "pad"])
def test_no_upscale_with_a_fixed_size_mode_is_refused_before_any_work(tree, tmp_path, mode):
    out = tmp_path / "out"
    result = run_prepare("--input", str(tree), "--output", str(out), "--resize_mode", mode, "--no_upscale")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --no_upscale applies to the size-keeping resize modes (shorter_side, and none, which never "
        f"enlarges), not {mode}, which gives every image one size")
    assert not out.exists()


def test_original_with_a_fixed_size_mode_is_allowed_and_the_help_says_so(tree, tmp_path):
    result = run_prepare("--help")
    assert "With center_crop, stretch or pad it keeps only the sources already at exactly --image_size" in \
        " ".join(result.stdout.split())
    out = tmp_path / "out"
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", "64x96", "--image_format", "original")
    records = _records(out)
    assert records["plain/exact.jpg"]["image/encoded"] == (tree / "plain/exact.jpg").read_bytes()
    assert {(int(r["image/height"]), int(r["image/width"])) for r in records.values()} == {(64, 96)}
    assert json.loads((out / "manifest.json").read_text())["originals"]["kept"] == 1


def _with_unused_tail(jpeg: bytes, tail: bytes = b"\x5a" * 20) -> bytes:
    """Padding no decode uses, before the end marker (libjpeg reads a few bytes ahead as it decodes, and
    warns of those it skips beyond them)."""
    return jpeg[:-2] + tail + jpeg[-2:]


def _with_a_gap(jpeg: bytes) -> bytes:
    """Three stray bytes between the first marker segment and the next marker."""
    end = 4 + int.from_bytes(jpeg[4:6], "big")
    return jpeg[:end] + b"\x00\x11\x22" + jpeg[end:]


@pytest.mark.slow  # a pipeline in a subprocess, and TensorFlow
def test_jpegs_libjpeg_calls_corrupt_are_reencoded_not_kept(tmp_path, capfd):
    """TensorFlow's decode_jpeg (libjpeg) prints "Corrupt JPEG data" for these on every read, naming no
    file: the run re-encodes them, so the records read in silence, and counts them by that reason."""
    sources = {"damaged/padded.jpg": _with_unused_tail(encode(picture(11, 60, 45), "JPEG", quality=90)),
               "damaged/gap.jpg": _with_a_gap(encode(picture(12, 60, 45), "JPEG", quality=90)),
               "damaged/progressive.jpg": _with_unused_tail(encode(picture(13, 45, 60), "JPEG", quality=90,
                                                                   progressive=True), bytes(20)),
               "plain/clean.jpg": encode(picture(14, 60, 45), "JPEG", quality=90)}
    for name, data in sources.items():
        (tmp_path / "in" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / name).write_bytes(data)
    capfd.readouterr()
    for name, data in sources.items():  # the independent judge: libjpeg's own words, from TensorFlow
        tf.io.decode_jpeg(data).numpy()
        warned = capfd.readouterr().err
        assert ("Corrupt JPEG data" in warned) == name.startswith("damaged/"), (name, warned)
    out = tmp_path / "out"
    result = run_prepare("--input", str(tmp_path / "in"), "--output", str(out), "--direct_running_mode=in_memory",
                         *FLAGS)
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["originals"] == {"kept": 1, "reencoded": 3, "reencoded_by_reason": {"corrupt": 3}}
    assert ("  re-encoded, a JPEG whose data libjpeg calls corrupt (a reader would warn on every read): 3"
            in result.stdout.splitlines()), result.stdout
    records = _records(out)
    assert records["plain/clean.jpg"]["image/encoded"] == sources["plain/clean.jpg"]
    capfd.readouterr()
    for name, data in sources.items():
        got = tf.io.decode_jpeg(records[name]["image/encoded"]).numpy().astype(int)
        assert "Corrupt JPEG data" not in capfd.readouterr().err, name
        assert np.abs(got - np.asarray(Image.open(io.BytesIO(data))).astype(int)).mean() < 3, name
