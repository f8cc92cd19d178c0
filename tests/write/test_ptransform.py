"""WriteImageDataset in a user's own Beam pipeline: elements listed and filtered the user's way,
written as the command writes, read back with our reader and plain TensorFlow."""
from __future__ import annotations

import gzip
import json
import struct

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that
from helpers import REPO, child, encode, make_tree, read_split
from PIL import Image

import beam_prep
from beam_prep.errors import OptionsError
from beam_prep.model import features
from beam_prep.reader import load_info, make_dataset
from beam_prep.tools.sample import picture
from beam_prep.write.plan.listing import split_for
from beam_prep.write.run.claim import OutputBusy, claim_output
from beam_prep.write.run.pipeline import local_runner
from beam_prep.write.run.write_image_dataset import WriteImageDataset

HEIGHT, WIDTH = 20, 24
LABELS = ["cat", "dog"]
SPLITS = ("train", "validation", "test")
# Raw pixels at the source's own size: every stored pixel must equal the source's.
EXACT = {"image_size": (HEIGHT, WIDTH), "image_format": "raw", "max_pixels": 100000}


def _pipeline() -> beam.Pipeline:
    """The runner DirectRunner picks where it cannot fetch Prism, in memory; named here so that
    a machine online runs the same (pipeline.local_runner)."""
    options = PipelineOptions([], direct_running_mode="in_memory")
    return beam.Pipeline(runner=local_runner(options), options=options)


def _pixels(record: dict) -> np.ndarray:
    return np.frombuffer(record[features.ENCODED], np.uint8).reshape(HEIGHT, WIDTH, 3)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    make_tree(root, {"cat": 3, "dog": 2, "bird": 2}, size=(WIDTH, HEIGHT), fmt="PNG", ext=".png")
    return root


@pytest.fixture(scope="module")
def written(tree, tmp_path_factory):
    """A user's pipeline: paths from the tree with the user's own filter (no birds), an image
    held in memory (int label, explicit split and name), bad bytes, an unknown label and an
    undeclared split."""
    out = tmp_path_factory.mktemp("out") / "dataset"
    paths = [(str(p), p.parent.name) for p in sorted(tree.glob("*/*.png"))]
    elements = [
        *paths,
        (encode(picture(100, WIDTH, HEIGHT), "PNG"), 1, "test", "memory/dog/0.png"),
        beam_prep.ImageElement(b"not an image", "cat", name="memory/broken"),
        (str(tree / "cat" / "img_000.png"), "horse"),
        (str(tree / "dog" / "img_001.png"), "dog", "holdout"),
    ]
    with _pipeline() as p:
        manifests = (p
                     | beam.Create(elements)
                     | "NoBirds" >> beam.Filter(lambda e: e[1] != "bird")
                     | WriteImageDataset(str(out), LABELS, validation_percent=40, splits=SPLITS,
                                         root=str(tree), num_shards=2, **EXACT))
        assert_that(manifests, lambda got: _one_manifest(got, out))
    return out


def _one_manifest(got: list, out) -> None:
    assert len(got) == 1 and got[0] == json.loads((out / "manifest.json").read_text())


def _records(out) -> dict[str, list[dict]]:
    manifest = json.loads((out / "manifest.json").read_text())
    return {split: read_split(out, split) for split in manifest["splits"]}


def test_counts_add_up_to_the_elements_that_came_in(written):
    manifest = json.loads((written / "manifest.json").read_text())
    assert manifest["counts"] == {"listed": 9, "written": 6, "failed": 3, "skipped": 0}
    assert manifest["failed_by_stage"] == {"decode": 1, "label": 1, "split": 1}
    assert list(manifest["splits"]) == list(SPLITS) and manifest["labels"] == LABELS
    assert {s: len(info["shards"]) for s, info in manifest["splits"].items()} == {s: 2 for s in SPLITS}
    records = _records(written)
    assert {s: len(r) for s, r in records.items()} == {
        s: info["num_examples"] for s, info in manifest["splits"].items()}
    assert (written / "labels.txt").read_text() == "cat\ndog\n"
    assert not (written / ".beam-prep").exists()


