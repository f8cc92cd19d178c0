"""End to end on the real DirectRunner, as a user runs it; the output is read back with plain tf.data."""
from __future__ import annotations

import collections
import gzip
import hashlib
import io
import itertools
import json
import os
import warnings

import numpy as np
import pytest
from helpers import assert_shard_checksums, encode, make_tree, prepare_here, read_split, run_prepare
from lazy import tf
from PIL import Image

from beam_prep.model.features import decode_example
from beam_prep.tools.sample import picture

LABELS = {"cat": 14, "dog": 10, "émeu": 6}
HEIGHT, WIDTH = 24, 32


def records_of(output, split):
    return read_split(output, split)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    make_tree(root, LABELS, size=(90, 60))
    (root / "cat" / "exact.png").write_bytes(encode(picture(99, WIDTH, HEIGHT), "PNG"))
    bad = {
        "cat/broken.jpg": b"this is not an image",
        "dog/truncated.jpg": encode(picture(5, 90, 60))[:300],
        "émeu/huge.png": encode(picture(6, 400, 300), "PNG"),
    }
    for rel, data in bad.items():
        (root / rel).write_bytes(data)
    (root / "cat" / "notes.txt").write_text("skip me")
    (root / "dog" / ".DS_Store").write_bytes(b"x")
    return root


@pytest.fixture(scope="module")
def prepared(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    result = run_prepare("--input", str(tree), "--output", str(out), "--image_size", f"{HEIGHT}x{WIDTH}",
                         "--validation_percent", "30", "--max_pixels", "100000", "--overwrite")
    assert result.returncode == 0, result.stderr
    return out, result


@pytest.fixture(scope="module")
def manifest(prepared):
    return json.loads((prepared[0] / "manifest.json").read_text())


def all_records(out, manifest):
    return [r for split in manifest["splits"] for r in records_of(out, split)]


def good_files(tree):
    return sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*")
                  if p.suffix in (".jpg", ".png") and p.name not in ("broken.jpg", "truncated.jpg", "huge.png"))


def test_every_good_image_is_written_exactly_once(prepared, manifest, tree):
    out, _ = prepared
    names = sorted(r["image/filename"].decode() for r in all_records(out, manifest))
    assert names == good_files(tree)


def test_label_ids_match_the_folders(prepared, manifest):
    out, _ = prepared
    labels = manifest["labels"]
    assert labels == sorted(LABELS)
    for r in all_records(out, manifest):
        folder = r["image/filename"].decode().split("/")[0]
        assert labels[r["image/class/label"]] == folder == r["image/class/text"].decode()


def test_images_have_the_requested_size_and_channels(prepared, manifest):
    out, _ = prepared
    for r in all_records(out, manifest):
        img = np.asarray(Image.open(io.BytesIO(r["image/encoded"])))
        assert img.shape == (HEIGHT, WIDTH, 3)
        assert (r["image/height"], r["image/width"], r["image/channels"]) == (HEIGHT, WIDTH, 3)
        assert r["image/format"] == b"jpeg"


def test_pixels_match_the_source(prepared, manifest):
    out, _ = prepared
    (record,) = [r for r in all_records(out, manifest) if r["image/filename"] == b"cat/exact.png"]
    stored = np.asarray(Image.open(io.BytesIO(record["image/encoded"]))).astype(int)
    source = np.asarray(picture(99, WIDTH, HEIGHT)).astype(int)
    assert np.abs(stored - source).mean() < 3


def test_shards_are_gzip_files_named_by_split(prepared, manifest):
    out, _ = prepared
    for split, info in manifest["splits"].items():
        for name in info["shards"]:
            assert name.startswith(f"{split}-") and name.endswith(".tfrecord.gz")
            assert (out / name).read_bytes()[:2] == b"\x1f\x8b"
            gzip.decompress((out / name).read_bytes())


def test_manifest_counts_add_up(prepared, manifest, tree):
    out, _ = prepared
    counts = manifest["counts"]
    assert counts == {"listed": len(good_files(tree)) + 3, "written": len(good_files(tree)),
                      "failed": 3, "skipped": 2}
    assert counts["listed"] == counts["written"] + counts["failed"]
    for split, info in manifest["splits"].items():
        records = records_of(out, split)
        assert info["num_examples"] == len(records) == sum(info["class_counts"].values())
        assert info["shard_num_examples"] == [
            sum(r["shard"] == name for r in records) for name in info["shards"]]
        per_label = collections.Counter(r["image/class/text"].decode() for r in records)
        assert info["class_counts"] == {label: per_label[label] for label in manifest["labels"]}
    assert manifest["image"] == {"height": HEIGHT, "width": WIDTH, "channels": 3,
                                 "format": "jpeg", "resize_mode": "center_crop"}
    assert manifest["beam_prep_version"] and manifest["options"]["validation_percent"] == 30


