"""Every reader reads exactly the records of the version it is given (``version=``), the latest by default;
``inspect`` shows the history and ``verify`` checks each version.

The datasets are prepared once, in two shards a split, and their manifests then say that the first shard
was version 1 and the second an append (version 2): what an append records, without running one.
"""
from __future__ import annotations

import json
import pathlib
import shutil

import pytest
from helpers import as_two_versions, make_tree, prepare_here

import beam_prep
from beam_prep.errors import DatasetError
from beam_prep.tools.inspection import render_text
from beam_prep.tools.summary import summarize

FORMATS = {"tfrecord": ("--compression", "none"), "array_record": (), "webdataset": ()}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("versions")
    make_tree(root / "in", {"ant": 5, "bee": 4}, size=(24, 20))
    out = {}
    for file_format, flags in FORMATS.items():
        out[file_format] = root / file_format
        prepare_here("--input", str(root / "in"), "--output", str(out[file_format]), "--image_size", "16",
                     "--num_shards", "2", "--file_format", file_format, *flags)
    return out


@pytest.mark.slow  # runs a pipeline in this process (the fixture)
def test_a_first_run_records_version_1_when_and_from_what(datasets):
    manifest = json.loads((datasets["tfrecord"] / "manifest.json").read_text())
    train = manifest["splits"]["train"]
    assert manifest["versions"] == [{
        "version": 1, "created": manifest["created"], "input": manifest["options"]["input"], "num_labels": 2,
        "splits": {"train": {"num_examples": 9, "shards": train["shards"], "class_counts": {"ant": 5, "bee": 4}}}}]


@pytest.fixture(scope="module")
def two_versions(datasets, tmp_path_factory) -> dict[str, tuple[pathlib.Path, int]]:
    """Each dataset as two versions, and the records of version 1."""
    root = tmp_path_factory.mktemp("two")
    out = {}
    for file_format, folder in datasets.items():
        copy = pathlib.Path(shutil.copytree(folder, root / file_format))
        manifest = as_two_versions(copy)
        out[file_format] = (copy, manifest["versions"][0]["splits"]["train"]["num_examples"])
    return out


@pytest.mark.slow  # runs a pipeline in this process (the fixture), reads with TensorFlow
def test_make_dataset_reads_the_version_it_is_given(two_versions):
    import tensorflow as tf

    folder, first = two_versions["tfrecord"]
    manifest = json.loads((folder / "manifest.json").read_text())
    in_first = {r.numpy() for r in tf.data.TFRecordDataset(str(folder / manifest["splits"]["train"]["shards"][0]))}

    def names(version):
        ds = beam_prep.make_dataset(str(folder), "train", batch_size=None, training=False, version=version,
                                    extra_keys=["image/filename"])
        return [extras["image/filename"].numpy() for _, _, extras in ds]

    assert len(names(1)) == first and 0 < first < 9 and len(in_first) == first
    assert len(names(None)) == len(names(2)) == 9
    assert set(names(1)) < set(names(None))
    with pytest.raises(DatasetError, match=r"has no version 3: it has versions 1-2$"):
        beam_prep.make_dataset(str(folder), "train", version=3)


@pytest.mark.slow  # runs a pipeline in this process (the fixture)
def test_data_source_webdataset_shard_urls_and_dali_read_the_version_given(two_versions):
    folder, first = two_versions["array_record"]
    assert len(beam_prep.data_source(folder, version=1)) == first
    assert len(beam_prep.data_source(folder)) == len(beam_prep.data_source(folder, version=2)) == 9
    folder, first = two_versions["webdataset"]
    assert len(beam_prep.shard_urls(folder, version=1)) == 1 and len(beam_prep.shard_urls(folder)) == 2
    assert sum(1 for _ in beam_prep.webdataset_pipeline(folder, version=1)) == first
    assert sum(1 for _ in beam_prep.webdataset_pipeline(folder)) == 9
    folder, first = two_versions["tfrecord"]
    from beam_prep.reader.dali import dali_plan

    plan = dali_plan(folder, version=1)
    assert (len(plan.files), len(plan.index_files), plan.num_examples) == (1, 1, first)
    for read in (beam_prep.data_source, beam_prep.webdataset_pipeline):
        with pytest.raises(DatasetError, match=r"has no version 0: it has versions 1-2$"):
            read(two_versions["array_record" if read is beam_prep.data_source else "webdataset"][0], version=0)
    with pytest.raises(DatasetError, match=r"has no version 7: it has versions 1-2$"):
        beam_prep.dali_reader(folder, version=7)


@pytest.mark.slow  # runs a pipeline in this process (the fixture)
def test_inspect_shows_the_history(two_versions):
    folder, first = two_versions["tfrecord"]
    text = render_text(summarize(str(folder)))
    section = text.split("versions: ", 1)[1].split("\n\n", 1)[0].splitlines()
    assert section[0] == "2, the latest read unless a reader is given version= (1-2)"
    assert section[1].split() == ["version", "created", "input", "records", "added", "classes"]
    assert section[2].split()[0] == "1" and section[2].split()[3:] == ["train", str(first), "2"]
    assert section[3].split()[0] == "2" and section[3].split()[2:] == ["/new", "train", str(9 - first), "0", "new:"]


@pytest.mark.slow  # runs a pipeline in this process (the fixture), verify reads with TensorFlow
def test_verify_checks_each_versions_counts(two_versions, tmp_path):
    from beam_prep.tools.verification import verify

    folder = pathlib.Path(shutil.copytree(two_versions["tfrecord"][0], tmp_path / "ds"))
    assert verify(str(folder)).ok
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["versions"][0]["splits"]["train"]["num_examples"] += 1
    (folder / "manifest.json").write_text(json.dumps(manifest))
    report = verify(str(folder))
    # and version 1's kept hash file, whose lines are its records, holds one less than it now says
    assert [(p.kind, pathlib.Path(p.where).name if p.kind == "hash_files" else p.where) for p in report.problems] == [
        ("split_count", "version 1, split 'train'"), ("hash_files", "hashes-v1.tsv.gz")]
