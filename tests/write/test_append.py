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
import contextlib
import hashlib
import json
import os
import pathlib
import shutil
import signal

import pytest
from helpers import encode, make_tree, prepare_here, read_split, run_prepare
from interrupts import ARGS as INTERRUPTED
from interrupts import WRITTEN_ARGS, dataset_digests, interrupt, photo_tree
from PIL import Image

import beam_prep
from beam_prep.errors import BeamPrepWarning, DatasetError, OptionsError
from beam_prep.write.shared.entry import printable
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
    assert sorted(set(after) - set(before)) == sorted(["changed.jsonl", "hashes-v2.tsv.gz", "stamps-v2.tsv.gz",
                                                       *new_shards])
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
    assert latest["appended"] == {"new_labels": ["aardvark"], "unchanged": 10, "failed_before": 0, "skipped_before": 0,
                                  "copies": 1, "changed": 1,
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
         "out/duplicates.jsonl", "out/errors.jsonl", "out/flat.jsonl", "out/labels.txt", "out/manifest.json", "out/skipped.jsonl",
         "out/hashes-v1.tsv.gz", "out/hashes-v2.tsv.gz", "out/README.md", "out/stamps-v1.tsv.gz",
         "out/stamps-v2.tsv.gz"])


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


UNION_ARGS = ("--image_size", "16", "--validation_percent", "30", "--num_shards", "1")


def one_run_over_the_union(union: pathlib.Path, appended: pathlib.Path, root: pathlib.Path) -> collections.Counter:
    """The oracle's records: one run over ``union``, its labels in the appended dataset's order."""
    labels = root / "union-labels.txt"
    labels.write_text((appended / "labels.txt").read_text())
    prepare_here("--input", str(union), "--output", str(root / "whole"), *UNION_ARGS, "--labels_file", str(labels))
    return records(root / "whole")


def test_an_append_with_the_shuffle_sink_holds_the_records_of_one_run_over_the_union(first_and_batch, tmp_path):
    tree, batch, union = first_and_batch
    out = tmp_path / "out"
    prepare_here("--input", str(tree), "--output", str(out), *UNION_ARGS)
    before = {name: d for name, d in digests(out).items() if name.endswith(".tfrecord.gz")}
    manifest = prepare_here("--input", str(batch), "--output", str(out), "--append", "--sink", "shuffle")
    assert {name: digests(out)[name] for name in before} == before
    assert sorted(n for s in manifest["versions"][1]["splits"].values() for n in s["shards"]) == [
        "train-v2-00000-of-00001.tfrecord.gz", "validation-v2-00000-of-00001.tfrecord.gz"]
    assert records(out) == one_run_over_the_union(union, out, tmp_path)
    assert sum(records(out).values()) == 14


@pytest.mark.parametrize("sink", ["shuffle", "streaming"])
def test_an_append_on_a_runner_whose_workers_never_see_the_launchers_disk(first_and_batch, gcs_bucket, tmp_path,
                                                                          sink):
    """gs:// in and out, the job run where an empty tmpfs hides the launcher's temporary folder
    (``separate_disk``, as Dataflow's workers see none of it): the old objects stay byte for byte and the
    dataset holds the records of one run over the union."""
    if os.geteuid() != 0:
        pytest.skip("the separate workers' mount namespace and tmpfs need root")
    from children.separate_disk import RUNNER

    tree, batch, union = first_and_batch
    gcs_bucket.upload_tree(tree, "tree")
    gcs_bucket.upload_tree(batch, "batch")
    out = gcs_bucket.url("out")
    prepare_here("--input", gcs_bucket.url("tree"), "--output", out, *UNION_ARGS)
    before = {name: gcs_bucket.read_bytes(name) for name in gcs_bucket.list_names("out/") if name.endswith(".gz")}
    manifest = prepare_here("--input", gcs_bucket.url("batch"), "--output", out, "--append", "--runner", RUNNER,
                            "--sink", sink)
    assert {name: gcs_bucket.read_bytes(name) for name in before} == before
    assert manifest["versions"][1]["input"] == gcs_bucket.url("batch")
    here = tmp_path / "here"
    for name in gcs_bucket.list_names("out/"):
        if "/.beam-prep/" not in f"/{name}":
            (here / name).parent.mkdir(parents=True, exist_ok=True)
            (here / name).write_bytes(gcs_bucket.read_bytes(name))
    assert records(here / "out") == one_run_over_the_union(union, here / "out", tmp_path)
    assert sum(records(here / "out").values()) == 14
    assert not [name for name in gcs_bucket.list_names("out/.beam-prep/") if not name.endswith("/claim")]