def test_each_failure_is_reported_by_name_and_stage(written):
    errors = [json.loads(line) for line in (written / "errors.jsonl").read_text().splitlines()]
    by_stage = {e["stage"]: e for e in errors}
    assert set(by_stage) == {"decode", "label", "split"}
    assert by_stage["decode"]["path"] == "memory/broken"
    assert by_stage["label"]["label"] == "horse" and by_stage["label"]["relpath"] == "cat/img_000.png"
    assert "'horse' is not in labels" in by_stage["label"]["message"]
    assert by_stage["split"]["relpath"] == "dog/img_001.png" and "'holdout'" in by_stage["split"]["message"]


def test_records_hold_the_labels_names_and_exact_pixels(written, tree):
    records = [r for split in _records(written).values() for r in split]
    names = sorted(r[features.FILENAME].decode() for r in records)
    assert names == ["cat/img_000.png", "cat/img_001.png", "cat/img_002.png",
                     "dog/img_000.png", "dog/img_001.png", "memory/dog/0.png"]
    for r in records:
        name = r[features.FILENAME].decode()
        assert r[features.LABEL_TEXT].decode() == name.split("/")[-2]
        assert r[features.LABEL] == LABELS.index(r[features.LABEL_TEXT].decode())
        source = picture(100, WIDTH, HEIGHT) if name.startswith("memory/") else Image.open(tree / name)
        np.testing.assert_array_equal(_pixels(r), np.asarray(source.convert("RGB")), err_msg=name)


def test_splits_are_the_elements_own_or_the_commands_stable_hash(written):
    for split, records in _records(written).items():
        for r in records:
            name = r[features.FILENAME].decode()
            assert split == ("test" if name.startswith("memory/") else split_for(name, 40)), name


def test_our_reader_reads_it(written):
    info = load_info(str(written))
    assert info.labels == tuple(LABELS) and info.splits["test"].num_examples == 1
    for split in SPLITS:
        n = 0
        for images, labels in make_dataset(str(written), split, batch_size=2, training=False):
            assert images.shape[1:] == (HEIGHT, WIDTH, 3)
            n += int(labels.shape[0])
        assert n == info.splits[split].num_examples


def test_the_commands_output_and_the_transforms_hold_the_same_records(tree, tmp_path):
    """Same images, same options, same root: the same keys, values (pixels included), splits
    and manifest sections, whichever way they were written."""
    options = {"image_size": 16, "validation_percent": 40, "max_pixels": 100000, "label_offset": 1}
    command_manifest = beam_prep.prepare(str(tree), str(tmp_path / "command"), **options,
                                         direct_running_mode="in_memory")
    with _pipeline() as p:
        _ = (p
             | beam.Create([(str(path), path.parent.name) for path in sorted(tree.glob("*/*.png"))])
             | WriteImageDataset(str(tmp_path / "transform"), command_manifest["labels"], root=str(tree),
                                 **options))
    transform_manifest = json.loads((tmp_path / "transform" / "manifest.json").read_text())
    assert transform_manifest.keys() == command_manifest.keys()
    for key in ("labels", "label_offset", "image", "compression", "features", "counts", "failed_by_stage"):
        assert transform_manifest[key] == command_manifest[key], key
    assert {s: (i["num_examples"], i["class_counts"]) for s, i in transform_manifest["splits"].items()} == \
        {s: (i["num_examples"], i["class_counts"]) for s, i in command_manifest["splits"].items()}
    for split in command_manifest["splits"]:
        by_name = [{r[features.FILENAME]: {k: v for k, v in r.items() if k != "shard"}
                    for r in read_split(tmp_path / kind, split)} for kind in ("command", "transform")]
        assert by_name[0] == by_name[1] and by_name[0]


def test_originals_are_kept_and_counted_as_the_command_does(tmp_path):
    """``image_format="original"`` through the transform: a JPEG path and JPEG bytes kept as they
    are, a PNG and a JPEG too large re-encoded, and the counts in the manifest."""
    kept = encode(picture(1, 40, 30), "JPEG", quality=88)
    (tmp_path / "kept.jpg").write_bytes(kept)
    elements = [(str(tmp_path / "kept.jpg"), "cat"), (kept, "dog", None, "memory/kept.jpg"),
                (encode(picture(2, 40, 30), "PNG"), "dog", None, "memory/drawing.png"),
                (encode(picture(3, 200, 100), "JPEG"), "cat", None, "memory/large.jpg")]
    out = tmp_path / "out"
    with _pipeline() as p:
        _ = p | beam.Create(elements) | WriteImageDataset(
            str(out), LABELS, root=str(tmp_path), image_size=50, resize_mode="shorter_side", no_upscale=True,
            image_format="original", num_shards=1)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["compression"] == "NONE"  # originals default to uncompressed shards, as the command's
    assert manifest["originals"] == {"kept": 2, "reencoded": 2,
                                     "reencoded_by_reason": {"not_jpeg": 1, "resized": 1}}
    records = {r[features.FILENAME]: r for r in read_split(out, "train")}
    assert records[b"kept.jpg"][features.ENCODED] == kept == records[b"memory/kept.jpg"][features.ENCODED]
    assert {r[features.FORMAT] for r in records.values()} == {b"jpeg"}
    assert (records[b"memory/large.jpg"][features.HEIGHT], records[b"memory/large.jpg"][features.WIDTH]) == (50, 100)


