"""--file_format array_record and webdataset: each read back with its own library (the array_record
package's data source, Grain, webdataset), not ours, and refused with the fix where it cannot be."""
from __future__ import annotations

import hashlib
import io
import json
import pathlib
import re

import numpy as np
import pytest
from helpers import REPO, assert_shard_checksums, encode, prepare_here
from PIL import Image

from beam_prep.errors import DatasetError
from beam_prep.io.libraries import LIBRARIES
from beam_prep.tools.sample import picture
from pipelines import prepare_images

LABELS = ("ant", "bee", "cat")
PER_LABEL = 7
# PNGs at their own size: the stored pixels are the source's exactly.
DATASET_ARGS = ("--image_format", "png", "--resize_mode", "none", "--validation_percent", "30", "--num_shards", "2")
# The commands on gs:// run with worker processes; the runs in this process on Beam's in-memory
# runner (``prepare_here``), which must write the same bytes.
ARGS = (*DATASET_ARGS, "--direct_num_workers", "2", "--direct_running_mode", "multi_processing")
FORMATS = ("tfrecord", "array_record", "webdataset")


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> pathlib.Path:
    """PNGs of varying sizes in three labels, one with dots in its name, a copy of one, and a broken file."""
    root = tmp_path_factory.mktemp("formats") / "tree"
    seed = 0
    for label in LABELS:
        (root / label).mkdir(parents=True)
        for i in range(PER_LABEL):
            name = f"img.{i:02d}.v2.png" if i == 0 else f"img_{i:02d}.png"
            (root / label / name).write_bytes(encode(picture(seed, 20 + seed, 16 + i), "PNG"))
            seed += 1
    (root / "bee" / "broken.png").write_bytes(b"\x89PNG not a whole one")
    (root / "cat" / "copy.png").write_bytes((root / "ant" / "img_01.png").read_bytes())  # a duplicate
    return root


@pytest.fixture(scope="module")
def outputs(tree, tmp_path_factory) -> dict[str, pathlib.Path]:
    """The tree prepared once in each format (TFRecords uncompressed, as the others are), in this
    process on the in-memory runner: the gs:// runs below, commands with worker processes, must
    write the same bytes."""
    out = {}
    for file_format in FORMATS:
        folder = tmp_path_factory.mktemp(file_format) / "out"
        extra = ("--compression", "none") if file_format == "tfrecord" else ()
        prepare_here("--input", str(tree), "--output", str(folder), "--file_format", file_format, *extra,
                     *DATASET_ARGS)
        out[file_format] = folder
    return out