def test_a_remote_dry_run_of_an_append_with_nothing_new_says_so_and_builds_no_job(gcs_bucket, tmp_path):
    from children.separate_disk import RUNNER

    make_tree(tmp_path / "tree", {"ant": 2}, size=(24, 20))
    gcs_bucket.upload_tree(tmp_path / "tree", "tree")
    out = gcs_bucket.url("out")
    prepare_here("--input", gcs_bucket.url("tree"), "--output", out, "--image_size", "16")
    before = {name: gcs_bucket.read_bytes(name) for name in gcs_bucket.list_names("out/")}
    with pytest.warns(BeamPrepWarning, match=r"^nothing to add to .* \(0 records added; 2 files already in it\)"):
        assert prepare_here("--input", gcs_bucket.url("tree"), "--output", out, "--append", "--runner", RUNNER,
                            "--dry_run=True") is None
    assert {name: gcs_bucket.read_bytes(name) for name in gcs_bucket.list_names("out/")} == before


def test_write_image_dataset_appends_as_the_command_does(first_and_batch, tmp_path):
    """A user's pipeline adds the batch with ``WriteImageDataset(..., append=True)``: the dataset's options,
    its ids kept (an int label indexes the labels given, not the ids), new shards ``-v2``, version 2 in the
    manifest, and the records of one run over the union."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_prep.write.run.pipeline import local_runner

    tree, batch, union = first_and_batch
    out = tmp_path / "out"
    prepare_here("--input", str(tree), "--output", str(out), *UNION_ARGS)
    before = {name: d for name, d in digests(out).items() if name.endswith(".tfrecord.gz")}
    labels = ["cat", "ant"]  # the batch's, in the user's order: "ant" is new, "cat" keeps its id
    elements = [(str(p), p.parent.name if i % 2 else labels.index(p.parent.name))
                for i, p in enumerate(sorted(batch.rglob("*.jpg")))]
    options = PipelineOptions([], direct_running_mode="in_memory")
    with beam.Pipeline(runner=local_runner(options), options=options) as p:
        _ = (p | beam.Create(elements)
             | beam_prep.WriteImageDataset(str(out), labels, root=str(batch), append=True))
    manifest = json.loads((out / "manifest.json").read_text())
    assert {name: digests(out)[name] for name in before} == before
    latest = manifest["versions"][-1]
    assert (latest["version"], latest["input"], latest["appended"]["new_labels"]) == (2, str(batch), ["ant"])
    assert {s for split in latest["splits"].values() for s in split["shards"]} == {
        "train-v2-00000-of-00001.tfrecord.gz", "validation-v2-00000-of-00001.tfrecord.gz"}
    assert (out / "labels.txt").read_text().splitlines() == ["bee", "cat", "ant"]
    assert records(out) == one_run_over_the_union(union, out, tmp_path)
    assert sum(records(out).values()) == 14
    assert (manifest["options"]["height"], manifest["compression"]) == (16, "GZIP")


@pytest.mark.parametrize("action", ["report", "drop"])
def test_write_image_dataset_leaves_out_copies_of_the_datasets_records_as_the_command_does(first_and_batch, tmp_path,
                                                                                          action):
    """A batch holding a copy of a train record (filed to train) and one of a validation record (filed to
    train too): the transform writes neither, as ``prepare --append`` of the same batch does not: each is
    named in skipped.jsonl as a copy of the record, counted as the command counts it, and no duplicate or
    leak is reported of it; an element at a record's own path is that record, unchanged. The dataset is
    the command's, record for record, and version 1's shards stay as they were."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_prep.tools.verification import verify
    from beam_prep.write.grow.append import COPY_REASON
    from beam_prep.write.run.pipeline import local_runner

    tree, batch, _ = first_and_batch
    out, by_command = tmp_path / "out", tmp_path / "by_command"
    prepare_here("--input", str(tree), "--output", str(out), *UNION_ARGS)
    shutil.copytree(out, by_command)
    copied = {}
    for split, folder in (("train", "cat"), ("validation", "bee")):
        record = tree / read_split(out, split)[0]["image/filename"].decode()
        (batch / folder).mkdir(exist_ok=True)
        copied[str(batch / folder / f"copy_of_{split}.jpg")] = str(record)
        shutil.copyfile(record, batch / folder / f"copy_of_{split}.jpg")
    before = {name: d for name, d in digests(out).items() if name.endswith(".tfrecord.gz")}
    command = prepare_here("--input", str(batch), "--output", str(by_command), "--append",
                           "--cross_split_duplicates", action)
    own = tree / read_split(out, "train")[0]["image/filename"].decode()  # a record's own file
    elements = [(str(p), p.parent.name, "train" if str(p) in copied else None) for p in sorted(batch.rglob("*.jpg"))]
    options = PipelineOptions([], direct_running_mode="in_memory")
    with beam.Pipeline(runner=local_runner(options), options=options) as p:
        _ = (p | beam.Create([*elements, (str(own), own.parent.name)])
             | beam_prep.WriteImageDataset(str(out), ["cat", "ant", "bee"], root=str(batch), append=True,
                                           cross_split_duplicates=action))
    manifest = json.loads((out / "manifest.json").read_text())
    assert {name: digests(out)[name] for name in before} == before
    assert records(out) == records(by_command)
    assert sum(records(out).values()) == 14
    mine, theirs = manifest["versions"][-1], command["versions"][-1]
    assert mine["appended"] == {**theirs["appended"], "unchanged": 1}
    assert (mine["appended"]["copies"], mine["splits"]) == (2, theirs["splits"])
    assert (manifest["counts"], manifest["skipped_by_reason"]) == (command["counts"], command["skipped_by_reason"])
    assert manifest["duplicates"] == command["duplicates"]  # neither copy is a duplicate, nor a leak
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert {s["path"]: (s["reason"], s["duplicate_of"]) for s in skipped} == {
        path: (COPY_REASON, record) for path, record in copied.items()}
    assert [json.loads(line)["path"] for line in (by_command / "skipped.jsonl").read_text().splitlines()] == \
        sorted(copied)
    changed = [json.loads(line) for line in (out / "changed.jsonl").read_text().splitlines()]
    assert {(c["change"], c["path"], c["of"]) for c in changed} == {("copy", path, record)
                                                                   for path, record in copied.items()}
    assert verify(str(out)).ok


