"""NVIDIA DALI reads what a run writes: the index beside each uncompressed TFRecord shard (both
sinks, and a shard ``--cross_split_duplicates drop`` wrote again), ``beam_prep.dali_reader`` on
both formats against ``make_dataset``, and ``verify``'s check of the indexes.

DALI runs CPU-only here (``device_id=None``); the ``device="mixed"`` test needs a CUDA GPU and
says so in its skip. Three prepare runs, shared by the module: TFRecord (``--compression none``,
streaming sink) and WebDataset of one tree with a copy across splits that ``drop`` leaves out, and
TFRecord through the shuffle sink.
"""
from __future__ import annotations

import json
import pathlib
import shutil
import struct

import numpy as np
import pytest
from helpers import make_tree, prepare_here

import beam_prep
from beam_prep.errors import DatasetError
from beam_prep.io.tfrecord import frame
from beam_prep.tools.verification import verify

pytestmark = pytest.mark.slow
dali = pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (pip install -e '.[dali]')")

COUNTS = {"ant": 9, "bee": 7, "cat": 5}
OFFSET = 1


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("tree")
    make_tree(root, COUNTS, splits=["train", "validation"], size=(24, 16))
    # a copy across splits: drop writes the validation shard that holds it again, with its index
    shutil.copy(root / "train" / "ant" / "img_000.jpg", root / "validation" / "ant" / "copy.jpg")
    return root


def _prepare(tree: pathlib.Path, out: pathlib.Path, *flags: str) -> pathlib.Path:
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", "16", "--label_offset", str(OFFSET),
                 "--num_shards", "2", "--cross_split_duplicates", "drop", *flags)
    return out


@pytest.fixture(scope="module")
def datasets(tree, tmp_path_factory) -> dict[str, pathlib.Path]:
    base = tmp_path_factory.mktemp("ds")
    return {
        "tfrecord": _prepare(tree, base / "tfrecord", "--compression", "none"),
        "webdataset": _prepare(tree, base / "webdataset", "--file_format", "webdataset"),
        "shuffle": _prepare(tree, base / "shuffle", "--compression", "none", "--sink", "shuffle"),
    }


def reference_index(shard: pathlib.Path) -> str:
    """DALI's tfrecord2idx, step for step: each record's offset and framed size, from its length field."""
    data, lines, at = shard.read_bytes(), [], 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        size = 8 + 4 + length + 4
        lines.append(f"{at} {size}\n")
        at += size
    return "".join(lines)