def test_labels_txt_lists_the_ids(prepared, manifest):
    out, _ = prepared
    assert (out / "labels.txt").read_text(encoding="utf-8").splitlines() == manifest["labels"]


def test_errors_report_names_each_bad_file_and_why(prepared, tree):
    out, _ = prepared
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    by_file = {e["relpath"]: e for e in errors}
    assert set(by_file) == {"cat/broken.jpg", "dog/truncated.jpg", "émeu/huge.png"}
    assert by_file["cat/broken.jpg"]["stage"] == "decode"
    assert by_file["dog/truncated.jpg"]["stage"] == "decode"
    assert by_file["émeu/huge.png"]["stage"] == "too_large"
    assert "400x300" in by_file["émeu/huge.png"]["message"]
    for e in errors:
        assert e["path"] == str(tree / e["relpath"]) and e["error_type"] and e["message"]


def test_summary_reports_splits_and_failures(prepared):
    _, result = prepared
    assert "images written" in result.stdout and "images/s" in result.stdout
    assert "train:" in result.stdout and "validation:" in result.stdout
    assert "failed at decode: 2" in result.stdout


def test_validation_split_follows_the_stable_hash(prepared, manifest):
    from beam_prep.write.plan.listing import split_for

    out, _ = prepared
    for split in manifest["splits"]:
        for r in records_of(out, split):
            assert split_for(r["image/filename"].decode(), 30) == split


def test_classes_are_mixed_within_shards(prepared, manifest):
    out, _ = prepared
    records = records_of(out, "train")
    by_shard = collections.defaultdict(set)
    for r in records:
        by_shard[r["shard"]].add(r["image/class/label"])
    assert all(len(labels) > 1 for labels in by_shard.values())
    # Dealing files in path order would pass the check above too (round robin
    # spreads classes over shards), but write each shard's classes in runs.
    in_shard = collections.defaultdict(list)
    for r in records:
        in_shard[r["shard"]].append(r["image/class/label"])
    runs = {shard: 1 + sum(a != b for a, b in itertools.pairwise(labels)) for shard, labels in in_shard.items()}
    assert any(runs[shard] > len(set(labels)) for shard, labels in in_shard.items()), in_shard


def test_reruns_give_the_same_layout(prepared, manifest, tree, tmp_path):
    out, _ = prepared
    result = run_prepare("--input", str(tree), "--output", str(tmp_path), "--image_size", f"{HEIGHT}x{WIDTH}",
                         "--validation_percent", "30", "--max_pixels", "100000")
    assert result.returncode == 0, result.stderr
    for info in manifest["splits"].values():
        for name in info["shards"]:
            # Byte for byte: the GZIP header holds no time or file name (the other run wrote elsewhere).
            assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == \
                hashlib.sha256((out / name).read_bytes()).hexdigest(), name
    for name in ("labels.txt", "errors.jsonl", "skipped.jsonl"):
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes()


def test_overwrite_replaces_the_old_dataset(tree, tmp_path):
    args = ["--input", str(tree), "--output", str(tmp_path), "--image_size", "8", "--max_pixels", "100000"]
    prepare_here(*args, "--num_shards", "3")
    prepare_here(*args, "--num_shards", "1", "--overwrite")
    shards = sorted(p.name for p in tmp_path.glob("*.tfrecord.gz"))
    assert shards == ["train-00000-of-00001.tfrecord.gz"]


def test_split_tree_gray_png_output(tmp_path):
    tree = tmp_path / "tree"
    make_tree(tree, {"a": 4, "b": 3}, splits=["train", "test"], size=(WIDTH, HEIGHT), fmt="PNG", ext=".png")
    out = tmp_path / "out"
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", f"{HEIGHT}x{WIDTH}",
                 "--channels", "1", "--image_format", "png")
    manifest = json.loads((out / "manifest.json").read_text())
    assert list(manifest["splits"]) == ["train", "test"]
    for split in ("train", "test"):
        records = records_of(out, split)
        assert len(records) == 7
        for r in records:
            stored = np.asarray(Image.open(io.BytesIO(r["image/encoded"])))
            source = np.asarray(Image.open(tree / r["image/filename"].decode()).convert("L"))
            np.testing.assert_array_equal(stored, source)
            assert r["image/channels"] == 1