def test_write_image_dataset_publishes_nothing_if_another_append_made_its_version_meanwhile(first_and_batch,
                                                                                             tmp_path):
    """The transform's claim is not held while the pipeline runs: an append published meanwhile (version 2)
    fails the transform's manifest step, which would name a second version 2, and nothing of it is published."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_prep.errors import DatasetError
    from beam_prep.write.run.pipeline import local_runner

    tree, batch, _ = first_and_batch
    out = tmp_path / "out"
    prepare_here("--input", str(tree), "--output", str(out), *UNION_ARGS)
    elements = [(str(p), p.parent.name) for p in sorted(batch.rglob("*.jpg"))]
    options = PipelineOptions([], direct_running_mode="in_memory")
    p = beam.Pipeline(runner=local_runner(options), options=options)
    _ = p | beam.Create(elements) | beam_prep.WriteImageDataset(str(out), ["ant", "cat"], root=str(batch),
                                                                 append=True)
    make_tree(tmp_path / "other", {"bee": 1}, size=(28, 24))
    prepare_here("--input", str(tmp_path / "other"), "--output", str(out), "--append")
    published = digests(out)
    with pytest.raises(DatasetError, match=r"became version 2 while this append made version 2"):
        p.run().wait_until_finish()
    assert digests(out) == published
    assert [v["version"] for v in json.loads((out / "manifest.json").read_text())["versions"]] == [1, 2]


@pytest.mark.parametrize("arguments,message", [
    ({"image_size": 32}, r"^image_size 32x32 contradicts the dataset in .*, made with 16x16: drop it"),
    ({"file_format": "webdataset"}, r"^file_format webdataset contradicts the dataset in .*, made with tfrecord"),
    ({"overwrite": True}, r"^append adds to the dataset in output and overwrite replaces it: pass one of them$"),
    ({"multi_label": True}, r"^the dataset in .* holds other records \(multi_label=False"),
])
def test_write_image_dataset_refuses_an_append_that_contradicts_the_dataset_before_any_work(ants, arguments,
                                                                                           message):
    import apache_beam as beam

    before = digests(ants["out"])
    with pytest.raises(OptionsError, match=message):
        _ = beam.Pipeline() | beam.Create([]) | beam_prep.WriteImageDataset(str(ants["out"]), ["ant"], append=True,
                                                                             **arguments)
    assert digests(ants["out"]) == before


def test_write_image_dataset_refuses_an_append_to_no_dataset_or_a_capped_one(capped, tmp_path):
    import apache_beam as beam

    for output, message in ((tmp_path / "none", r"^output .* holds no beam-prep dataset to append to"),
                            (capped["out"], r"made with max_per_class 10, which chooses among all the files at "
                                            r"once .*: append with beam_prep.prepare\(..., append=True\)$")):
        with pytest.raises(OptionsError, match=message):
            _ = beam.Pipeline() | beam.Create([]) | beam_prep.WriteImageDataset(str(output), ["ant"], append=True)
    assert not (tmp_path / "none").exists()


def test_tfds_builder_from_directory_reads_each_version_and_the_new_class_after_an_append(first_and_batch, tmp_path):
    """TFDS's metadata is written again: the new class at its id, and each version's additions a TFDS split
    named as its shards (``train-v2``) whose template and shard count find every one of them; the whole latest
    split (``beam_prep.tfds_split``) reads as the dataset made in one run, version 1 as it read before."""
    import tensorflow_datasets as tfds

    tree, batch, union = first_and_batch
    out, whole = tmp_path / "out", tmp_path / "whole"
    common = ("--image_size", "16", "--validation_percent", "30", "--compression", "none", "--num_shards", "1")
    prepare_here("--input", str(tree), "--output", str(out), *common)

    def read(folder: pathlib.Path, version: int | None = None) -> collections.Counter:
        builder = tfds.builder_from_directory(str(folder))
        names = builder.info.features["image/class/label"].names
        found = collections.Counter()
        for split in json.loads((folder / "manifest.json").read_text())["splits"]:
            with contextlib.suppress(DatasetError):  # a split the version lacks
                spec = beam_prep.tfds_split(folder, split, version)
                for ex in tfds.as_numpy(builder.as_dataset(split=spec, shuffle_files=False)):
                    found[ex["image/key/sha256"].decode(), names[ex["image/class/label"]], split] += 1
        return found

    first = read(out)
    manifest = prepare_here("--input", str(batch), "--output", str(out), "--append", "--num_shards", "2")
    labels = tmp_path / "labels.txt"
    labels.write_text("bee\ncat\nant\n")
    prepare_here("--input", str(union), "--output", str(whole), *common, "--labels_file", str(labels))
    builder = tfds.builder_from_directory(str(out))
    label = builder.info.features["image/class/label"]
    assert (label.num_classes, label.names) == (3, ["bee", "cat", "ant"])
    # One TFDS split a version's additions to a split, its template and shard count naming exactly its shards.
    expected = {(split if v["version"] == 1 else f"{split}-v{v['version']}"): added["shards"]
                for v in manifest["versions"] for split, added in v["splits"].items() if added["shards"]}
    assert {name: [pathlib.Path(f).name for f in info.filenames] for name, info in builder.info.splits.items()} \
        == expected
    assert max(len(shards) for shards in expected.values()) == 2
    assert beam_prep.tfds_split(out, "train") == "train+train-v2"
    assert read(out) == records(whole) == records(out)
    assert read(out, version=1) == first
    assert sum(read(out).values()) == 14


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


@pytest.mark.parametrize("repeated", [(), ("--stratify",)])
def test_a_stratified_dataset_shares_out_the_new_batchs_validation_images_per_label(tmp_path, repeated):
    """The dataset's --stratify, given again or not: its --validation_percent is the dataset's, not asked for."""
    tree, batch, out = tmp_path / "tree", tmp_path / "batch", tmp_path / "out"
    make_tree(tree, {"ant": 4, "bee": 4}, size=(24, 20))
    make_tree(batch, {"ant": 4, "cat": 6}, size=(20, 24))
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", "16", "--validation_percent", "50",
                 "--stratify")
    manifest = prepare_here("--input", str(batch), "--output", str(out), "--append", *repeated)
    added = manifest["versions"][1]["splits"]
    assert added["validation"]["class_counts"] == {"ant": 2, "bee": 0, "cat": 3}
    assert added["train"]["class_counts"] == {"ant": 2, "bee": 0, "cat": 3}


def test_a_stratified_append_shares_out_validation_among_each_labels_new_files_alone(tmp_path):
    """The first run's tree grown and given again: each label's validation share is of its new files
    (the ones of lowest split hash among them), whatever the old files' hashes; --help says so."""
    from beam_prep.write.plan.selection import validation_count
    from beam_prep.write.shared.hashing import split_and_cap_hashes

    tree, out = tmp_path / "tree", tmp_path / "out"
    make_tree(tree, {"ant": 4, "bee": 4}, size=(24, 20))
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", "16", "--validation_percent", "50",
                 "--stratify")
    make_tree(tmp_path / "new", {"ant": 5, "bee": 3}, size=(20, 24))
    new = {}
    for image in sorted((tmp_path / "new").rglob("*.jpg")):
        relpath = f"{image.parent.name}/new_{image.name}"
        shutil.copyfile(image, tree / relpath)
        new.setdefault(image.parent.name, []).append(relpath)
    manifest = prepare_here("--input", str(tree), "--output", str(out), "--append")
    added = manifest["versions"][1]["splits"]
    assert added["validation"]["class_counts"] == {label: validation_count(len(files), 50)
                                                   for label, files in new.items()} == {"ant": 3, "bee": 2}
    validation = sorted(r["image/filename"].decode() for r in read_split(out, "validation")
                        if r["shard"] in added["validation"]["shards"])
    assert validation == sorted(path for files in new.values()
                                for path in sorted(files, key=lambda p: split_and_cap_hashes(p)[0])
                                [:validation_count(len(files), 50)])
    assert "With --append, among each label's new files alone." in " ".join(
        prepare_images.parser().format_help().split())


