"""--cross_split_duplicates drop: the files of each group of copies or near copies across splits
that copy a file kept in an earlier split are left out of the shards (every format, both sinks, a
resumed run), named in skipped.jsonl, and the counts, class counts and shard checksums describe
the shards published; a chain of near copies loses only the files near a file kept, split folders
named val and test keep val's copy, the leakage is counted for every pair of splits, and a
rewrite that fails leaves no shard of its own behind.

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
from helpers import assert_shard_checksums, prepare_here, read_split, run_prepare
from PIL import Image

from beam_prep.errors import DatasetError, StorageError
from beam_prep.io.tfrecord import read_records
from beam_prep.model import features
from beam_prep.tools import verification
from beam_prep.tools.format_records import examples
from beam_prep.write.finish import drop, duplicates
from beam_prep.write.images.imaging import ImageSpec, process_image
from beam_prep.write.images.phash import distance
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
    assert result.stdout.splitlines()[-8:] == [
        "  skipped, image no --metadata row names: 1 (see skipped.jsonl)",
        "  duplicates: 4 extra copies of 3 images, 4 across splits (those across splits dropped; "
        "see duplicates.jsonl)",
        # flower, iptc and junk each have a copy in the other label's folder; so has hopper, near.
        "  same image under different labels: 3 images (7 files) (see the warning; \"labels_differ\": true in "
        "duplicates.jsonl)",
        "  near duplicates: 1 group of 2 files within 6 bits, 1 across splits, 1 under different labels "
        "(see duplicates.jsonl)",
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
    """Stopped between rewriting its shards and publishing them, an ArrayRecord run leaves the shards
    its workers wrote as they were (the rewritten ones are published from staged names), so the
    run again keeps every one without converting an image, and drops again."""
    from array_record.python.array_record_module import ArrayRecordReader

    from beam_prep.write.finish import publication

    root, args = tree
    out = tmp_path / "out"
    argv = [*args, "--output", str(out), "--file_format", "array_record"]
    real = publication.write_record

    def stopped(*_):
        raise StorageError("stopped before publishing")

    monkeypatch.setattr(publication, "write_record", stopped)
    assert prepare_images.main(argv) == 1
    assert "stopped before publishing" in capsys.readouterr().err
    work = next((out / layout.WORK_DIR).iterdir())
    records = {p.name[:-len(".done.json")]: json.loads(p.read_text()) for p in work.glob("*.done.json")}
    assert records and all(hashlib.sha256((work / name).read_bytes()).hexdigest() == record["sha256"]
                           for name, record in records.items())
    assert not list(work.glob("*.without-dropped*"))  # the failed run's rewritten shards removed
    assert sorted(p.name for p in out.iterdir()) == [layout.WORK_DIR]
    monkeypatch.setattr(publication, "write_record", real)
    assert prepare_images.main(argv) == 0
    assert "(0 images/s)" in capsys.readouterr().out  # every shard kept: no image converted again
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


# --- split folders: a chain of near copies, val and test, every pair of splits ---------------


def _cropped(photo: pathlib.Path, percent: int) -> Image.Image:
    """The photo without ``percent`` of its width on the left: a near copy, further the more cut."""
    with Image.open(photo) as image:
        image = image.convert("RGB")
        return image.crop((image.width * percent // 100, 0, image.width, image.height))


def _make(root: pathlib.Path, files: dict[str, Image.Image | pathlib.Path | str]) -> pathlib.Path:
    """A tree of split folders: each file a picture saved as PNG, a photo copied, or ("=name") an
    exact copy of the tree's file ``name``."""
    for name, source in files.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(source, Image.Image):
            source.save(target, "PNG")
        elif isinstance(source, str):
            shutil.copyfile(root / source[1:], target)
        else:
            shutil.copyfile(source, target)
    return root


def _hash(path: pathlib.Path) -> int:
    """The perceptual hash a run of ``--image_size 32`` gives the file: of the image as written."""
    return process_image(path.read_bytes(), ImageSpec(height=int(SIZE), width=int(SIZE))).phash


