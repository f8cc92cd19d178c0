"""``--append``: new images added to a dataset as its next version, the old records, shards and label
ids as they were.

The oracle: a dataset made in one run, with the same options, from the first tree and the files the
append wrote holds the same records (sha256, class name, split) as the appended one. Each test that
appends makes its own small tree and dataset in this process (``prepare_here``); those that append
nothing (refused, or nothing new) share one (``ants``). The command's exit codes and lines are taken
in this process too (``prepare_images.main``); it runs as a user's process only where it is killed
and resumed.
"""
from __future__ import annotations

import collections
import hashlib
import json
import pathlib
import shutil
import signal

import pytest
from helpers import encode, make_tree, prepare_here, read_split, run_prepare
from interrupts import ARGS as INTERRUPTED
from interrupts import WRITTEN_ARGS, dataset_digests, interrupt, photo_tree
from PIL import Image

import beam_prep
from beam_prep.errors import BeamPrepWarning, OptionsError
from pipelines import prepare_images

pytestmark = pytest.mark.slow  # every test runs a pipeline

ARGS = ("--image_size", "16", "--validation_percent", "30", "--num_shards", "2")


def digests(folder: pathlib.Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()}


def records(out: pathlib.Path, shards: list[str] | None = None) -> collections.Counter:
    """The dataset's records as (sha256, class name, split), ids read through labels.txt."""
    manifest = json.loads((out / "manifest.json").read_text())
    labels = (out / "labels.txt").read_text().splitlines()
    found = collections.Counter()
    for split in manifest["splits"]:
        for r in read_split(out, split):
            if shards is None or r["shard"] in shards:
                found[r["image/key/sha256"].decode(), labels[r["image/class/label"]], split] += 1
    return found


@pytest.fixture
def grown(tmp_path) -> dict[str, pathlib.Path]:
    """A dataset of circles and squares, then its tree grown as a user's does: a new class that sorts
    first, new images in an old class, a changed file, a removed file, and a copy of a validation
    image in a train folder. ``oracle``: the first tree with the files an append should write."""
    tree, out = tmp_path / "tree", tmp_path / "out"
    make_tree(tree, {"circles": 6, "squares": 6}, size=(24, 20))
    prepare_here("--input", str(tree), "--output", str(out), *ARGS)
    oracle = pathlib.Path(shutil.copytree(tree, tmp_path / "oracle"))
    make_tree(tmp_path / "new", {"aardvark": 3, "circles": 3}, size=(20, 24))
    for label in ("aardvark", "circles"):
        for i, image in enumerate(sorted((tmp_path / "new" / label).iterdir())):
            for root in (tree, oracle):
                (root / label).mkdir(exist_ok=True)
                shutil.copyfile(image, root / label / f"new_{i}.jpg")
    (tree / "circles" / "img_000.jpg").write_bytes(encode(Image.new("RGB", (24, 20), "red")))  # changed
    (tree / "squares" / "img_001.jpg").unlink()  # removed: its record stays
    validation = next(r for r in read_split(out, "validation"))["image/filename"].decode()
    shutil.copyfile(tree / validation, tree / "squares" / "leak.jpg")  # a copy of a validation image
    return {"tree": tree, "out": out, "oracle": oracle, "root": tmp_path, "validation": tree / validation}