@pytest.fixture(scope="module")
def capped(tmp_path_factory) -> dict[str, pathlib.Path]:
    """A dataset made with --max_per_class 10 from 8 ants and 12 bees (2 bees skipped over the cap)."""
    root = tmp_path_factory.mktemp("capped")
    tree, out = root / "tree", root / "out"
    make_tree(tree, {"ant": 8, "bee": 12}, size=(24, 20))
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", "16", "--max_per_class", "10")
    return {"root": root, "tree": tree, "out": out}


def test_max_per_class_counts_the_records_the_dataset_holds(capped, tmp_path):
    """8 ants and a cap of 10: 2 of 5 new ants (those of lowest cap hash); 10 bees: none of 3 new ones (nor
    the 2 skipped in version 1, listed again); a new class: 10 of 12. The cap holds over the whole dataset."""
    from beam_prep.write.shared.hashing import split_and_cap_hashes

    out = pathlib.Path(shutil.copytree(capped["out"], tmp_path / "out"))
    tree = pathlib.Path(shutil.copytree(capped["tree"], tmp_path / "tree"))
    make_tree(tmp_path / "new", {"ant": 5, "bee": 3, "cat": 12}, size=(20, 24))
    for image in sorted((tmp_path / "new").rglob("*.jpg")):
        (tree / image.parent.name).mkdir(exist_ok=True)
        shutil.copyfile(image, tree / image.parent.name / f"new_{image.name}")
    manifest = prepare_here("--input", str(tree), "--output", str(out), "--append")
    latest = manifest["versions"][1]
    assert latest["splits"]["train"]["class_counts"] == {"ant": 2, "bee": 0, "cat": 10}
    assert manifest["splits"]["train"]["class_counts"] == {"ant": 10, "bee": 10, "cat": 10}
    new_ants = sorted(r["image/filename"].decode() for r in read_split(out, "train")
                      if r["shard"] in latest["splits"]["train"]["shards"] and r["image/filename"].startswith(b"ant/"))
    assert new_ants == sorted(sorted((f"ant/new_img_{i:03d}.jpg" for i in range(5)),
                                     key=lambda p: (split_and_cap_hashes(p)[1], p))[:2])
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    over = collections.Counter(pathlib.Path(row["path"]).parent.name for row in skipped
                               if row["reason"] == "over --max_per_class")
    assert over == {"ant": 3, "bee": 2 + 2 + 3, "cat": 2}  # version 1's two bees, then this version's lines