def test_unlisted_label_folders_are_reported_not_dropped(tmp_path):
    tree = tmp_path / "tree"
    make_tree(tree, {"a": 2, "b": 2, "c": 1})
    labels_file = tmp_path / "labels.txt"
    labels_file.write_text("b\na\n")
    out = tmp_path / "out"
    prepare_here("--input", str(tree), "--output", str(out), "--labels_file", str(labels_file), "--image_size", "8")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["labels"] == ["b", "a"]
    assert manifest["counts"] == {"listed": 5, "written": 4, "failed": 1, "skipped": 0}
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert [(e["relpath"], e["stage"]) for e in errors] == [("c/img_000.jpg", "label")]
    assert {(r["image/class/text"], r["image/class/label"]) for r in records_of(out, "train")} == {
        (b"b", 0), (b"a", 1)}


def test_shuffle_sink_writes_the_same_records(prepared, manifest, tree, tmp_path):
    out, _ = prepared
    prepare_here("--input", str(tree), "--output", str(tmp_path), "--image_size", f"{HEIGHT}x{WIDTH}",
                 "--validation_percent", "30", "--max_pixels", "100000", "--sink", "shuffle")
    shuffled = json.loads((tmp_path / "manifest.json").read_text())
    assert shuffled["sink"] == "shuffle" and shuffled["counts"] == manifest["counts"]
    for split, info in shuffled["splits"].items():  # WriteToTFRecord's shards, counted afterwards
        assert info["shard_num_examples"] == [
            sum(1 for _ in tf.data.TFRecordDataset(str(tmp_path / name), "GZIP")) for name in info["shards"]]
        assert sum(info["shard_num_examples"]) == info["num_examples"] > 0
    assert (tmp_path / "errors.jsonl").read_text() == (out / "errors.jsonl").read_text()
    # The shuffle sink's manifest step runs in the job; it publishes the launcher's skipped.jsonl alike.
    assert (tmp_path / "skipped.jsonl").read_bytes() == (out / "skipped.jsonl").read_bytes()
    assert [json.loads(line)["relpath"] for line in (out / "skipped.jsonl").read_text().splitlines()] == [
        "cat/notes.txt", "dog/.DS_Store"]
    for split in manifest["splits"]:
        def payload(root, split=split):
            return sorted((r["image/filename"], r["image/encoded"]) for r in records_of(root, split))
        assert payload(tmp_path) == payload(out)
    leftovers = [p.name for p in tmp_path.iterdir()
                 if p.is_dir() or not (p.name.endswith(".tfrecord.gz") or "." in p.name)]
    assert leftovers == []
    # Each sink's manifest holds each shard's sha256 and size, taken as it was written.
    assert_shard_checksums(out)
    assert_shard_checksums(tmp_path)


def test_records_parse_without_tensorflow(prepared, manifest):
    """The writer's own schema decodes what TensorFlow decodes: one spec, no drift."""
    from apache_beam.io.tfrecordio import _TFRecordUtil

    out, _ = prepared
    name = manifest["splits"]["train"]["shards"][0]
    data = io.BytesIO(gzip.decompress((out / name).read_bytes()))
    first_tf = records_of(out, "train")[0]
    first = decode_example(_TFRecordUtil.read_record(data))
    assert {k: v for k, v in first.items()} == {k: first_tf[k] for k in first}


def test_uncompressed_raw_output_stores_exact_pixels(tmp_path):
    tree = tmp_path / "tree"
    make_tree(tree, {"a": 3, "b": 2}, size=(WIDTH, HEIGHT), fmt="PNG", ext=".png")
    out = tmp_path / "out"
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", f"{HEIGHT}x{WIDTH}",
                 "--image_format", "raw", "--compression", "none")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["compression"] == "NONE"
    names = manifest["splits"]["train"]["shards"]
    assert all(n.endswith(".tfrecord") for n in names)
    assert (out / names[0]).read_bytes()[:2] != b"\x1f\x8b"
    import tensorflow as tf

    for name in names:
        for serialized in tf.data.TFRecordDataset(str(out / name)):
            r = decode_example(serialized.numpy())
            pixels = np.frombuffer(r["image/encoded"], np.uint8).reshape(HEIGHT, WIDTH, 3)
            source = np.asarray(Image.open(tree / r["image/filename"].decode()).convert("RGB"))
            np.testing.assert_array_equal(pixels, source)