def test_an_existing_dataset_is_kept_unless_overwrite(tree, tmp_path):
    """Refused when applied; replaced with overwrite. The first run lets the runner choose
    the shard count, the second fixes it."""
    out = tmp_path / "out"
    cats = [(str(p), p.parent.name) for p in sorted(tree.glob("cat/*.png"))]
    with _pipeline() as p:
        _ = p | beam.Create(cats) | WriteImageDataset(str(out), LABELS, **EXACT)
    first = json.loads((out / "manifest.json").read_text())["splits"]["train"]["shards"]
    assert first and len(read_split(out, "train")) == 3
    with pytest.raises(OptionsError, match="already holds a dataset"):
        _ = _pipeline() | beam.Create(cats[:1]) | WriteImageDataset(str(out), LABELS, **EXACT)
    with _pipeline() as p:
        _ = p | beam.Create(cats[:2]) | WriteImageDataset(str(out), LABELS, overwrite=True, num_shards=3, **EXACT)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["written"] == 2 and len(read_split(out, "train")) == 2
    shards = manifest["splits"]["train"]["shards"]
    assert len(shards) == 3 and sorted(p.name for p in out.glob("*.tfrecord.gz")) == sorted(shards)


def test_a_run_holding_the_output_is_not_disturbed(tmp_path):
    out = tmp_path / "out"
    with claim_output(str(out)), pytest.raises(OutputBusy):
        _ = _pipeline() | beam.Create([(b"x", 0)]) | WriteImageDataset(str(out), LABELS, overwrite=True)


def test_an_element_of_the_wrong_shape_fails_the_job_with_its_reason(tmp_path):
    with pytest.raises(Exception, match=r"takes \(source, label\[, split\[, name\[, features\]\]\]\) elements"), \
            _pipeline() as p:
        _ = p | beam.Create(["just/a/path.png"]) | WriteImageDataset(str(tmp_path / "out"), LABELS)
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("arguments,message", [
    ({"labels": []}, "at least one label"),
    ({"labels": "cat"}, "labels is a list of names"),
    ({"labels": ["a", "a"]}, "lists 'a' more than once"),
    ({"labels": ["a\nb"]}, "line break"),
    ({"splits": ["train/x"]}, "cannot name shard files"),
    ({"splits": ["train;x"]}, "cannot name shard files"),  # the readers' rule (model.names): no word for a shell
    ({"splits": ["tr\u00e4in"]}, "cannot name shard files"),
    ({"splits": ["-train"]}, "cannot name shard files"),
    ({"splits": ["t" * 223]}, "at most 222 of them"),  # dali-<split>-00000-of-00001.tfrecord.idx: 255 bytes
    ({"splits": ["train", "Train"]}, r"each once \(in any case\)"),
    ({"validation_percent": 100}, r"validation_percent must be in \[0, 100\)"),
    ({"image_size": "big"}, "must be an int or HxW"),
    ({"resize_mode": "fit"}, "resize_mode must be one of"),
    ({"num_shards": -1}, "num_shards must be"),
    ({"compression": "zip"}, "compression must be one of"),
    ({"label_offset": 100}, r"label_offset must be in \[0, 16\]"),
    ({"labels_txt": "csv"}, "labels_txt must be one of"),
    ({"no_upscale": True}, "no_upscale applies to the size-keeping resize modes"),
    ({"image_format": "gif"}, "image_format must be one of jpeg, png, raw, original"),
    ({"extra_features": {"caption": "text"}}, "'caption' has kind 'text', not one of bytes, int64, float"),
    ({"extra_features": {"image/encoded": "bytes"}}, "'image/encoded' cannot be a feature of its own"),
])
def test_bad_arguments_are_refused_when_constructed(tmp_path, arguments, message):
    arguments = {"labels": LABELS, **arguments}
    with pytest.raises(OptionsError, match=message):
        WriteImageDataset(str(tmp_path / "out"), **arguments)
    assert not (tmp_path / "out").exists()