@pytest.mark.parametrize("made_with,given,message", [
    (("--max_per_class", "10"), ("--max_per_class", "20"), r"max_per_class 20 contradicts the dataset in .*, "
                                                           r"made with 10: drop it"),
    ((), ("--max_per_class", "5"), r"max_per_class 5 contradicts the dataset in .*, made with none: drop it"),
])
def test_another_max_per_class_is_refused_before_any_work(capped, ants, made_with, given, message):
    dataset = capped if made_with else ants
    before = digests(dataset["out"])
    with pytest.raises(OptionsError, match=message):
        prepare_here("--input", str(dataset["tree"]), "--output", str(dataset["out"]), "--append", *given)
    assert digests(dataset["out"]) == before


def test_a_shuffle_sink_append_killed_while_publishing_is_finished_by_the_same_command(tmp_path):
    """kill -9 once the publication is recorded: version 1 reads whole (its manifest as it was), and the
    same command finishes the publication: version 2 once, not a version 3."""
    from beam_prep.write.finish import publication

    tree, batch, out = tmp_path / "tree", tmp_path / "batch", tmp_path / "out"
    make_tree(tree, {"ant": 3}, size=(24, 20))
    make_tree(batch, {"bee": 3}, size=(20, 24))
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", "16")
    version_1 = digests(out)
    args = ("--input", str(batch), "--output", str(out), "--append", "--sink", "shuffle",
            "--direct_running_mode", "in_memory")
    # Staged: errors, skipped, duplicates, flat, labels, the kept hash and stamp files, changed, the card,
    # the manifest (steps 1-10); then the record (11).
    killed = run_prepare(*args, env={**os.environ, publication.KILL_VARIABLE: "11"})
    assert killed.returncode == -signal.SIGKILL and list(out.glob(f".beam-prep/*/{publication.RECORD}"))
    assert digests(out)["manifest.json"] == version_1["manifest.json"]
    again = run_prepare(*args)
    assert again.returncode == 0 and "stopped while it published" in again.stderr, again.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(v["version"], sum(s["num_examples"] for s in v["splits"].values())) for v in manifest["versions"]] == [
        (1, 3), (2, 3)]
    assert {name: digests(out)[name] for name in version_1 if name.endswith(".tfrecord.gz")} == \
        {name: d for name, d in version_1.items() if name.endswith(".tfrecord.gz")}


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
                         "--direct_running_mode", "in_memory", env={**os.environ, publication.KILL_VARIABLE: "11"})
    assert killed.returncode == -signal.SIGKILL and list(out.glob(f".beam-prep/*/{publication.RECORD}"))
    manifest = prepare_here("--input", str(tmp_path / "b"), "--output", str(out), "--append")
    assert [(v["version"], pathlib.Path(v["input"]).name) for v in manifest["versions"]] == [
        (1, "tree"), (2, "a"), (3, "b")]
    assert manifest["labels"] == ["ant", "bee", "cat"]
    assert sorted(p.name for p in out.glob("train-*")) == [
        "train-00000-of-00001.tfrecord.gz", "train-v2-00000-of-00001.tfrecord.gz", "train-v3-00000-of-00001.tfrecord.gz"]