def test_an_append_writes_what_the_dataset_lacks_as_version_2_and_keeps_the_rest(grown):
    out = grown["out"]
    # An --overwrite of the grown tree would give the old classes other ids: said, naming --append.
    with pytest.warns(BeamPrepWarning, match=r"other ids \('circles' 0 -> 1, 'squares' 1 -> 2\).*append=True"):
        beam_prep.prepare(str(grown["tree"]), str(out), overwrite=True, dry_run=True)
    before, version_1 = digests(out), records(out)
    manifest = prepare_here("--input", str(grown["tree"]), "--output", str(out), "--append")
    after = digests(out)
    # Old shards byte for byte; new ones named as no earlier one, found by train-*.
    assert {name: after[name] for name in before if name.endswith(".tfrecord.gz")} == \
        {name: d for name, d in before.items() if name.endswith(".tfrecord.gz")}
    new_shards = [s for split in manifest["versions"][-1]["splits"].values() for s in split["shards"]]
    assert sorted(set(after) - set(before)) == sorted(["changed.jsonl", *new_shards])
    assert {s.split("-v2-")[0] for s in new_shards} == {"train", "validation"}  # train-v2-...: train-* finds it
    # Ids kept, the new class after them, in every list of classes.
    assert (out / "labels.txt").read_text().splitlines() == ["circles", "squares", "aardvark"]
    assert manifest["labels"] == ["circles", "squares", "aardvark"]
    # The oracle: one run over the first tree and the new files, in the same label order.
    labels = grown["root"] / "labels.txt"
    labels.write_text("circles\nsquares\naardvark\n")
    prepare_here("--input", str(grown["oracle"]), "--output", str(grown["root"] / "union"), *ARGS,
                 "--labels_file", str(labels))
    assert records(out) == records(grown["root"] / "union")
    # Version 1 read after the append is version 1 read before it, record for record.
    v1 = manifest["versions"][0]
    assert records(out, [s for split in v1["splits"].values() for s in split["shards"]]) == version_1
    ds = beam_prep.make_dataset(str(out), "train", batch_size=None, training=False, version=1,
                                extra_keys=["image/key/sha256"])
    assert collections.Counter(e["image/key/sha256"].numpy().decode() for _, _, e in ds) == \
        collections.Counter(sha for (sha, _, split), n in version_1.items() if split == "train" for _ in range(n))
    # What it left out, said.
    latest = manifest["versions"][-1]
    assert (latest["version"], latest["input"], latest["num_labels"]) == (2, str(grown["tree"]), 3)
    assert latest["appended"] == {"new_labels": ["aardvark"], "unchanged": 10, "failed_before": 0, "copies": 1, "changed": 1,
                                  "gone": 1}
    changed = [json.loads(line) for line in (out / "changed.jsonl").read_text().splitlines()]
    assert [(row["change"], pathlib.Path(row["path"]).name) for row in changed] == [
        ("changed", "img_000.jpg"), ("copy", "leak.jpg"), ("gone", "img_001.jpg")]
    assert changed[1]["of"] == str(grown["validation"]) and changed[1]["of_split"] == "validation"
    skipped = (out / "skipped.jsonl").read_text()
    assert "copy of a record already in the dataset" in skipped and "leak.jpg" in skipped
    assert sum(s["num_examples"] for s in latest["splits"].values()) == 6
    assert manifest["counts"]["written"] == sum(s["num_examples"] for s in manifest["splits"].values()) == 18
    from beam_prep.tools.verification import verify

    assert verify(str(out)).ok


def test_a_new_batch_folder_in_each_format_is_read_by_every_reader_at_each_version(tmp_path):
    tree, batch = tmp_path / "tree", tmp_path / "batch"
    make_tree(tree, {"ant": 4, "bee": 4}, size=(24, 20))
    make_tree(batch, {"ant": 2, "cat": 2}, size=(20, 24))
    shutil.copyfile(tree / "bee" / "img_000.jpg", batch / "cat" / "copy.jpg")
    for file_format in ("array_record", "webdataset"):
        out = tmp_path / file_format
        prepare_here("--input", str(tree), "--output", str(out), "--image_size", "16", "--num_shards", "1",
                     "--file_format", file_format)
        first = digests(out)
        manifest = prepare_here("--input", str(batch), "--output", str(out), "--append")
        assert manifest["labels"] == ["ant", "bee", "cat"]
        assert manifest["versions"][1]["appended"]["copies"] == 1
        assert {n: digests(out)[n] for n in first if n.startswith("train-")} == \
            {n: d for n, d in first.items() if n.startswith("train-")}
        if file_format == "array_record":
            assert (len(beam_prep.data_source(out, version=1)), len(beam_prep.data_source(out))) == (8, 12)
            assert sorted(beam_prep.data_source(out).targets) == [0] * 6 + [1] * 4 + [2] * 2
        else:
            assert sum(1 for _ in beam_prep.webdataset_pipeline(out, version=1)) == 8
            assert sorted(label for _, label in beam_prep.webdataset_pipeline(out)) == [0] * 6 + [1] * 4 + [2] * 2


def test_an_append_to_a_dataset_made_before_versions(tmp_path):
    tree, batch, out = tmp_path / "tree", tmp_path / "batch", tmp_path / "out"
    make_tree(tree, {"ant": 3}, size=(24, 20))
    make_tree(batch, {"ant": 2}, size=(20, 24))
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", "16", "--num_shards", "1")
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["versions"]  # as beam-prep wrote it before versions
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    grown = prepare_here("--input", str(batch), "--output", str(out), "--append")
    assert [(v["version"], v["input"], sum(s["num_examples"] for s in v["splits"].values()))
            for v in grown["versions"]] == [(1, str(tree), 3), (2, str(batch), 2)]