def _written(out: pathlib.Path) -> dict[str, list[str]]:
    """Each split's file names, as its TFRecord shards hold them (read without TensorFlow), without
    the split folder."""
    manifest = _manifest(out)
    return {split: sorted(features.decode_example(record)[features.FILENAME].decode().split("/", 1)[1]
                          for shard in info["shards"]
                          for record in read_records(str(out / shard), manifest["compression"].lower()))
            for split, info in manifest["splits"].items()}


def _skipped(out: pathlib.Path) -> dict[str, dict]:
    return {row["relpath"]: row for row in _lines(out, "skipped.jsonl")}


def test_a_chain_of_near_copies_loses_only_the_file_near_the_kept_one(pillow_images, tmp_path):
    """A photo in train (A), a copy cut by 5% in validation (B), by 7% in test (C): A-B and B-C are
    within the threshold, A-C is not, so the three are one group. B is left out, as a near copy
    of A; C is kept: it copies nothing kept (B is gone)."""
    flower = pillow_images.path("flower.jpg")
    root = _make(tmp_path / "tree", {
        "train/a/flower.png": _cropped(flower, 0), "validation/a/flower_cut5.png": _cropped(flower, 5),
        "test/a/flower_cut7.png": _cropped(flower, 7), "train/b/hopper.jpg": pillow_images.path("hopper.jpg"),
        "validation/b/photoshop.jpg": pillow_images.path("photoshop-200dpi.jpg"),
        "test/b/iptc.jpg": pillow_images.path("iptc.jpg")})
    a, b, c = (_hash(root / name) for name in
               ("train/a/flower.png", "validation/a/flower_cut5.png", "test/a/flower_cut7.png"))
    threshold = 6
    assert distance(a, b) <= threshold and distance(b, c) <= threshold < distance(a, c), \
        (distance(a, b), distance(b, c), distance(a, c))
    out = tmp_path / "out"
    prepare_here("--input", str(root), "--output", str(out), "--image_size", SIZE, "--sink", "streaming",
                 "--near_duplicate_distance", str(threshold), "--cross_split_duplicates", "drop")
    near = [r for r in _lines(out, "duplicates.jsonl") if r["kind"] == "near"]
    assert sorted(r["path"] for r in near) == sorted(str(root / name) for name in (
        "train/a/flower.png", "validation/a/flower_cut5.png", "test/a/flower_cut7.png"))  # one group
    assert {r["group"] for r in near} == {1}
    assert _written(out) == {"train": ["a/flower.png", "b/hopper.jpg"], "validation": ["b/photoshop.jpg"],
                             "test": ["a/flower_cut7.png", "b/iptc.jpg"]}
    row = _skipped(out)["validation/a/flower_cut5.png"]
    assert (row["reason"], row["duplicate_of"], row["distance"]) == (
        "near copy of an image in train", str(root / "train/a/flower.png"), distance(a, b))
    assert _manifest(out)["counts"]["dropped"] == 1


def _leaking_tree(pillow_images, root: pathlib.Path, held_out: str) -> pathlib.Path:
    """Train, ``held_out`` (val or validation) and test, with a copy across each pair of splits:
    a train photo copied in ``held_out``, one copied in test, a ``held_out`` photo copied in test,
    and a near copy in test (cut by 2%) of another ``held_out`` photo."""
    photoshop = pillow_images.path("photoshop-200dpi.jpg")
    return _make(root, {
        "train/a/hopper.jpg": pillow_images.path("hopper.jpg"), "train/b/iptc.jpg": pillow_images.path("iptc.jpg"),
        f"{held_out}/a/flower.png": _cropped(pillow_images.path("flower.jpg"), 0),
        f"{held_out}/b/hopper_copy.jpg": "=train/a/hopper.jpg",
        f"{held_out}/b/photoshop.png": _cropped(photoshop, 0),
        "test/a/flower.png": f"={held_out}/a/flower.png", "test/b/photoshop_cut.png": _cropped(photoshop, 2),
        "test/b/iptc_copy.jpg": "=train/b/iptc.jpg", "test/a/exif.jpg": pillow_images.path("exif-72dpi-int.jpg")})