def test_each_report_names_a_file_once_across_versions_and_the_counts_add_up(tmp_path):
    """The same tree appended twice as it grows: a file skipped or failed in version 1, or found a copy in
    version 2, is named once in skipped.jsonl or errors.jsonl, counted in each later version as done before;
    the manifest's counts are the reports' lines, and every file found each time is counted once."""
    tree, out = tmp_path / "tree", tmp_path / "out"
    make_tree(tree, {"ant": 3, "bee": 2}, size=(24, 20))
    (tree / "ant" / "notes.txt").write_text("not an image")
    (tree / "bee" / os.fsdecode(b"broken\xff.jpg")).write_bytes(b"not a jpeg")  # named as no UTF-8 is
    found = [7]  # the files each run finds in the tree

    def grow(size: tuple[int, int], *extra: pathlib.Path) -> None:
        batch = tmp_path / f"batch{size[0]}"
        for image in make_tree(batch, {"ant": 1, "cat": 1}, size=size):
            shutil.copyfile(image, tree / image.parent.name / f"new{size[0]}_{image.name}")
        found.append(found[-1] + 2 + len(extra))

    prepare_here("--input", str(tree), "--output", str(out), "--image_size", "16", "--validation_percent", "30")
    (tree / "cat").mkdir()
    shutil.copyfile(tree / "ant" / "img_000.jpg", tree / "cat" / "copy.jpg")  # a copy, found in version 2
    (tree / "bee" / "more.txt").write_text("not an image either")
    grow((20, 24), tree / "cat" / "copy.jpg", tree / "bee" / "more.txt")
    prepare_here("--input", str(tree), "--output", str(out), "--append")
    (tree / "ant" / "img_001.jpg").write_bytes(encode(Image.new("RGB", (24, 20), "blue")))  # changed
    grow((28, 20))
    manifest = prepare_here("--input", str(tree), "--output", str(out), "--append")

    def paths(report: str) -> collections.Counter:
        lines = (out / report).read_text().splitlines()
        return collections.Counter(pathlib.Path(json.loads(line)["path"]).relative_to(tree).as_posix()
                                   for line in lines)

    skipped, failed = paths("skipped.jsonl"), paths("errors.jsonl")
    assert skipped == collections.Counter(["ant/notes.txt", "bee/more.txt", "cat/copy.jpg"])
    assert failed == collections.Counter(["bee/broken\\xff.jpg"])
    counts = manifest["counts"]
    assert (counts["skipped"], counts["failed"]) == (3, 1)
    assert sum(manifest["skipped_by_reason"].values()) == 3
    assert counts["written"] == sum(s["num_examples"] for s in manifest["splits"].values()) == \
        sum(s["num_examples"] for v in manifest["versions"] for s in v["splits"].values()) == 9
    assert counts["listed"] == counts["written"] + counts["failed"]
    appended = [v["appended"] for v in manifest["versions"][1:]]
    assert [(a["unchanged"], a["failed_before"], a["skipped_before"], a["copies"], a["changed"]) for a in appended] \
        == [(5, 1, 1, 1, 0), (6, 1, 3, 0, 1)]
    before = sum(a[key] for a in appended for key in ("unchanged", "failed_before", "skipped_before", "changed"))
    assert counts["listed"] + counts["skipped"] + before == sum(found)
    # Every file in the tree is a record's source, or in a report.
    sources = {r["image/filename"].decode() for split in manifest["splits"] for r in read_split(out, split)}
    changed = {pathlib.Path(json.loads(line)["path"]).relative_to(tree).as_posix()
               for line in (out / "changed.jsonl").read_text().splitlines()}
    in_tree = {printable(p.relative_to(tree).as_posix()) for p in tree.rglob("*") if p.is_file()}
    assert in_tree == sources | set(skipped) | set(failed) | changed
    assert changed == {"ant/img_001.jpg"}