def test_paths_and_output_on_gs(gcs_server, tmp_path):
    """gs:// paths read by the command's GCS client, shards and manifest written to gs://."""
    make_tree(tmp_path / "tree", {"cat": 3, "dog": 2}, size=(WIDTH, HEIGHT))
    bucket = gcs_server.new_bucket()
    paths = bucket.upload_tree(tmp_path / "tree", "images")
    done = gcs_server.run(child("write_gs", bucket.url("images"), bucket.url("records"), "cat,dog", *paths),
                          cwd=REPO)
    manifest = json.loads(done.stdout.splitlines()[-1])
    assert manifest["counts"] == {"listed": 6, "written": 5, "failed": 1, "skipped": 0}
    (error,) = [json.loads(line) for line in bucket.read_bytes("records/errors.jsonl").decode().splitlines()]
    assert (error["path"], error["stage"]) == ("memory/broken", "decode")
    shards = manifest["splits"]["train"]["shards"]
    assert bucket.list_names("records/") == sorted(
        f"records/{name}" for name in [*shards, "errors.jsonl", "skipped.jsonl", "duplicates.jsonl", "flat.jsonl", "hashes-v1.tsv.gz", "labels.txt",
                                       "manifest.json", "README.md"])
    records = [features.decode_example(r) for name in shards
               for r in _framed(gzip.decompress(bucket.read_bytes(f"records/{name}")))]
    assert sorted((r[features.FILENAME].decode(), r[features.LABEL]) for r in records) == [
        ("cat/img_000.jpg", 0), ("cat/img_001.jpg", 0), ("cat/img_002.jpg", 0),
        ("dog/img_000.jpg", 1), ("dog/img_001.jpg", 1)]


def _framed(data: bytes) -> list[bytes]:
    """The records of an uncompressed TFRecord file (length, its CRC, data, its CRC)."""
    records, i = [], 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        records.append(data[i + 12:i + 12 + n])
        i += 16 + n
    return records


def test_label_lists_and_features_are_written_as_the_commands_metadata_writes_them(tree, tmp_path):
    """multi_label and extra_features: each element's list of labels and its features reach its record
    and the manifest; a feature of the wrong kind and an unknown label are failures of their element."""
    out = tmp_path / "out"
    cat, dog = str(tree / "cat" / "img_000.png"), str(tree / "dog" / "img_000.png")
    elements = [
        (cat, ["cat", "dog"], "train", None, {"caption": "both", "score": 2}),
        (dog, [1], "train", None, {"caption": "a dog", "score": 0.5}),
        (str(tree / "cat" / "img_001.png"), ["cat"], "train", None, {"caption": "bad", "score": "high"}),
        (str(tree / "cat" / "img_002.png"), ["cat", "horse"], "train", None, {"caption": "?", "score": 1}),
    ]
    with _pipeline() as p:
        _ = p | beam.Create(elements) | WriteImageDataset(
            str(out), LABELS, root=str(tree), multi_label=True, extra_features={"caption": "bytes", "score": "float"},
            **EXACT)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"] == {"listed": 4, "written": 2, "failed": 2, "skipped": 0}
    assert (manifest["multi_label"], manifest["extra_features"]) == (True, {"caption": "bytes", "score": "float"})
    assert manifest["splits"]["train"]["class_counts"] == {"cat": 1, "dog": 2}
    errors = {e["relpath"]: (e["stage"], e["message"]) for e in
              map(json.loads, (out / "errors.jsonl").read_text().splitlines())}
    assert errors == {"cat/img_001.png": ("features", "feature 'score' is 'high', not float"),
                      "cat/img_002.png": ("label", "label ['cat', 'horse'] is not in labels (2 names, indices 0-1)")}
    ds = make_dataset(str(out), "train", batch_size=None, training=False,
                      extra_keys=(features.FILENAME, "caption", "score"))
    got = {extra[features.FILENAME].numpy().decode(): (labels.numpy().tolist(), extra["caption"].numpy().decode(),
                                                       float(extra["score"].numpy()))
           for _, labels, extra in ds}
    assert got == {"cat/img_000.png": ([1.0, 1.0], "both", 2.0), "dog/img_000.png": ([0.0, 1.0], "a dog", 0.5)}