@pytest.fixture(scope="module")
def ants(tmp_path_factory) -> dict[str, pathlib.Path]:
    """A dataset of two ants and a file that fails, shared by the tests that add nothing to it (each
    checks that it is left as it was)."""
    root = tmp_path_factory.mktemp("ants")
    tree, out = root / "tree", root / "out"
    make_tree(tree, {"ant": 2}, size=(24, 20))
    (tree / "ant" / "broken.jpg").write_bytes(b"not a jpeg")
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", "16")
    return {"tree": tree, "out": out}


@pytest.mark.parametrize("extra,message", [
    (("--overwrite",), r"adds to the dataset in .* replaces it: pass one of them$"),
    (("--image_size", "32"), r"image_size 32x32 contradicts the dataset in .*, made with 16x16: drop it"),
    (("--file_format", "webdataset"), r"file_format webdataset contradicts the dataset in .*, made with tfrecord"),
    (("--labels_file", "x.txt"), r"does not take .*labels_file: an append keeps the dataset's label ids"),
    (("--sink", "shuffle"), r"writes with the streaming sink of the local runners for now"),
])
def test_an_option_that_contradicts_the_dataset_is_refused_before_any_work(ants, extra, message):
    tree, out = ants["tree"], ants["out"]
    before = digests(out)
    with pytest.raises(OptionsError, match=message):
        prepare_here("--input", str(tree), "--output", str(out), "--append", *extra)
    assert digests(out) == before


def test_the_command_refuses_bad_appends_with_one_line_and_exit_2(ants, tmp_path, capfd):
    tree, out = ants["tree"], tmp_path / "out"
    shutil.copytree(ants["out"], out)
    manifest = (out / "manifest.json").read_text()
    cases = {
        "--output {} holds no beam-prep dataset to append to": (str(tmp_path / "none"), None),
        "--image_size 32x32 contradicts the dataset in": (str(out), ("--image_size", "32")),
        "has format_version 99; this beam-prep reads up to 1: upgrade beam-prep": (str(out), "newer"),
        "is not valid JSON": (str(out), "damaged"),
    }
    for expected, (output, extra) in cases.items():
        if extra == "newer":
            (out / "manifest.json").write_text(manifest.replace('"format_version": 1', '"format_version": 99'))
        elif extra == "damaged":
            (out / "manifest.json").write_text(manifest[:40])
        code = prepare_images.main(["--input", str(tree), "--output", output, "--append",
                                    *(extra if isinstance(extra, tuple) else ())])
        err = capfd.readouterr().err
        assert code == 2, (expected, err[-2000:])
        (line,) = [line for line in err.splitlines() if line.startswith("error:")]
        assert expected.format(tmp_path / "none") in line, (expected, line)
    assert not (tmp_path / "none").exists()


def test_two_appends_at_once_the_second_is_refused_naming_the_holder(ants, tmp_path):
    """The output's claim: an append holds it as any run does."""
    from beam_prep.write.run.claim import OutputBusy, claim_output

    out = ants["out"]
    before = digests(out)
    make_tree(tmp_path / "batch", {"bee": 1}, size=(24, 20))
    with claim_output(str(out), "20260101-000000-holder", heartbeat_s=None), \
            pytest.raises(OutputBusy, match=r"20260101-000000-holder"):
        prepare_here("--input", str(tmp_path / "batch"), "--output", str(out), "--append")
    assert digests(out) == before