def test_records_named_with_bytes_no_utf8_spells_are_found_again_changed_and_copied(tmp_path):
    """A record's source named with bytes no UTF-8 spells is the dataset's (not new, nor gone) when the same
    tree is appended, then reported as changed; a copy so named is reported: each as messages name it."""
    tree, out = tmp_path / "tree", tmp_path / "out"
    make_tree(tree, {"ant": 3}, size=(24, 20))
    odd = os.fsencode(str(tree / "ant")) + b"/caf\xe9.jpg"
    with open(odd, "wb") as f:
        f.write(encode(Image.effect_noise((24, 20), 60).convert("RGB")))
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", "16")
    with open(odd, "wb") as f:  # changed
        f.write(encode(Image.effect_noise((24, 20), 90).convert("RGB")))
    shutil.copyfile(tree / "ant" / "img_000.jpg", os.fsencode(str(tree / "ant")) + b"/copy\xff.jpg")
    make_tree(tmp_path / "new", {"bee": 1}, size=(20, 24))
    shutil.copytree(tmp_path / "new" / "bee", tree / "bee")
    manifest = prepare_here("--input", str(tree), "--output", str(out), "--append")
    appended = manifest["versions"][-1]["appended"]
    assert (appended["unchanged"], appended["changed"], appended["copies"], appended["gone"]) == (3, 1, 1, 0)
    changed = {json.loads(line)["change"]: json.loads(line)["path"]
               for line in (out / "changed.jsonl").read_text().splitlines()}
    assert changed == {"changed": printable(os.fsdecode(odd)),
                       "copy": printable(os.fsdecode(os.fsencode(str(tree / "ant")) + b"/copy\xff.jpg"))}