def manifest(folder: pathlib.Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


@pytest.mark.parametrize("run", ["tfrecord", "shuffle"])
def test_each_uncompressed_shard_has_dalis_index_beside_it_listed_in_the_manifest(datasets, run):
    folder = datasets[run]
    listed = 0
    for split in manifest(folder)["splits"].values():
        assert split["dali_index"] == [f"dali-{shard}.idx" for shard in split["shards"]]
        for shard, index, n in zip(split["shards"], split["dali_index"], split["shard_num_examples"]):
            text = (folder / index).read_text()
            assert text == reference_index(folder / shard)
            assert len(text.splitlines()) == n
            listed += 1
    assert listed == 4 and len(list(folder.glob("*.idx"))) == 4  # none unlisted
    assert not (folder / ".beam-prep").exists() or not list((folder / ".beam-prep").rglob("*.idx"))
    assert verify(str(folder)).ok


def test_the_shard_drop_wrote_again_has_its_index_written_again(datasets):
    folder = datasets["tfrecord"]
    dropped = manifest(folder)["counts"]["dropped"]  # the copy, and any near copy of a train image
    assert dropped >= 1
    split = manifest(folder)["splits"]["validation"]
    assert sum(split["shard_num_examples"]) == sum(COUNTS.values()) + 1 - dropped  # kept in train, left out here
    for shard, index in zip(split["shards"], split["dali_index"]):
        assert (folder / index).read_text() == reference_index(folder / shard)


def test_webdataset_shards_get_no_index(datasets):
    assert not list(datasets["webdataset"].glob("*.idx"))
    assert all("dali_index" not in s for s in manifest(datasets["webdataset"])["splits"].values())


def dali_records(folder: pathlib.Path, split: str, device: str = "cpu",
                 **decoder) -> list[tuple[int, np.ndarray]]:
    """Every record of the split as DALI reads and decodes it, in its order: ``(label, pixels)``;
    ``decoder``: more arguments of ``fn.decoders.image``."""
    from nvidia.dali import fn, pipeline_def

    n = manifest(folder)["splits"][split]["num_examples"]

    @pipeline_def(batch_size=n, num_threads=1, device_id=0 if device == "mixed" else None)
    def pipeline():
        images, labels = beam_prep.dali_reader(folder, split)
        return fn.decoders.image(images, device=device, **decoder), labels

    pipe = pipeline()
    pipe.build()
    assert pipe.epoch_size("Reader") == n
    images, labels = pipe.run()
    if device == "mixed":
        images = images.as_cpu()
    return [(int(np.asarray(labels[i]).reshape(-1)[0]), np.asarray(images[i])) for i in range(n)]


def by_content(records: list[tuple[int, np.ndarray]]) -> list[tuple[int, bytes]]:
    return sorted((label, pixels.tobytes()) for label, pixels in records)


@pytest.mark.parametrize("run", ["tfrecord", "webdataset"])
@pytest.mark.parametrize("split", ["train", "validation"])
def test_dali_reads_every_record_with_make_datasets_label_and_pixels(datasets, run, split):
    expected = [(int(label), image.numpy()) for image, label in
                beam_prep.make_dataset(str(datasets["tfrecord"]), split, batch_size=None, training=False)]
    got = dali_records(datasets[run], split)
    assert len(got) == len(expected) == manifest(datasets[run])["splits"][split]["num_examples"]
    assert by_content(got) == by_content(expected)  # every record once: its label, its every pixel
    names = (datasets[run] / "labels.txt").read_text().splitlines()
    read = [names[label] for label, _ in got]  # labels index labels.txt, --label_offset taken off
    assert {name: read.count(name) for name in names} == manifest(datasets[run])["splits"][split]["class_counts"]


def _gpus() -> int:
    try:
        from nvidia.dali.backend import GetCUDADeviceCount

        return GetCUDADeviceCount()
    except Exception:  # noqa: BLE001 - no driver, no CUDA runtime: no GPU
        return 0


@pytest.mark.skipif(_gpus() == 0, reason="no CUDA GPU here: device='mixed' decodes on the GPU (nvJPEG)")
@pytest.mark.parametrize("run", ["tfrecord", "webdataset"])
def test_dali_decodes_on_the_gpu_the_pixels_it_decodes_on_the_cpu(datasets, run):
    cpu = dali_records(datasets[run], "train")
    # the CPU decoder (libjpeg-turbo) upsamples chroma "fancily", the mixed one by default not: on an
    # H200 that alone put 4:2:0 JPEGs 2 to 5 levels apart an image; upsampled alike, under 1
    gpu = dali_records(datasets[run], "train", device="mixed", jpeg_fancy_upsampling=True)
    assert [label for label, _ in gpu] == [label for label, _ in cpu]
    for (_, a), (_, b) in zip(gpu, cpu):
        assert a.shape == b.shape
        # nvJPEG's IDCT is not libjpeg-turbo's: a level or two apart, never another picture
        assert np.abs(a.astype(int) - b.astype(int)).mean() < 2


def _rewrite_reversed(shard: pathlib.Path) -> None:
    """The shard written again with its records in reverse order: the same records, other offsets."""
    data, records, at = shard.read_bytes(), [], 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        records.append(data[at + 12:at + 12 + length])
        at += length + 16
    shard.write_bytes(b"".join(frame(r) for r in reversed(records)))


def test_verify_finds_an_index_that_no_longer_matches_its_shard(datasets, tmp_path):
    folder = tmp_path / "ds"
    shutil.copytree(datasets["tfrecord"], folder)
    split = manifest(folder)["splits"]["train"]
    _rewrite_reversed(folder / split["shards"][0])
    report = verify(str(folder))
    # the shard's bytes are not the manifest's either (its records are, in another order)
    assert [(p.kind, p.where) for p in report.problems] == [("shard_sha256", str(folder / split["shards"][0])),
                                                            ("dali_index", str(folder / split["dali_index"][0]))]
    problem = report.problems[1]
    assert "does not match its shard (its line 1 says offset 0 size" in problem.message
    assert "the shard was written again after its index?" in problem.message


def _cut_short(index: pathlib.Path, lines: int) -> None:
    """The index with its first ``lines`` lines only: one left from a run that wrote fewer records, or cut."""
    index.write_text("".join(index.read_text().splitlines(keepends=True)[:lines]))


def test_an_index_shorter_than_its_shard_is_refused_before_dali_reads_fewer_records(datasets, tmp_path):
    """DALI reads the records an index lists and says nothing of the others: before the check, a pipeline
    over an index cut short read fewer records than the split holds, without an error."""
    folder = tmp_path / "ds"
    shutil.copytree(datasets["tfrecord"], folder)
    split = manifest(folder)["splits"]["train"]
    index, shard = folder / split["dali_index"][1], split["shards"][1]
    kept = split["shard_num_examples"][1] // 2
    _cut_short(index, kept)
    end = sum(int(size) for size in [line.split()[1] for line in index.read_text().splitlines()])
    with pytest.raises(DatasetError) as caught:
        dali_records(folder, "train")
    assert str(caught.value) == (
        f"{index}: the DALI index lists {kept} records ending at byte {end}, but the manifest lists "
        f"{split['shard_num_examples'][1]} records in {split['shard_bytes'][1]} bytes for its shard {shard} (left "
        "from another run, or cut short?): DALI would read the records it lists and no others; delete it and "
        "write it again from its shard (DALI's tfrecord2idx SHARD INDEX), or prepare the dataset again")
    index.write_text(reference_index(folder / shard))  # written again from its shard, as the message says
    assert len(dali_records(folder, "train")) == split["num_examples"]


def test_verify_finds_a_missing_index(datasets, tmp_path):
    folder = tmp_path / "ds"
    shutil.copytree(datasets["tfrecord"], folder)
    index = folder / manifest(folder)["splits"]["validation"]["dali_index"][1]
    index.unlink()
    report = verify(str(folder))
    assert [(p.kind, p.where) for p in report.problems] == [("dali_index", str(index))]
    assert "missing" in report.problems[0].message