def test_a_gs_batch_appended_to_a_gs_dataset(gcs_bucket, tmp_path):
    """Input and output on gs:// (the GCS test server): the old objects stay byte for byte."""
    make_tree(tmp_path / "tree", {"ant": 3}, size=(24, 20))
    make_tree(tmp_path / "batch", {"ant": 1, "bee": 2}, size=(20, 24))
    gcs_bucket.upload_tree(tmp_path / "tree", "tree")
    gcs_bucket.upload_tree(tmp_path / "batch", "batch")
    out = gcs_bucket.url("out")
    prepare_here("--input", gcs_bucket.url("tree"), "--output", out, "--image_size", "16", "--num_shards", "1")
    before = {name: gcs_bucket.read_bytes(name) for name in gcs_bucket.list_names("out/") if name.endswith(".gz")}
    manifest = prepare_here("--input", gcs_bucket.url("batch"), "--output", out, "--append")
    assert manifest["labels"] == ["ant", "bee"] and manifest["splits"]["train"]["num_examples"] == 6
    assert {name: gcs_bucket.read_bytes(name) for name in before} == before
    assert sorted(n for n in gcs_bucket.list_names("out/") if "/.beam-prep/" not in f"/{n}") == sorted(
        [*(f"out/{name}" for name in manifest["splits"]["train"]["shards"]), "out/changed.jsonl",
         "out/duplicates.jsonl", "out/errors.jsonl", "out/flat.jsonl", "out/labels.txt", "out/manifest.json", "out/skipped.jsonl"])


def test_an_append_of_nothing_new_makes_no_version_changes_nothing_and_tries_no_failed_file_again(ants):
    """The dataset's own input again: every file is in it, or failed before (not tried again)."""
    before = digests(ants["out"])
    with pytest.warns(BeamPrepWarning, match=r"^nothing to add to .* \(0 records added; 2 files already in it; "
                                             r"1 file that failed before, not tried again\): no version 2 made$"):
        beam_prep.prepare(str(ants["tree"]), str(ants["out"]), append=True, direct_running_mode="in_memory")
    assert digests(ants["out"]) == before


@pytest.fixture
def first_and_batch(tmp_path) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    """A first tree, a batch of new images (a new class that sorts first, more of an old one), and their
    union, the tree a dataset made in one run is made from (the oracle)."""
    tree, batch, union = tmp_path / "tree", tmp_path / "batch", tmp_path / "union"
    make_tree(tree, {"bee": 4, "cat": 4}, size=(24, 20))
    make_tree(batch, {"ant": 3, "cat": 3}, size=(20, 24))
    shutil.copytree(tree, union)
    for image in sorted(batch.rglob("*.jpg")):
        image = image.rename(image.parent / f"new_{image.name}")  # the union's relative paths: the same splits
        (union / image.parent.name).mkdir(exist_ok=True)
        shutil.copyfile(image, union / image.parent.name / image.name)
    return tree, batch, union


def test_tfds_builder_from_directory_reads_version_1_after_an_append(first_and_batch, tmp_path):
    import tensorflow_datasets as tfds

    tree, batch, _ = first_and_batch
    out = tmp_path / "out"
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", "16", "--validation_percent", "30",
                 "--compression", "none", "--num_shards", "1")
    first = records(out)
    tfds_files = {name: digest for name, digest in digests(out).items()
                  if name in ("dataset_info.json", "features.json", "image.class.label.labels.txt")}
    prepare_here("--input", str(batch), "--output", str(out), "--append")
    assert {name: digests(out)[name] for name in tfds_files} == tfds_files
    builder = tfds.builder_from_directory(str(out))
    names = builder.info.features["image/class/label"].names
    read = collections.Counter()
    for split in builder.info.splits:
        for ex in tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)):
            read[ex["image/key/sha256"].decode(), names[ex["image/class/label"]], split] += 1
    assert read == first


def test_hugging_face_reads_the_appended_webdataset_as_a_dataset_made_in_one_run(first_and_batch, tmp_path):
    from datasets import load_dataset

    tree, batch, union = first_and_batch
    common = ("--image_size", "16", "--validation_percent", "30", "--file_format", "webdataset")
    appended, whole = tmp_path / "appended", tmp_path / "whole"
    prepare_here("--input", str(tree), "--output", str(appended), *common)
    prepare_here("--input", str(batch), "--output", str(appended), "--append")
    labels = tmp_path / "labels.txt"
    labels.write_text((appended / "labels.txt").read_text())
    prepare_here("--input", str(union), "--output", str(whole), *common, "--labels_file", str(labels))

    def rows(out: pathlib.Path) -> collections.Counter:
        names = (out / "labels.txt").read_text().splitlines()
        splits = json.loads((out / "manifest.json").read_text())["splits"]
        hf = load_dataset("webdataset", data_files={split: str(out / f"{split}-*.tar") for split in splits},
                          cache_dir=str(tmp_path / "hf-cache"))
        return collections.Counter((row["json"]["sha256"], names[row["cls"]], split)
                                   for split in splits for row in hf[split])

    assert (appended / "labels.txt").read_text().splitlines() == ["bee", "cat", "ant"]
    assert rows(appended) == rows(whole)
    assert sum(rows(appended).values()) == 14


