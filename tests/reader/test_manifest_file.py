"""What the readers without TensorFlow say of a wrong dataset path, and that ``load_info`` imports no
TensorFlow. A manifest made by the dataset model itself: no pipeline runs."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import REPO

import beam_prep
from beam_prep.errors import DatasetError, OptionsError
from beam_prep.model.dataset import DatasetInfo, ImageInfo, SplitInfo


@pytest.fixture
def dataset(tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    info = DatasetInfo(root=str(folder), labels=("ant", "bee"), image=ImageInfo(8, 8),
                       splits={"train": SplitInfo("train", ("train-00000-of-00001.array_record",), 3)},
                       file_format="array_record", label_offset=1)
    (folder / "manifest.json").write_text(json.dumps(info.to_json()))
    (folder / "train-00000-of-00001.array_record").write_bytes(b"")
    return folder


def test_a_missing_folder_is_said_not_to_exist(tmp_path):
    with pytest.raises(DatasetError, match=rf"^dataset folder {tmp_path}/recrods does not exist: check the path$"):
        beam_prep.data_source(tmp_path / "recrods")
    with pytest.raises(DatasetError, match=rf"dataset folder {tmp_path}/a/b does not exist \(nor does its parent"):
        beam_prep.load_info(str(tmp_path / "a" / "b"))


def test_a_shard_given_for_its_folder_is_said_to_be_a_file(dataset):
    shard = dataset / "train-00000-of-00001.array_record"
    for read in (beam_prep.data_source, beam_prep.load_info, beam_prep.shard_urls):
        with pytest.raises(DatasetError, match=rf"^{shard} is a file, not a dataset folder: pass the folder "
                                               rf"that holds it and manifest.json \({dataset}\)$"):
            read(str(shard))


def test_a_folder_without_a_manifest_says_so(tmp_path):
    with pytest.raises(DatasetError, match=rf"no manifest.json at {tmp_path}/manifest.json: not a beam-prep"):
        beam_prep.data_source(tmp_path)


def test_other_urls_than_gs_are_refused(tmp_path):
    with pytest.raises(OptionsError, match=r"reads local folders and gs://, not s3://bucket/ds"):
        beam_prep.data_source("s3://bucket/ds")


def test_shard_urls_checks_the_format_and_the_split(dataset):
    assert beam_prep.shard_urls(dataset, "train", "array_record") == [
        str(dataset / "train-00000-of-00001.array_record")]
    with pytest.raises(DatasetError, match=r"holds array_record shards .* which a webdataset reader does not "
                                           r"read: read it with beam_prep.data_source"):
        beam_prep.shard_urls(dataset, "train")
    with pytest.raises(DatasetError, match=r"has no split 'validation'; its splits: train"):
        beam_prep.shard_urls(dataset, "validation", "array_record")


@pytest.mark.slow
def test_load_info_imports_no_tensorflow(dataset):
    code = ("import sys, beam_prep; info = beam_prep.load_info(sys.argv[1]); "
            "print(info.labels, info.label_offset, 'tensorflow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(dataset)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["('ant',", "'bee')", "1", "False"]


@pytest.mark.parametrize("field, value", [("num_examples", "many"), ("num_examples", 1e400),
                                          ("num_examples", float("nan")), ("shard_num_examples", ["x"]),
                                          ("label_offset", "one")])
def test_a_number_that_is_no_number_is_a_malformed_manifest(dataset, field, value):
    """A manifest is data: a count that is text, infinite or NaN is refused as malformed, naming the
    manifest (a DatasetError; ``inspect`` exits 2), not a ValueError or OverflowError with a traceback."""
    manifest = json.loads((dataset / "manifest.json").read_text())
    if field == "label_offset":
        manifest[field] = value
    else:
        manifest["splits"]["train"][field] = value
    (dataset / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match=rf"^{dataset}/manifest.json is incomplete or malformed: missing or bad "):
        beam_prep.load_info(str(dataset))


def test_load_info_takes_a_path_object_as_every_reader_does(dataset):
    """``make_dataset``, ``data_source`` and ``shard_urls`` take ``os.PathLike``; ``load_info`` raised
    AttributeError ('PosixPath' object has no attribute 'rstrip')."""
    assert beam_prep.load_info(dataset) == beam_prep.load_info(str(dataset))