def test_an_append_after_one_killed_while_listing_starts_afresh(ants, tmp_path, caplog):
    """An append killed while it listed (a dataset made before kept hash lines takes a while: its shards
    are read) leaves a run folder without its record, which no run resumes: the next append removes it
    and runs, since it cannot be given --overwrite as a first run would be told to."""
    out = pathlib.Path(shutil.copytree(ants["out"], tmp_path / "out"))
    folder = out / ".beam-prep" / "20260101T000000Z-0123abcd"
    folder.mkdir(parents=True)
    (folder / "listing.jsonl").write_text("")  # the listings written, not yet run.json
    make_tree(tmp_path / "batch", {"cat": 2}, size=(20, 24))
    manifest = prepare_here("--input", str(tmp_path / "batch"), "--output", str(out), "--append")
    assert [v["version"] for v in manifest["versions"]] == [1, 2]
    assert not folder.exists()
    assert "removing the files of unfinished run 20260101T000000Z-0123abcd" in caplog.text


def test_a_plan_an_earlier_beam_prep_made_keeps_its_rows_and_a_new_one_merges_its_own_with_its_run_folders():
    """A run planned by an earlier beam-prep held changed.jsonl's rows in its plan: resumed, they are its lines,
    counted. A plan made now counts the rows ``narrow`` found and takes their lines from the run's folder, each
    kind in its place, merged by path with any the plan holds (copies set apart at publication)."""
    from beam_prep.write.grow.append import Additions

    digest = {name: name * 64 for name in "1234"}
    earlier = Additions.from_json({"unchanged": 3, "changed": [{"path": "/in/c.jpg", "sha256": digest["3"],
                                                                "now": digest["4"]}],
                                   "copies": [], "gone": [{"path": "/in/b.jpg", "sha256": digest["2"]},
                                                          {"path": "/in/a.jpg", "sha256": digest["1"]}]})
    assert {key: earlier.counts()[key] for key in ("changed", "copies", "gone")} == {"changed": 1, "copies": 0,
                                                                                    "gone": 2}
    assert [(r["change"], r["path"]) for r in map(json.loads, earlier.changed_lines())] == [
        ("changed", "/in/c.jpg"), ("gone", "/in/a.jpg"), ("gone", "/in/b.jpg")]
    found = [json.dumps({"change": change, "path": path, "sha256": digest["1"]}, sort_keys=True)
             for change, path in (("changed", "/in/x.jpg"), ("copy", "/in/a.jpg"), ("copy", "/in/c.jpg"),
                                  ("gone", "/in/z.jpg"))]
    now = Additions.from_json(Additions(unchanged=3, changed=1, copies=2, gone=1).to_json())
    now.add_copies([{"path": "/in/b.jpg", "sha256": digest["2"], "split": "train", "of": "/in/o.jpg",
                     "of_split": "train"}])
    assert now.counts()["copies"] == 3
    assert [(r["change"], r["path"]) for r in map(json.loads, now.changed_lines(found))] == [
        ("changed", "/in/x.jpg"), ("copy", "/in/a.jpg"), ("copy", "/in/b.jpg"), ("copy", "/in/c.jpg"),
        ("gone", "/in/z.jpg")]
    with pytest.raises(DatasetError, match="holds a line that is no change"):
        list(now.changed_lines([*found[:1], "not a change", *found[1:]]))
