"""--cross_split_duplicates drop: the files of each group of copies or near copies across splits
outside its kept split are left out of the shards (every format, both sinks, a resumed run), named
in skipped.jsonl, and the counts, class counts and shard checksums describe the shards published.

One tree of real photographs (Pillow's test images), its splits fixed by a table: exact copies
and a half-size JPEG quality-50 copy in validation of training photos, a copy in train,
validation and test, and one in validation and test only.
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
import tarfile

import pytest
from helpers import assert_shard_checksums, read_split, run_prepare
from PIL import Image

from beam_prep.errors import StorageError
from beam_prep.model import features
from beam_prep.tools import verification
from beam_prep.tools.format_records import examples
from beam_prep.write.shared import layout
from pipelines import prepare_images

SIZE = "32"
# file name -> (split, label, where it comes from: a corpus photo, or "=name" an exact copy of the
# tree's file, or "~name" a half-size copy at JPEG quality 50)
TREE = {
    "a/hopper.jpg": ("train", "a", "hopper.jpg"),
    "a/flower.jpg": ("train", "a", "flower.jpg"),
    "a/flower2.jpg": ("train", "a", "flower2.jpg"),
    "b/iptc.jpg": ("train", "b", "iptc.jpg"),
    "b/exif.jpg": ("train", "b", "exif-72dpi-int.jpg"),
    "a/icc.jpg": ("validation", "a", "icc_profile_big.jpg"),
    "a/junk.jpg": ("validation", "a", "junk_jpeg_header.jpg"),
    "b/hopper_half.jpg": ("validation", "b", "~a/hopper.jpg"),
    "b/flower_copy.jpg": ("validation", "b", "=a/flower.jpg"),
    "a/iptc_copy.jpg": ("validation", "a", "=b/iptc.jpg"),
    "b/photoshop.jpg": ("test", "b", "photoshop-200dpi.jpg"),
    "b/iptc_copy.jpg": ("test", "b", "=b/iptc.jpg"),
    "b/junk_copy.jpg": ("test", "b", "=a/junk.jpg"),
}
# relpath -> (reason, the kept file it copies)
DROPPED = {
    "b/hopper_half.jpg": ("near copy of an image in train", "a/hopper.jpg"),
    "b/flower_copy.jpg": ("copy of an image in train", "a/flower.jpg"),
    "a/iptc_copy.jpg": ("copy of an image in train", "b/iptc.jpg"),
    "b/iptc_copy.jpg": ("copy of an image in train", "b/iptc.jpg"),
    "b/junk_copy.jpg": ("copy of an image in validation", "a/junk.jpg"),
}
KEPT = {split: sorted(name for name, (s, _, _) in TREE.items() if s == split and name not in DROPPED)
        for split in ("train", "validation", "test")}


@pytest.fixture(scope="module")
def tree(pillow_images, tmp_path_factory) -> tuple[pathlib.Path, list[str]]:
    """The tree, its table, a file no row names; and the arguments every run here shares."""
    root = tmp_path_factory.mktemp("drop") / "tree"
    for name, (_, _, source) in TREE.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.startswith("="):
            shutil.copyfile(root / source[1:], target)
        elif source.startswith("~"):
            with Image.open(root / source[1:]) as photo:
                photo.resize((photo.width // 2, photo.height // 2)).save(target, quality=50)
        else:
            shutil.copyfile(pillow_images.path(source), target)
    (root / "b" / "unnamed.jpg").write_bytes((root / "a" / "icc.jpg").read_bytes())  # no row: skipped
    table = root.parent / "table.csv"
    table.write_text("file_name,label,split\n" + "".join(f"{name},{label},{split}\n"
                                                         for name, (split, label, _) in TREE.items()))
    return root, ["--input", str(root), "--metadata", str(table), "--image_size", SIZE,
                  "--cross_split_duplicates", "drop"]


@pytest.fixture(scope="module")
def streaming(tree, tmp_path_factory):
    """An uninterrupted run of the streaming sink, TFRecord: the one the others are compared with."""
    _, args = tree
    out = tmp_path_factory.mktemp("streaming") / "out"
    result = run_prepare(*args, "--output", str(out), "--sink", "streaming")
    assert result.returncode == 0, result.stderr
    return out, result


def _lines(out: pathlib.Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (out / name).read_text().splitlines()]


def _manifest(out: pathlib.Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _check_published(out: pathlib.Path, root: pathlib.Path, names: dict[str, list[str]]) -> None:
    """The dataset as the reader and verify see it: the files kept (``names``: each split's, as read
    back by a reader of the format), the counts adding up, the shards' sha256 and sizes the files'."""
    manifest = _manifest(out)
    assert {split: sorted(found) for split, found in names.items()} == KEPT
    assert manifest["counts"] == {"listed": 13, "written": 8, "failed": 0, "skipped": 1, "dropped": 5}
    for split, info in manifest["splits"].items():
        assert info["num_examples"] == sum(info["shard_num_examples"]) == len(names[split])
        assert info["class_counts"] == {label: sum(TREE[name][1] == label for name in names[split])
                                        for label in ("a", "b")}
    assert_shard_checksums(out)
    assert not verification.verify(str(out), workers=2).problems
    rows = _lines(out, "skipped.jsonl")
    assert [r["relpath"] for r in rows] == sorted([*DROPPED, "b/unnamed.jpg"])
    for row in rows:
        if row["relpath"] in DROPPED:
            reason, original = DROPPED[row["relpath"]]
            assert (row["path"], row["reason"], row["duplicate_of"]) == (
                str(root / row["relpath"]), reason, str(root / original))
            assert ("distance" in row) == reason.startswith("near")
    assert manifest["duplicates"]["dropped"] == 5
    assert manifest["duplicates"]["dropped_by_reason"] == {
        "copy of an image in train": 3, "copy of an image in validation": 1, "near copy of an image in train": 1}


def test_drop_leaves_the_copies_across_splits_out_and_names_them(tree, streaming):
    root, _ = tree
    out, result = streaming
    # Read back by plain tf.data (TFRecordDataset) and by our tf.data reader.
    import beam_prep

    names = {split: [r["image/filename"].decode() for r in read_split(out, split)] for split in KEPT}
    _check_published(out, root, names)
    for split, kept in KEPT.items():
        read = beam_prep.make_dataset(str(out), split, batch_size=None, extra_keys=[features.FILENAME])
        assert sorted(extras[features.FILENAME].numpy().decode() for _, _, extras in read) == kept
    # The near copy's distance is its hash's from the photo it copies, as duplicates.jsonl has them.
    near = {r["path"]: int(r["phash"], 16) for r in _lines(out, "duplicates.jsonl") if r["kind"] == "near"}
    row = next(r for r in _lines(out, "skipped.jsonl") if r["relpath"] == "b/hopper_half.jpg")
    assert row["distance"] == (near[row["path"]] ^ near[row["duplicate_of"]]).bit_count() <= 10
    assert result.stdout.splitlines()[0].endswith("; 0 failed, 5 dropped, 1 skipped")
    assert result.stdout.splitlines()[-7:] == [
        "  skipped, image no --metadata row names: 1 (see skipped.jsonl)",
        "  duplicates: 4 extra copies of 3 images, 4 across splits (those across splits dropped; "
        "see duplicates.jsonl)",
        "  near duplicates: 1 group of 2 files within 6 bits, 1 across splits (see duplicates.jsonl)",
        "  cross-split leakage dropped: 5 files, copies or near copies of a file in another split, left out "
        "(see skipped.jsonl)",
        "  dropped, copy of an image in train: 3 (see skipped.jsonl)",
        "  dropped, copy of an image in validation: 1 (see skipped.jsonl)",
        "  dropped, near copy of an image in train: 1 (see skipped.jsonl)"]


def test_inspect_says_what_was_dropped(streaming, capsys):
    from pipelines import inspect_output

    out, _ = streaming
    assert inspect_output.main([str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("files: 13 listed, 8 written, 0 failed, 5 dropped, 1 skipped")
    assert lines[at + 1:at + 6] == [
        "  skipped, image no --metadata row names: 1, e.g. b/unnamed.jpg",
        "  dropped, copy of an image in train: 3, e.g. a/iptc_copy.jpg, b/flower_copy.jpg, b/iptc_copy.jpg",
        "  dropped, copy of an image in validation: 1, e.g. b/junk_copy.jpg",
        "  dropped, near copy of an image in train: 1, e.g. b/hopper_half.jpg",
        f"  every skipped file, with its reason: {out}/skipped.jsonl"]
    assert "dropped (--cross_split_duplicates drop): 5 files of the groups across splits left out of the " \
           "dataset, each named in skipped.jsonl" in lines


def test_the_shuffle_sink_drops_the_same_files_from_webdataset_shards(tree, streaming, tmp_path):
    root, args = tree
    out = tmp_path / "out"
    result = run_prepare(*args, "--output", str(out), "--sink", "shuffle", "--file_format", "webdataset")
    assert result.returncode == 0, result.stderr
    reference, _ = streaming
    assert (out / "skipped.jsonl").read_bytes() == (reference / "skipped.jsonl").read_bytes()
    assert sorted(_lines(out, "duplicates.jsonl"), key=json.dumps) == \
        sorted(_lines(reference, "duplicates.jsonl"), key=json.dumps)
    manifest = _manifest(out)
    # Read back by tarfile, and by the reader verify uses.
    names, ours = {}, {}
    for split, info in manifest["splits"].items():
        names[split], ours[split] = [], []
        for shard in info["shards"]:
            with tarfile.open(out / shard) as tar:
                names[split] += [json.loads(tar.extractfile(m).read())["filename"]
                                 for m in tar.getmembers() if m.name.endswith(".json")]
            ours[split] += [features.decode_example(e)[features.FILENAME].decode()
                            for e in examples("webdataset", str(out / shard))]
    assert ours == names
    _check_published(out, root, names)


def test_a_run_stopped_once_its_shards_are_rewritten_resumes_to_the_same_dataset(tree, streaming, tmp_path,
                                                                                monkeypatch, capsys):
    """Stopped between rewriting its shards and publishing them, an ArrayRecord run writes the
    rewritten shards again when resumed (they no longer match their records), and drops again."""
    from array_record.python.array_record_module import ArrayRecordReader

    root, args = tree
    out = tmp_path / "out"
    argv = [*args, "--output", str(out), "--file_format", "array_record"]
    real = layout.publish

    def stopped(*_):
        raise StorageError("stopped before publishing")

    monkeypatch.setattr(layout, "publish", stopped)
    assert prepare_images.main(argv) == 1
    assert "stopped before publishing" in capsys.readouterr().err
    work = next((out / layout.WORK_DIR).iterdir())
    records = {p.name[:-len(".done.json")]: json.loads(p.read_text()) for p in work.glob("*.done.json")}
    rewritten = sorted(name for name, record in records.items()
                       if hashlib.sha256((work / name).read_bytes()).hexdigest() != record["sha256"])
    assert {name.split("-")[0] for name in rewritten} == {"test", "validation"}  # train holds no copy to drop
    assert not (out / "manifest.json").exists()
    monkeypatch.setattr(layout, "publish", real)
    assert prepare_images.main(argv) == 0
    reference, _ = streaming
    assert (out / "skipped.jsonl").read_bytes() == (reference / "skipped.jsonl").read_bytes()
    # Read back by array_record's own reader, and by ours.
    import beam_prep

    names = {}
    for split, info in _manifest(out)["splits"].items():
        names[split] = []
        for shard in info["shards"]:
            reader = ArrayRecordReader(str(out / shard))
            names[split] += [features.decode_example(r)[features.FILENAME].decode()
                             for r in reader.read(list(range(reader.num_records())))]
            reader.close()
        assert sorted(name for name, _ in beam_prep.data_source(str(out), split).samples) == sorted(names[split])
    _check_published(out, root, names)