def _manifest(folder: pathlib.Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def _source_pixels(tree: pathlib.Path, filename: str) -> np.ndarray:
    with Image.open(tree / filename) as img:
        return np.asarray(img.convert("RGB"))


def _tfrecords(folder: pathlib.Path, split: str) -> list[bytes]:
    import tensorflow as tf

    names = _manifest(folder)["splits"][split]["shards"]
    return [r.numpy() for name in names for r in tf.data.TFRecordDataset(str(folder / name))]


def test_every_format_writes_the_same_dataset_under_its_own_shard_names(outputs):
    manifests = {f: _manifest(folder) for f, folder in outputs.items()}
    for file_format, manifest in manifests.items():
        assert manifest["file_format"] == file_format
        assert manifest["counts"] == {"listed": 23, "written": 22, "failed": 1, "skipped": 0}
        assert manifest["duplicates"]["extra_copies"] == 1
        assert manifest["compression"] == "NONE"
        suffix = {"tfrecord": ".tfrecord", "array_record": ".array_record", "webdataset": ".tar"}[file_format]
        for split in manifest["splits"].values():
            assert all(re.fullmatch(rf"(train|validation)-0000[01]-of-00002{re.escape(suffix)}", s)
                       for s in split["shards"]), split["shards"]
            assert all((outputs[file_format] / s).is_file() for s in split["shards"])
        assert_shard_checksums(outputs[file_format])  # the streaming sink's, in each format
    rows = [json.loads(line) for line in (outputs["tfrecord"] / "duplicates.jsonl").read_text().splitlines()]
    assert len([r for r in rows if r["kind"] == "exact"]) == 2  # the copy and its original
    for file_format, manifest in manifests.items():
        for name in ("labels.txt", "errors.jsonl", "duplicates.jsonl", "skipped.jsonl"):
            assert (outputs[file_format] / name).read_bytes() == (outputs["tfrecord"] / name).read_bytes()
    splits = {f: {s: (v["num_examples"], v["class_counts"], v["shard_num_examples"])
                  for s, v in m["splits"].items()} for f, m in manifests.items()}
    assert splits["array_record"] == splits["webdataset"] == splits["tfrecord"]
    # TFDS reads array_record as it reads tfrecord; it has no reader for tar shards.
    assert json.loads((outputs["array_record"] / "dataset_info.json").read_text())["fileFormat"] == "array_record"
    assert not (outputs["webdataset"] / "dataset_info.json").exists()


@pytest.mark.parametrize("split", ["train", "validation"])
def test_array_record_shards_hold_the_tfrecord_examples_in_the_same_order(outputs, split):
    """Read with the array_record package's own data source: the very records of the TFRecord run."""
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    folder = outputs["array_record"]
    names = _manifest(folder)["splits"][split]["shards"]
    with ArrayRecordDataSource([str(folder / name) for name in names]) as source:
        records = [source[i] for i in range(len(source))]
    assert records == _tfrecords(outputs["tfrecord"], split)
    assert len(records) == _manifest(folder)["splits"][split]["num_examples"]


def test_grain_reads_data_source_by_index_with_the_source_pixels(outputs, tree):
    import grain
    import jax  # noqa: F401  as a JAX training script has it

    import beam_prep

    manifest = _manifest(outputs["array_record"])
    source = beam_prep.data_source(outputs["array_record"], "train")
    assert len(source) == manifest["splits"]["train"]["num_examples"]
    dataset = grain.MapDataset.source(source).shuffle(seed=7)
    seen = set()
    for i in range(len(dataset)):
        record = dataset[i]
        label, _ = record["filename"].split("/")
        assert record["label"] == LABELS.index(label) and record["label_text"] == label
        assert record["image"].dtype == np.uint8
        np.testing.assert_array_equal(record["image"], _source_pixels(tree, record["filename"]))
        assert record["sha256"] == hashlib.sha256((tree / record["filename"]).read_bytes()).hexdigest()
        seen.add(record["filename"])
    assert len(seen) == len(source)
    assert [r["filename"] for r in source.__getitems__([2, 0, 2])] == [source[2]["filename"], source[0]["filename"],
                                                                        source[2]["filename"]]
    assert source[-1]["filename"] == source[len(source) - 1]["filename"]
    with pytest.raises(IndexError):
        source[len(source)]


def test_grain_worker_processes_read_every_record_and_resume_from_a_checkpoint(outputs, tree):
    """data_source pickled into Grain's worker processes, behind a global shuffle; an iterator's state
    saved after two batches gives the same rest of the epoch."""
    import subprocess

    from helpers import child

    done = subprocess.run(child("grain_workers", str(outputs["array_record"])), cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    names = [name for name, _, _ in result["read"]]
    expected = sorted(r["image/filename"] for r in _parsed(outputs["tfrecord"], "train"))
    assert sorted(names) == expected and names != expected  # every record once, shuffled
    for name, label, pixels in result["read"]:
        assert label == LABELS.index(name.split("/")[0])
        assert pixels == int(_source_pixels(tree, name).sum())
    assert result["again"] == names[6:]


def test_tfds_reads_the_array_record_dataset_by_index(outputs, tree):
    """TFDS's own array_record data source, from the metadata written beside the shards."""
    import tensorflow_datasets as tfds

    manifest = _manifest(outputs["array_record"])
    builder = tfds.builder_from_directory(str(outputs["array_record"]))
    for split, expected in manifest["splits"].items():
        source = builder.as_data_source(split=split)
        assert len(source) == expected["num_examples"]
        for i in range(len(source)):
            example = source[i]
            name = example["image/filename"].decode()
            assert example["image/class/label"] == LABELS.index(name.split("/")[0])
            np.testing.assert_array_equal(example["image/encoded"], _source_pixels(tree, name))


def test_data_source_decodes_without_tensorflow_or_beam(outputs):
    """A training host of JAX or PyTorch imports neither; a fresh process shows what it loaded."""
    import subprocess
    import sys

    code = ("import sys, beam_prep; s = beam_prep.data_source(sys.argv[1], 'validation'); s[0]; "
            "print(sorted(m for m in ('tensorflow', 'apache_beam') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code, str(outputs["array_record"])], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"


def test_webdataset_reads_every_sample_with_its_key_label_and_image(outputs, tree):
    import webdataset

    folder = outputs["webdataset"]
    manifest = _manifest(folder)
    for split, info in manifest["splits"].items():
        urls = [str(folder / name) for name in info["shards"]]
        samples = list(webdataset.WebDataset(urls, shardshuffle=False, empty_check=False))
        assert len(samples) == info["num_examples"]
        keys = [s["__key__"] for s in samples]
        assert len(set(keys)) == len(keys) and all(re.fullmatch(r"[0-9a-f]{32}", k) for k in keys)
        for sample in samples:
            assert {k for k in sample if not k.startswith("__")} == {"png", "cls", "json"}
            about = json.loads(sample["json"])
            label = about["filename"].split("/")[0]
            assert int(sample["cls"]) == about["label"] == LABELS.index(label)
            assert about["label_text"] == label
            source = (tree / about["filename"]).read_bytes()
            assert about["sha256"] == hashlib.sha256(source).hexdigest() and about["size"] == len(source)
            with Image.open(io.BytesIO(sample["png"])) as img:
                pixels = np.asarray(img.convert("RGB"))
            assert (about["height"], about["width"], about["channels"]) == (*pixels.shape[:2], 3)
            np.testing.assert_array_equal(pixels, _source_pixels(tree, about["filename"]))
        assert sorted(json.loads(s["json"])["filename"] for s in samples) == sorted(
            r["image/filename"] for r in _parsed(outputs["tfrecord"], split))


def _parsed(folder: pathlib.Path, split: str) -> list[dict]:
    from beam_prep.model.features import decode_example

    return [{k: v.decode() if isinstance(v, bytes) and k != "image/encoded" else v
             for k, v in decode_example(r).items()} for r in _tfrecords(folder, split)]


def _array_records(folder: pathlib.Path, split: str) -> list[bytes]:
    """A split's records, read with the array_record package's own data source."""
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    names = _manifest(folder)["splits"][split]["shards"]
    with ArrayRecordDataSource([str(folder / name) for name in names]) as source:
        return [source[i] for i in range(len(source))]


def _samples(folder: pathlib.Path, split: str) -> list[dict]:
    """A split's samples, read with webdataset, without its decoders: bytes as stored."""
    import webdataset

    urls = [str(folder / name) for name in _manifest(folder)["splits"][split]["shards"]]
    return [{k: v for k, v in sample.items() if not k.startswith("__") or k == "__key__"}
            for sample in webdataset.WebDataset(urls, shardshuffle=False, empty_check=False)]


def _contents(folder: pathlib.Path, file_format: str) -> dict[str, list]:
    """Each split's records, sorted: what two runs must agree on, whatever order their sink wrote."""
    read = {"array_record": _array_records, "webdataset": _samples}[file_format]
    return {split: sorted(read(folder, split), key=lambda r: r if isinstance(r, bytes) else r["__key__"])
            for split in _manifest(folder)["splits"]}


@pytest.mark.parametrize("file_format", ["array_record", "webdataset"])
def test_the_shuffle_sink_writes_the_same_records_in_every_format(outputs, tree, tmp_path, file_format):
    out = tmp_path / "out"
    prepare_here("--input", str(tree), "--output", str(out), "--file_format", file_format, "--sink", "shuffle",
                 *DATASET_ARGS)
    manifest, streamed = _manifest(out), _manifest(outputs[file_format])
    assert manifest["sink"] == "shuffle" and manifest["counts"] == streamed["counts"]
    for split, info in manifest["splits"].items():  # counted after Beam's sink wrote them, per format
        assert sum(info["shard_num_examples"]) == info["num_examples"] == streamed["splits"][split]["num_examples"]
    assert _contents(out, file_format) == _contents(outputs[file_format], file_format)
    assert not (out / ".beam-prep").exists()
    assert_shard_checksums(out)  # hashed as Beam's file sink wrote them


@pytest.mark.slow  # runs a pipeline in this process
def test_the_python_api_takes_file_format_and_refuses_an_unknown_one_by_keyword(tree, tmp_path):
    import beam_prep
    from beam_prep.errors import OptionsError

    manifest = beam_prep.prepare(str(tree), str(tmp_path / "out"), file_format="webdataset", image_format="png",
                                 resize_mode="none", direct_running_mode="in_memory")
    assert manifest["file_format"] == "webdataset" and manifest["counts"]["written"] == 22
    assert sum(len(_samples(tmp_path / "out", split)) for split in manifest["splits"]) == 22
    with pytest.raises(OptionsError, match=re.escape(
            "file_format must be one of tfrecord, array_record, webdataset, not 'zip'")):
        beam_prep.prepare(str(tree), str(tmp_path / "other"), file_format="zip")
    assert not (tmp_path / "other").exists()


@pytest.mark.slow  # runs a pipeline in this process
@pytest.mark.parametrize("file_format", ["array_record", "webdataset"])
def test_write_image_dataset_writes_every_format(tree, tmp_path, file_format):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    import beam_prep
    from beam_prep.write.run.pipeline import local_runner

    out = tmp_path / "out"
    paths = sorted(tree.glob("*/*.png"))
    options = PipelineOptions([], direct_running_mode="in_memory")
    with beam.Pipeline(runner=local_runner(options), options=options) as p:
        _ = (p | beam.Create([(str(path), path.parent.name) for path in paths])
             | beam_prep.WriteImageDataset(str(out), list(LABELS), root=str(tree), image_format="png",
                                           resize_mode="none", file_format=file_format))
    manifest = _manifest(out)
    assert manifest["file_format"] == file_format
    assert manifest["counts"] == {"listed": 23, "written": 22, "failed": 1, "skipped": 0}
    records = _contents(out, file_format)["train"]
    assert len(records) == 22
    assert_shard_checksums(out)


def test_webdataset_decodes_with_its_own_decoders(outputs):
    """``.decode("rgb8")`` and ``.to_tuple``, as a PyTorch DataLoader's dataset is built."""
    import webdataset

    folder = outputs["webdataset"]
    urls = [str(folder / n) for n in _manifest(folder)["splits"]["train"]["shards"]]
    pairs = list(webdataset.WebDataset(urls, shardshuffle=False, empty_check=False).decode("rgb8").to_tuple(
        "png", "cls"))
    assert len(pairs) == _manifest(folder)["splits"]["train"]["num_examples"]
    assert all(image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3 for image, _ in pairs)
    assert {label for _, label in pairs} == {0, 1, 2}


@pytest.mark.parametrize("file_format, sink", [("array_record", "streaming"), ("array_record", "shuffle"),
                                               ("webdataset", "streaming"), ("webdataset", "shuffle")])
def test_gs_output_in_every_format(gcs_server, outputs, tree, tmp_path, file_format, sink):
    """Shards written on gs:// (ArrayRecord's through local disk) and published last, as local ones:
    the streaming sink's byte for byte the local run's, the shuffle sink's the same records."""
    from pipelines import prepare_images

    bucket = gcs_server.new_bucket()
    bucket.upload_tree(tree, "images")
    gcs_server.run(prepare_images.command("--input", bucket.url("images"), "--output", bucket.url("records"),
                                          "--file_format", file_format, "--sink", sink, *ARGS), cwd=REPO)
    manifest = json.loads(bucket.read_bytes("records/manifest.json"))
    assert manifest["file_format"] == file_format and manifest["sink"] == sink
    shards = [name for split in manifest["splits"].values() for name in split["shards"]]
    assert bucket.list_names("records/") == sorted(f"records/{name}" for name in [
        *shards, "errors.jsonl", "skipped.jsonl", "duplicates.jsonl", "flat.jsonl", "hashes-v1.tsv.gz", "labels.txt", "manifest.json", "README.md",
        "stamps-v1.tsv.gz", *(["dataset_info.json", "features.json", "image.class.label.labels.txt"]
          if file_format == "array_record" else [])])
    local = tmp_path / "records"
    bucket.download_tree("records/", local)
    if sink == "streaming":
        for name in shards:
            assert (local / name).read_bytes() == (outputs[file_format] / name).read_bytes(), name
    assert _contents(local, file_format) == _contents(outputs[file_format], file_format)
    assert_shard_checksums(local)  # hashed as they were written to gs:// (ArrayRecord's: as uploaded)


@pytest.mark.parametrize("file_format", ["array_record", "webdataset"])
def test_verify_reads_and_checks_every_record_of_every_format(outputs, file_format):
    from beam_prep.tools.verification import verify

    report = verify(str(outputs[file_format]))
    assert report.ok, report.problems
    assert report.records == report.expected_records == 22 and report.shards == 4


def _damaged_copy(outputs, file_format: str, tmp_path: pathlib.Path) -> tuple[pathlib.Path, str]:
    """A copy of the dataset, and its first train shard's name."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(outputs[file_format], out)
    return out, _manifest(out)["splits"]["train"]["shards"][0]


@pytest.mark.parametrize("file_format", ["array_record", "webdataset"])
def test_verify_names_a_shard_cut_short_in_every_format(outputs, tmp_path, file_format):
    from beam_prep.tools.verification import verify

    out, shard = _damaged_copy(outputs, file_format, tmp_path)
    data = (out / shard).read_bytes()
    (out / shard).write_bytes(data[:len(data) * 2 // 3])
    report = verify(str(out))
    assert [(p.kind, p.where) for p in report.problems] == [("damaged_shard", str(out / shard))]
    assert "damaged or unreadable" in report.problems[0].message
    assert report.records < report.expected_records


def test_verify_names_a_webdataset_sample_whose_cls_disagrees_with_its_json(outputs, tmp_path):
    import tarfile

    from beam_prep.tools.verification import verify

    out, shard = _damaged_copy(outputs, "webdataset", tmp_path)
    data = bytearray((out / shard).read_bytes())
    with tarfile.open(out / shard) as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith(".cls"))
        stored = int(archive.extractfile(member).read())
    data[member.offset_data] = ord(str((stored + 1) % 3))  # same size: the tar stays whole
    (out / shard).write_bytes(bytes(data))
    report = verify(str(out))
    kinds = [p.kind for p in report.problems]
    # The shard's bytes changed, so its sha256 is no longer the manifest's too.
    assert set(kinds) <= {"bad_record", "class_count", "shard_sha256"} and "shard_sha256" in kinds, report.problems
    bad = next(p for p in report.problems if p.kind == "bad_record")
    assert bad.where == f"{out / shard}, record 0"
    assert bad.message == (f"sample {member.name[:-4]}'s cls is {(stored + 1) % 3} but its json's "
                           f"label is {stored}")


@pytest.mark.parametrize("file_format", ["array_record", "webdataset"])
def test_inspect_names_the_format_and_draws_its_records(outputs, tree, tmp_path, capsys, file_format):
    """The table and --json name the format and its reader; --grid decodes the shards' own images."""
    from beam_prep.tools import contact_sheet
    from beam_prep.tools.summary import summarize
    from pipelines import inspect_output

    grid = tmp_path / "sheet.png"
    assert inspect_output.main([str(outputs[file_format]), "--grid", str(grid), "--per-class", "2"]) == 0
    out = capsys.readouterr().out
    reader = {"array_record": "beam_prep.data_source (Grain, PyTorch)",
              "webdataset": "beam_prep.webdataset_pipeline (webdataset, PyTorch)"}[file_format]
    assert f"compression NONE, {file_format} shards (read with {reader})" in out
    assert grid.is_file()
    assert inspect_output.main([str(outputs[file_format]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["file_format"] == file_format
    images = contact_sheet.collect(summarize(str(outputs[file_format])).info, "train", 2)
    assert [len(row) for row in images] == [2, 2, 2]
    tfrecord = contact_sheet.collect(summarize(str(outputs["tfrecord"])).info, "train", 2)
    for mine, theirs in zip(images, tfrecord):  # the same first images of each class, the same pixels
        for a, b in zip(mine, theirs):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("file_format", ["array_record", "webdataset"])
@pytest.mark.parametrize("order", ["training", "eval"])
def test_bench_times_each_format_with_its_own_reader(outputs, capsys, file_format, order):
    from pipelines import bench_reader

    args = [str(outputs[file_format]), "--seconds", "0.3", "--warmup_seconds", "0", "--batch_size", "4"]
    assert bench_reader.main(args + (["--eval"] if order == "eval" else [])) == 0
    line = capsys.readouterr().out.strip()
    assert re.fullmatch(rf"[\d,]+ images/s reading split 'train' of {re.escape(str(outputs[file_format]))} "
                        rf"\([\d,]+ images in [\d.]+ s, batch 4, {order}\w* order; [\d,]+ images per CPU-second\)",
                        line), line


def test_each_reader_refuses_another_format_naming_the_right_one(outputs):
    import beam_prep

    with pytest.raises(DatasetError, match=re.escape(
            f"{outputs['tfrecord']} holds tfrecord shards (--file_format tfrecord), which beam_prep.data_source "
            "does not read: read it with beam_prep.make_dataset (tf.data)")):
        beam_prep.data_source(outputs["tfrecord"], "train")
    with pytest.raises(DatasetError, match=re.escape(
            f"{outputs['array_record']} holds array_record shards (--file_format array_record), which "
            "beam_prep.make_dataset does not read: read it with beam_prep.data_source (Grain, PyTorch)")):
        beam_prep.make_dataset(str(outputs["array_record"]), "train")
    with pytest.raises(DatasetError, match=re.escape(
            "which beam_prep.make_dataset does not read: read it with beam_prep.webdataset_pipeline (webdataset, PyTorch)")):
        beam_prep.make_dataset(str(outputs["webdataset"]), "train")


def test_an_unknown_format_is_refused_before_any_work_naming_the_choices(tree, tmp_path, capsys):
    """The command's main in this process: refused before any work, it starts nothing."""
    out = tmp_path / "out"
    capsys.readouterr()
    assert prepare_images.main(["--input", str(tree), "--output", str(out), "--file_format", "parquet"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: --file_format must be one of tfrecord, array_record, webdataset, not 'parquet'")
    assert not out.exists()


def test_gzip_is_refused_for_the_formats_that_are_not_tfrecord(tree, tmp_path, capsys):
    """The command's main in this process: refused before any work, it starts nothing."""
    out = tmp_path / "out"
    capsys.readouterr()
    assert prepare_images.main(["--input", str(tree), "--output", str(out), "--file_format", "webdataset",
                                "--compression", "gzip"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: --compression gzip is for --file_format tfrecord only: webdataset shards are not "
        "GZIP-compressed (drop --compression)")
    assert not out.exists()


def test_a_missing_library_is_refused_before_any_work_with_its_install_command(tree, tmp_path, capsys, monkeypatch):
    """A package of the library's name that cannot be imported, first on the path: as a machine without it.
    The command's main in this process, which has forgotten the library's modules while it runs:
    refused before any work, it starts nothing."""
    import sys

    shadow = tmp_path / "shadow" / "array_record"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named array_record')\n")
    monkeypatch.syspath_prepend(str(shadow.parent))
    for name in [n for n in sys.modules if n == "array_record" or n.startswith("array_record.")]:
        monkeypatch.delitem(sys.modules, name)
    out = tmp_path / "out"
    capsys.readouterr()
    assert prepare_images.main(["--input", str(tree), "--output", str(out), "--file_format", "array_record"]) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("error: --file_format array_record needs the array-record library, which cannot be "
                           "imported here"), last
    assert last.endswith("install it with pip install 'array-record>=0.8,<0.9'"), last
    assert not out.exists()


def test_the_install_commands_are_setup_pys_extras():
    setup = (REPO / "setup.py").read_text()
    for name, library in LIBRARIES.items():
        assert re.search(rf'"{name}": \["{re.escape(library.requirement)}"\]', setup), name
    # in the test extra, for CI (array-record where its wheels are: CPython 3.11+)
    assert 'for r in FORMATS["array_record"]), *FORMATS["webdataset"]' in setup
