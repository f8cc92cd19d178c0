"""``beam_prep.dali_reader``'s checks before DALI starts (``dali_plan``), on manifests written here,
and the DALI index's own format (``io.dali_index``): no pipeline, no DALI needed."""
from __future__ import annotations

import json
import pathlib

import pytest

import beam_prep
from beam_prep.errors import DatasetError, OptionsError
from beam_prep.io.dali_index import index_name, index_text, parse_index
from beam_prep.io.tfrecord import frame
from beam_prep.model.dataset import DatasetInfo, ImageInfo, SplitInfo
from beam_prep.reader.dali import dali_plan
from beam_prep.write.shared import layout
from beam_prep.write.shared.shard_formats import dali_indexed


def write_dataset(folder: pathlib.Path, *, file_format: str = "tfrecord", compression: str = "NONE",
                  indexed: bool = True, multi_label: bool = False, labels: tuple[str, ...] = ("a", "b"),
                  shard_bytes: tuple[int, int] | None = None,
                  shard_num_examples: tuple[int, int] = (0, 0)) -> str:
    """A manifest as the writer writes it, over two empty shards (and their index files)."""
    suffix = {"tfrecord": ".tfrecord" if compression == "NONE" else ".tfrecord.gz",
              "webdataset": ".tar", "array_record": ".array_record"}[file_format]
    shards = tuple(f"train-0000{i}-of-00002{suffix}" for i in range(2))
    index = tuple(index_name(s) for s in shards) if indexed else None
    split = SplitInfo("train", shards, sum(shard_num_examples), shard_num_examples, dali_index=index, shard_bytes=shard_bytes)
    info = DatasetInfo(str(folder), labels, {"train": split}, ImageInfo(8, 8), compression=compression,
                       label_offset=1, multi_label=multi_label, file_format=file_format)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(info.to_json()))
    for name in shards + (index or ()):
        (folder / name).write_bytes(b"")
    return str(folder)


def test_the_plan_lists_the_shards_their_index_files_and_the_labels(tmp_path):
    plan = dali_plan(write_dataset(tmp_path / "ds"), "train")
    assert plan.file_format == "tfrecord"
    assert plan.files == tuple(str(tmp_path / "ds" / f"train-0000{i}-of-00002.tfrecord") for i in range(2))
    assert plan.index_files == tuple(index_name(f) for f in plan.files)
    assert (plan.labels, plan.label_offset, plan.image_extension) == (("a", "b"), 1, "jpg")


def test_a_webdataset_plan_has_no_index_files(tmp_path):
    plan = dali_plan(write_dataset(tmp_path / "ds", file_format="webdataset", indexed=False))
    assert plan.index_files is None and plan.files[0].endswith(".tar")


def refusal(folder: str, split: str = "train") -> str:
    with pytest.raises((DatasetError, OptionsError)) as e:
        beam_prep.dali_reader(folder, split)  # refused before DALI is imported
    message = str(e.value)
    assert "\n" not in message
    return message


def test_a_gzip_dataset_is_refused_saying_to_prepare_with_compression_none(tmp_path):
    folder = write_dataset(tmp_path / "ds", compression="GZIP", indexed=False)
    assert refusal(folder) == (f"{folder} holds GZIP-compressed TFRecords, which DALI cannot read: prepare it "
                               "with --compression none (or --file_format webdataset)")


def test_an_array_record_dataset_is_refused_naming_its_reader(tmp_path):
    folder = write_dataset(tmp_path / "ds", file_format="array_record", indexed=False)
    message = refusal(folder)
    assert message.startswith(f"{folder} holds array_record shards, which DALI has no reader for: prepare it with "
                              "--file_format tfrecord --compression none")
    assert message.endswith("or read it with beam_prep.data_source")


def test_a_dataset_without_index_files_is_refused(tmp_path):
    folder = write_dataset(tmp_path / "ds", indexed=False)
    assert refusal(folder) == (f"{folder} lists no DALI index files for its shards (prepared by an older "
                               "beam-prep?): prepare it again with --compression none, which writes them")


def test_an_index_file_gone_from_the_folder_is_named(tmp_path):
    folder = write_dataset(tmp_path / "ds")
    gone = tmp_path / "ds" / "dali-train-00001-of-00002.tfrecord.idx"
    gone.unlink()
    assert refusal(folder).startswith(f"{gone}: the DALI index of a shard of {folder} is missing")


_REWRITE = ("delete it and write it again from its shard (DALI's tfrecord2idx SHARD INDEX), or prepare the dataset "
            "again")