@pytest.mark.parametrize("held_out", ["val", "validation"])
def test_each_split_loses_its_copies_to_the_split_before_it_and_each_pair_of_splits_is_counted(
        pillow_images, tmp_path, held_out):
    """Train keeps its files, val (or validation) loses its copy of train's, test loses its copies
    of both: with split folders named val and test, val's copies stay and test's go. The leakage
    is counted for every pair of splits, val and test included."""
    root = _leaking_tree(pillow_images, tmp_path / "tree", held_out)
    out = tmp_path / "out"
    prepare_here("--input", str(root), "--output", str(out), "--image_size", SIZE, "--sink", "streaming",
                 "--cross_split_duplicates", "drop")
    assert _written(out) == {"train": ["a/hopper.jpg", "b/iptc.jpg"],
                             held_out: ["a/flower.png", "b/photoshop.png"], "test": ["a/exif.jpg"]}
    skipped = _skipped(out)
    assert {name: (row["reason"], row["duplicate_of"]) for name, row in skipped.items()} == {
        f"{held_out}/b/hopper_copy.jpg": ("copy of an image in train", str(root / "train/a/hopper.jpg")),
        "test/a/flower.png": (f"copy of an image in {held_out}", str(root / held_out / "a/flower.png")),
        "test/b/iptc_copy.jpg": ("copy of an image in train", str(root / "train/b/iptc.jpg")),
        "test/b/photoshop_cut.png": (f"near copy of an image in {held_out}", str(root / held_out / "b/photoshop.png"))}
    assert skipped["test/b/photoshop_cut.png"]["distance"] == distance(
        _hash(root / held_out / "b/photoshop.png"), _hash(root / "test/b/photoshop_cut.png"))
    manifest = _manifest(out)
    found = manifest["duplicates"]
    assert found["split_pairs"] == {f"train/{held_out}": 1, "train/test": 1, f"{held_out}/test": 1}
    assert found["near"]["split_pairs"] == {f"{held_out}/test": 1}
    assert duplicates.split_pairs(manifest) == {f"train/{held_out}": 1, "train/test": 1, f"{held_out}/test": 2}
    assert duplicates.leakage(manifest) == 4
    assert found["dropped_by_reason"] == {"copy of an image in train": 2, f"copy of an image in {held_out}": 1,
                                          f"near copy of an image in {held_out}": 1}


def test_a_rewrite_that_fails_leaves_none_of_its_shards_behind(pillow_images, tmp_path, monkeypatch):
    """The last shard to rewrite is damaged (its last record's CRC) once the shards are written:
    the rewrite reads it after writing the shard before it again, fails on it, and removes both
    its staged shards; the run fails with the damaged record named."""
    root = _leaking_tree(pillow_images, tmp_path / "tree", "validation")
    real = drop.rewrite
    damaged = []

    def rewrite_a_damaged_shard(work, file_format, compression, multi_label, shards, *rest):
        dropping = rest[-1]
        to_rewrite = [row[1] for row in shards if row[0] in dropping.keys]
        assert len(to_rewrite) >= 2  # one is written again before the damaged one is read
        shard = pathlib.Path(work) / to_rewrite[-1]
        data = bytearray(shard.read_bytes())
        data[-1] ^= 0xFF  # the last record's data CRC
        shard.write_bytes(bytes(data))
        damaged.append(shard.name)
        return real(work, file_format, compression, multi_label, shards, *rest)

    monkeypatch.setattr(drop, "rewrite", rewrite_a_damaged_shard)
    out = tmp_path / "out"
    with pytest.raises(DatasetError, match="damaged"):
        prepare_here("--input", str(root), "--output", str(out), "--image_size", SIZE, "--sink", "streaming",
                     "--compression", "none", "--cross_split_duplicates", "drop")
    assert damaged
    left = [p.relative_to(out) for p in out.rglob("*") if p.name.endswith(".without-dropped")]
    assert left == []
    assert not (out / "manifest.json").exists()