def test_an_append_killed_midway_leaves_version_1_whole_and_resumes_to_an_uninterrupted_ones_bytes(tmp_path):
    """kill -9 to the whole process group once two of the append's shards are written (``interrupts``):
    the output's files are version 1's, byte for byte; the same command resumes the append and ends
    with what an uninterrupted one writes."""
    batch = photo_tree(tmp_path / "photos")
    tree, out, reference = tmp_path / "tree", tmp_path / "out", tmp_path / "reference"
    make_tree(tree, {"ant": 3, "eel": 2}, size=(64, 48))
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", "48")
    shutil.copytree(out, reference)
    version_1 = digests(out)
    prepare_here("--input", str(batch), "--output", str(reference), "--append", *WRITTEN_ARGS)
    killed, _, _ = interrupt(batch, out, signal.SIGKILL, "--append", whole_group=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert digests(out) == version_1
    again = run_prepare("--input", str(batch), "--output", str(out), *INTERRUPTED, "--append")
    assert again.returncode == 0 and "resuming run" in again.stderr, again.stderr[-3000:]
    assert dataset_digests(out) == dataset_digests(reference)
    assert json.loads((out / "manifest.json").read_text())["labels"] == ["ant", "eel", "bee", "cat", "dog"]


def test_a_new_class_whose_files_are_all_copies_gets_no_id(ants, tmp_path):
    out, batch = ants["out"], tmp_path / "batch"
    before = digests(out)
    (batch / "zebra").mkdir(parents=True)
    shutil.copyfile(ants["tree"] / "ant" / "img_000.jpg", batch / "zebra" / "copy.jpg")
    with pytest.warns(BeamPrepWarning, match=r"\(0 records added; 1 copies of records already in it, not written\)"):
        beam_prep.prepare(str(batch), str(out), append=True, direct_running_mode="in_memory")
    assert (out / "labels.txt").read_text().splitlines() == ["ant"]
    assert digests(out) == before


def test_a_stratified_dataset_shares_out_the_new_batchs_validation_images_per_label(tmp_path):
    tree, batch, out = tmp_path / "tree", tmp_path / "batch", tmp_path / "out"
    make_tree(tree, {"ant": 4, "bee": 4}, size=(24, 20))
    make_tree(batch, {"ant": 4, "cat": 6}, size=(20, 24))
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", "16", "--validation_percent", "50",
                 "--stratify")
    manifest = prepare_here("--input", str(batch), "--output", str(out), "--append")
    added = manifest["versions"][1]["splits"]
    assert added["validation"]["class_counts"] == {"ant": 2, "bee": 0, "cat": 3}
    assert added["train"]["class_counts"] == {"ant": 2, "bee": 0, "cat": 3}


def test_an_append_after_another_stopped_while_publishing_makes_the_version_after_it(tmp_path):
    """Append A killed once its publication is recorded, then append B of other images: B finishes A's
    publication first (version 2), then makes version 3, not a second version 2."""
    import os

    from beam_prep.write.finish import publication

    tree, out = tmp_path / "tree", tmp_path / "out"
    make_tree(tree, {"ant": 2}, size=(24, 20))
    make_tree(tmp_path / "a", {"bee": 2}, size=(20, 24))
    make_tree(tmp_path / "b", {"cat": 3}, size=(28, 24))
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", "16")
    killed = run_prepare("--input", str(tmp_path / "a"), "--output", str(out), "--append",
                         "--direct_running_mode", "in_memory", env={**os.environ, publication.KILL_VARIABLE: "8"})
    assert killed.returncode == -signal.SIGKILL and list(out.glob(f".beam-prep/*/{publication.RECORD}"))
    manifest = prepare_here("--input", str(tmp_path / "b"), "--output", str(out), "--append")
    assert [(v["version"], pathlib.Path(v["input"]).name) for v in manifest["versions"]] == [
        (1, "tree"), (2, "a"), (3, "b")]
    assert manifest["labels"] == ["ant", "bee", "cat"]
    assert sorted(p.name for p in out.glob("train-*")) == [
        "train-00000-of-00001.tfrecord.gz", "train-v2-00000-of-00001.tfrecord.gz", "train-v3-00000-of-00001.tfrecord.gz"]