@pytest.mark.parametrize(("text", "shard_bytes", "holds", "listed"), [
    (index_text([5]), None, "1 records ending at byte 21", "0 records"),  # left from a run that wrote one
    (index_text([5]), (0, 0), "1 records ending at byte 21", "0 records in 0 bytes"),
    (b"", (0, 40), "0 records ending at byte 0", "0 records in 40 bytes"),  # the count alone agrees
])
def test_an_index_that_does_not_end_where_its_shard_does_is_refused(tmp_path, text, shard_bytes, holds, listed):
    folder = write_dataset(tmp_path / "ds", shard_bytes=shard_bytes)
    index = tmp_path / "ds" / "dali-train-00001-of-00002.tfrecord.idx"
    index.write_bytes(text)
    assert refusal(folder) == (f"{index}: the DALI index lists {holds}, but the manifest lists {listed} for its "
                               "shard train-00001-of-00002.tfrecord (left from another run, or cut short?): DALI "
                               f"would read the records it lists and no others; {_REWRITE}")


_WRITTEN = index_text([5, 7, 300, 1])  # the index of a shard of four records, as the writer writes it
_LINES = _WRITTEN.splitlines(keepends=True)


@pytest.mark.parametrize(("text", "why"), [
    (b"0 21\n21", "its last line has no line break (cut short?)"),
    (b"0 21\n21 x\n", "line 2 is '21 x', not '<offset> <size>'"),
    # DALI stops at the first line it cannot parse, and skips blank ones: with the count and the last
    # line the manifest's, each of these read fewer records than the shard holds, or other ones, silently
    (b"".join(_LINES[:2] + [b"x y\n"] + _LINES[3:]), "line 3 is 'x y', not '<offset> <size>'"),
    (b"".join(_LINES[:2] + [b"\n"] + _LINES[3:]), "line 3 is '', not '<offset> <size>'"),
    (b"".join([b"# made by hand\n"] + _LINES[1:]), "line 1 is '# made by hand', not '<offset> <size>'"),
    (b"".join(_LINES[:1] * 3 + _LINES[3:]), "line 2 says offset 0, but the record before it ends at byte 21"),
    (b"".join(_LINES[:2] + [_LINES[2].rstrip() + b" 5\n"] + _LINES[3:]), "line 3 is '44 316 5', not "
                                                                         "'<offset> <size>'"),
    (b"".join(_LINES[:2] + [b"44\t316\n"] + _LINES[3:]), "line 3 is '44\\t316', not '<offset> <size>'"),
    (b"0 21\n21 7\n28 332\n360 17\n", "line 2 says size 7, less than a record's framing (16 bytes)"),
    (b"\xff" * 100 + b"\n", "line 1 is '" + "\\xff" * 40 + "...', not '<offset> <size>'"),
])
def test_an_index_that_is_no_index_is_refused(tmp_path, text, why):
    folder = write_dataset(tmp_path / "ds", shard_num_examples=(4, 0), shard_bytes=(377, 0))
    index = tmp_path / "ds" / "dali-train-00000-of-00002.tfrecord.idx"
    index.write_bytes(_WRITTEN)
    assert dali_plan(folder).index_files is not None  # as written: the manifest's count and end
    index.write_bytes(text)
    assert refusal(folder) == f"{index}: not a DALI index ({why}); {_REWRITE}"


def test_an_index_that_agrees_with_its_shards_manifest_entry_passes(tmp_path):
    folder = write_dataset(tmp_path / "ds", shard_bytes=(0, 0))
    assert dali_plan(folder).index_files is not None  # empty shards, empty indexes: 0 records ending at 0


def test_a_multi_label_webdataset_and_a_missing_split_are_refused(tmp_path):
    folder = write_dataset(tmp_path / "ds", file_format="webdataset", indexed=False, multi_label=True)
    assert "multi-label WebDataset" in refusal(folder)
    assert refusal(folder, "test") == f"{folder} has no split 'test'; it has train"


def test_gs_is_refused_saying_to_copy_it_down():
    assert refusal("gs://bucket/ds").startswith("beam_prep.dali_reader reads local folders")


def test_only_uncompressed_tfrecords_are_indexed():
    assert dali_indexed("tfrecord", "none")
    assert not dali_indexed("tfrecord", "gzip")
    assert not dali_indexed("webdataset", "none") and not dali_indexed("array_record", "none")


def test_an_index_says_each_framed_records_offset_and_size():
    records = [b"", b"x" * 5, b"y" * 300]
    text = index_text(len(r) for r in records)
    assert text == b"0 16\n16 21\n37 316\n"
    assert sum(size for _, size in parse_index(text)) == len(b"".join(frame(r) for r in records))
    with pytest.raises(ValueError, match="line 2 is '7'"):
        parse_index(b"0 16\n7\n")


def test_an_index_is_the_datasets_file_that_overwrite_replaces(tmp_path):
    (tmp_path / "dali-train-00000-of-00001.tfrecord.idx").write_bytes(b"")
    (tmp_path / "notes.idx").write_bytes(b"")
    assert layout.existing_dataset_files(str(tmp_path)) == [str(tmp_path / "dali-train-00000-of-00001.tfrecord.idx")]
    assert not layout.is_shard_name("dali-train-00000-of-00001.tfrecord.idx")  # verify: not an unlisted shard
