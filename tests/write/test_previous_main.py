"""Datasets written by earlier beam-preps (``tests/data/previous-main*``) still read, verify and append.

Each folder was written by an earlier main from the same tree and command: ``make_tree(TREE, COUNTS,
size=SIZE)``, then ``prepare --input /previous-main/tree --output /previous-main/dataset --image_size 16
--validation_percent 30``. ``previous-main``: commit 04f8dea, before shard names became an allow-list,
manifests gained versions and publications a record (one shard a split). ``previous-main-234e638``:
commit 234e638, the main these appends were built on: versions and the sources' tallies, but no kept
hash files, kept stamps or dataset card (two shards a split). The tree is made again here, byte for
byte (``make_tree``'s images depend only on their position), so an append can run from it.
"""
from __future__ import annotations

import collections
import hashlib
import json
import pathlib
import shutil

import pytest
from helpers import REPO, make_tree, prepare_here, read_split

import beam_prep
from beam_prep.errors import DatasetError
from beam_prep.tools.verification import verify
from beam_prep.write.grow.append import COPY_REASON

pytestmark = pytest.mark.slow  # TensorFlow reads it, and the append runs a pipeline

# Each earlier main's dataset, by its commit.
PREVIOUS = {"04f8dea": REPO / "tests" / "data" / "previous-main",
            "234e638": REPO / "tests" / "data" / "previous-main-234e638"}
COUNTS, SIZE = {"circles": 5, "squares": 4, "stars": 3}, (24, 20)


@pytest.fixture(params=sorted(PREVIOUS))
def previous(request, tmp_path) -> pathlib.Path:
    """A copy of an earlier beam-prep's dataset, writable."""
    return pathlib.Path(shutil.copytree(PREVIOUS[request.param], tmp_path / "dataset"))


def sha256s(folder: pathlib.Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()}


def by_split(out: pathlib.Path) -> dict[str, collections.Counter]:
    """Each split's records as (source sha256, class name), the ids read through labels.txt."""
    labels = (out / "labels.txt").read_text().splitlines()
    return {split: collections.Counter((r["image/key/sha256"].decode(), labels[r["image/class/label"]])
                                       for r in read_split(out, split))
            for split in json.loads((out / "manifest.json").read_text())["splits"]}


def test_it_reads_and_verifies_as_version_1(previous):
    manifest = json.loads((previous / "manifest.json").read_text())
    assert "hash_files" not in manifest and "stamp_files" not in manifest  # made before them
    assert [v["version"] for v in manifest.get("versions", [{"version": 1}])] == [1]  # 04f8dea: none, so 1
    info = beam_prep.load_info(str(previous))
    assert info.labels == ("circles", "squares", "stars")
    assert {name: s.num_examples for name, s in info.splits.items()} == {"train": 9, "validation": 3}
    for version in (None, 1):
        ds = beam_prep.make_dataset(str(previous), "train", batch_size=None, training=False, version=version,
                                    extra_keys=["image/key/sha256"])
        assert collections.Counter((e["image/key/sha256"].numpy().decode(), info.labels[int(label)])
                                   for _, label, e in ds) == by_split(previous)["train"]
    with pytest.raises(DatasetError, match="no version 2"):
        beam_prep.make_dataset(str(previous), "train", batch_size=None, version=2)
    report = verify(str(previous))
    assert report.ok, report.problems


def test_it_appends_a_new_class_and_new_images_keeping_its_ids_and_shards(previous, tmp_path):
    tree = tmp_path / "tree"
    make_tree(tree, COUNTS, size=SIZE)  # the tree it was made from, byte for byte
    before_records, before_files = by_split(previous), sha256s(previous)
    make_tree(tmp_path / "more", {"aardvark": 2, "circles": 2}, size=(20, 24))
    for label in ("aardvark", "circles"):
        (tree / label).mkdir(exist_ok=True)
        for i, image in enumerate(sorted((tmp_path / "more" / label).iterdir())):
            shutil.copyfile(image, tree / label / f"new_{i}.jpg")
    manifest = prepare_here("--input", str(tree), "--output", str(previous), "--append")
    after = sha256s(previous)
    assert {name: after[name] for name in before_files if name.endswith(".tfrecord.gz")} == \
        {name: digest for name, digest in before_files.items() if name.endswith(".tfrecord.gz")}
    assert (previous / "labels.txt").read_text().splitlines() == ["circles", "squares", "stars", "aardvark"]
    assert [v["version"] for v in manifest["versions"]] == [1, 2]
    appended = manifest["versions"][-1]["appended"]
    # From another folder than the first run's: every old file is a copy of a record, none written again.
    assert (appended["copies"], appended["unchanged"], appended["new_labels"]) == (12, 0, ["aardvark"])
    assert sum(s["num_examples"] for s in manifest["versions"][-1]["splits"].values()) == 4
    now = by_split(previous)
    for split, records in before_records.items():  # the old records as they were, ids and all
        assert not records - now[split]
    version_1 = beam_prep.make_dataset(str(previous), "validation", batch_size=None, training=False, version=1,
                                       extra_keys=["image/key/sha256"])
    assert collections.Counter((e["image/key/sha256"].numpy().decode(), ("circles", "squares", "stars")[int(label)])
                               for _, label, e in version_1) == before_records["validation"]
    report = verify(str(previous))
    assert report.ok, report.problems


def test_write_image_dataset_appends_to_it_and_keeps_its_hash_lines(previous, tmp_path):
    """``WriteImageDataset(append=True)`` on a dataset that keeps no hash lines: it reads them from the
    shards once (no listing does it for the transform), finds a copy of an old record among its elements
    and leaves it out, as ``prepare --append`` does, and publishes version 1's kept file with version 2's."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_prep.write.run.pipeline import local_runner

    tree, batch = tmp_path / "tree", tmp_path / "batch"
    make_tree(tree, COUNTS, size=SIZE)  # the tree it was made from, byte for byte
    make_tree(batch, {"aardvark": 2, "circles": 2}, size=(20, 24))
    old = min((tree / "stars").iterdir())
    copy = batch / "circles" / "copy_of_a_star.jpg"
    shutil.copyfile(old, copy)
    before = sha256s(previous)
    elements = [(str(p), p.parent.name) for p in sorted(batch.rglob("*.jpg"))]
    options = PipelineOptions([], direct_running_mode="in_memory")
    with beam.Pipeline(runner=local_runner(options), options=options) as p:
        _ = p | beam.Create(elements) | beam_prep.WriteImageDataset(str(previous), ["aardvark", "circles"],
                                                                    root=str(batch), append=True)
    manifest = json.loads((previous / "manifest.json").read_text())
    assert [(v["version"], v["file"], v["records"]) for v in manifest["hash_files"]] == [
        (1, "hashes-v1.tsv.gz", 12), (2, "hashes-v2.tsv.gz", 4)]
    assert {name: sha256s(previous)[name] for name in before if name.endswith(".tfrecord.gz")} == \
        {name: d for name, d in before.items() if name.endswith(".tfrecord.gz")}
    skipped = [json.loads(line) for line in (previous / "skipped.jsonl").read_text().splitlines()]
    assert [(row["reason"], row["duplicate_of"]) for row in skipped if row["path"] == str(copy)] == [
        (COPY_REASON, f"/previous-main/tree/stars/{old.name}")]
    assert manifest["versions"][-1]["appended"]["copies"] == 1
    report = verify(str(previous))
    assert report.ok, report.problems