@pytest.mark.parametrize("sink", ["streaming", "shuffle"])
def test_transparency_takes_the_background_and_flat_records_are_counted(tmp_path, sink):
    tree, out = tmp_path / "tree", tmp_path / "out"
    make_tree(tree, {"photos": 4})
    (tree / "blank").mkdir()
    for i in range(3):  # wholly transparent: nothing but the background shows
        Image.new("RGBA", (40, 30), (255, 0, 0, 0)).save(tree / "blank" / f"clear{i}.png")
    result = run_prepare("--input", str(tree), "--output", str(out), "--sink", sink, "--background", "rgb(32,64,96)")
    assert result.returncode == 0, result.stderr
    records = {r["image/filename"].decode(): r for r in read_split(out, "train")}
    for i in range(3):
        pixels = np.asarray(Image.open(io.BytesIO(records[f"blank/clear{i}.png"]["image/encoded"])), int)
        assert np.abs(pixels - (32, 64, 96)).max() <= 2  # the background, through JPEG
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["background"] == "#204060"
    assert manifest["flat_images"] == {"count": 3, "examples": [f"blank/clear{i}.png" for i in range(3)],
                                       "transparent": 3}
    rows = [json.loads(line) for line in (out / "flat.jsonl").read_text().splitlines()]
    assert [(r["relpath"], r["label"], r["transparent"]) for r in rows] == [
        (f"blank/clear{i}.png", "blank", True) for i in range(3)]
    assert all(abs(int(r["colour"][1:3], 16) - 32) <= 2 and r["path"].endswith(r["relpath"]) for r in rows)
    assert ("one flat colour: 3 (written all the same; e.g. blank/clear0.png, blank/clear1.png, blank/clear2.png; "
            "every one in flat.jsonl)") in result.stdout
    assert "warning: 3 of 7 records show one flat colour (each named in flat.jsonl)" in result.stderr  # many: over 1%
    assert "--background '#808080'" in result.stderr
    assert (result.stdout + result.stderr).count("blank/clear1.png") == 1  # the paths said once, not three times


def _icon(colour: tuple[int, int, int]) -> Image.Image:
    """A transparent image whose shape is all in one colour, its shape in its alpha alone: an icon, a logo."""
    alpha = Image.new("L", (48, 48), 0)
    alpha.paste(255, (8, 8, 40, 40))
    icon = Image.new("RGBA", (48, 48), (*colour, 255))
    icon.putalpha(alpha)
    return icon


def test_flat_transparent_images_are_listed_and_a_mid_grey_background_shows_them(tmp_path):
    """Black shapes vanish on black, white ones on white: each background leaves one kind flat, and
    flat.jsonl names each with its colour; the mid grey the advice names shows both."""
    tree = tmp_path / "tree"
    make_tree(tree, {"photos": 4})
    (tree / "icons").mkdir()
    for i in range(3):
        _icon((0, 0, 0)).save(tree / "icons" / f"black{i}.png")
        _icon((255, 255, 255)).save(tree / "icons" / f"white{i}.png")
    flat_by_background = {}
    for background in ("white", "black", "#808080"):
        out = tmp_path / f"out-{background.lstrip('#')}"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            written = prepare_here("--input", str(tree), "--output", str(out), "--background", background)
        rows = [json.loads(line) for line in (out / "flat.jsonl").read_text().splitlines()]
        flat_by_background[background] = [(r["relpath"], r["colour"], r["transparent"]) for r in rows]
        assert written["flat_images"]["count"] == written["flat_images"]["transparent"] == len(rows)
        said = [str(w.message) for w in caught if "flat colour" in str(w.message)]
        assert len(said) == (1 if rows else 0), said
        assert all("3 of 10 records show one flat colour" in s and "background '#808080'" in s for s in said), said
    assert flat_by_background == {
        "white": [(f"icons/white{i}.png", "#ffffff", True) for i in range(3)],
        "black": [(f"icons/black{i}.png", "#000000", True) for i in range(3)],
        "#808080": [],
    }


@pytest.mark.parametrize("sink", ["streaming", "shuffle"])
def test_a_flat_record_named_with_bytes_no_utf8_spells_is_counted_as_messages_name_it(tmp_path, sink):
    """Its name goes into the shard's record and the manifest as ``\\xff``, not a surrogate that fails the run."""
    tree, out = tmp_path / "tree", tmp_path / "out"
    make_tree(tree, {"photos": 2})
    (tree / "blank").mkdir()
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), (255, 0, 0)).save(buffer, "PNG")
    with open(os.fsencode(str(tree / "blank")) + b"/red\xff.png", "wb") as f:
        f.write(buffer.getvalue())
    manifest = prepare_here("--input", str(tree), "--output", str(out), "--sink", sink)
    assert manifest["flat_images"]["count"] == 1 and manifest["flat_images"]["examples"] == ["blank/red\\xff.png"]
    (row,) = [json.loads(line) for line in (out / "flat.jsonl").read_text().splitlines()]
    assert row["relpath"] == "blank/red\\xff.png" and row["colour"] == "#ff0000", row
    assert manifest["counts"]["written"] == 3


def test_a_bad_background_is_refused_before_any_work(tmp_path):
    tree, out = tmp_path / "tree", tmp_path / "out"
    make_tree(tree, {"a": 2})
    bad = run_prepare("--input", str(tree), "--output", str(out), "--background", "transparent-ish")
    assert bad.returncode == 2 and "--background 'transparent-ish' is not a colour" in bad.stderr
    assert not out.exists()
