"""A run killed at any step of publishing its dataset: the same command finishes it, byte for byte.

Each test kills a run at every step of its publication in turn (``publication.KILL_VARIABLE``:
the run SIGKILLs itself right after step N), locally and on gs:// (the GCS test server), and runs
the same command again after each kill (``tests/children/publish_kills.py``, which forks the
runs from one process: a run costs its own work only, and each resumes a run killed as its
publication began, so that it only publishes). Every file under the output, the run's folder
included, must then be what an uninterrupted run leaves (byte for byte; the manifest's ``created``
time aside), and the old dataset an ``--overwrite``
run replaces is never lost: whole and unchanged until the publication is recorded, finished into
the new one after. Then what a rerun does with other options, a record that is not one
beam-prep writes, a file removed by hand, a gs:// move cut between its copy and its delete, and a
move that fails.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess

import pytest
from helpers import REPO, child, make_tree, prepare_here, run_prepare

from beam_prep.write.finish import publication
from beam_prep.write.shared import layout
from pipelines import prepare_images

pytestmark = pytest.mark.slow  # every test runs the command, or kills it

ARGS = ("--image_size", "16", "--validation_percent", "40", "--direct_running_mode", "in_memory")
SUMMARY = "beam-prep: 11 of 12 images written in"


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> pathlib.Path:
    """11 images in 2 labels, one broken (errors.jsonl) and a file skipped (skipped.jsonl)."""
    root = tmp_path_factory.mktemp("publish") / "tree"
    make_tree(root, {"cat": 6, "dog": 5})
    (root / "dog" / "broken.jpg").write_bytes(b"not a jpeg")
    (root / "dog" / "notes.txt").write_text("not an image")
    return root


def kill_at_each_step(output: str, saved: str, *args: str, gcs_server=None) -> list[dict]:
    """The rows ``publish_kills`` prints for the command ``--output output ARGS``."""
    argv = child("publish_kills", output, saved, "--", *args)
    if gcs_server is not None:
        result = gcs_server.run(argv, cwd=REPO, timeout_s=600)
    else:
        result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-6000:]
    return [json.loads(line) for line in result.stdout.splitlines()]


def recorded(files: dict[str, str]) -> bool:
    """Whether a run's publication was recorded (its ``publish.json`` is among ``files``)."""
    return any(name.endswith(f"/{publication.RECORD}") for name in files)


def top(files: dict[str, str]) -> dict[str, str]:
    """The files directly in the output folder: the dataset's, whole or not."""
    return {name: digest for name, digest in files.items() if "/" not in name}


def without_manifest(files: dict[str, str]) -> dict[str, str]:
    return {name: digest for name, digest in files.items() if name != "manifest.json"}


def check_each_kill_finished(rows: list[dict], files: int, summary: str = SUMMARY,
                             overwrite_first: bool = False) -> list[dict]:
    """Every kill, by step: the run again exits 0 with its ``summary`` and leaves what the uninterrupted
    run left (every file, the run's folder gone), saying that it finished a recorded publication;
    a kill before the record left the output folder's files as they were. Returns the kills' rows."""
    initial, reference, base = rows[0]["initial"], rows[1]["reference"], rows[2]["base"]
    assert len(reference) == files and not any(name.startswith(layout.WORK_DIR) for name in reference)
    assert any(name.endswith("/run.json") for name in base) and not recorded(base)
    *kills, last = rows[3:]
    assert [row["step"] for row in rows[3:]] == list(range(1, len(rows) - 2))
    assert all(row["killed"] for row in kills) and not last["killed"]
    # Its manifest records its options, --overwrite among them: a reference run given it differs there.
    assert without_manifest(last["final"]) == without_manifest(reference)
    assert last["final"]["manifest.json"] == reference["manifest.json"] or overwrite_first
    reference = last["final"]
    assert len(kills) >= 8, kills  # the staged files, the record, the moves, the removals
    for row in kills:
        step = f"killed after step {row['step']}"
        assert row["code"] == 0, (step, row["stderr"][-3000:])
        assert summary in row["stdout"], (step, row["stdout"])
        assert row["final"] == reference, step
        assert ("finishing run" in row["stderr"]) == recorded(row["after_kill"]), (step, row["stderr"][-3000:])
        if not recorded(row["after_kill"]):
            assert top(row["after_kill"]) == top(initial), step
    assert 0 < sum(recorded(row["after_kill"]) for row in kills) < len(kills)
    return kills


def test_a_run_killed_at_each_step_of_publishing_is_finished_by_the_same_command(tree, tmp_path):
    """Uncompressed TFRecords: shards, DALI indexes, TFDS's metadata and the rest, two splits."""
    rows = kill_at_each_step(str(tmp_path / "out"), str(tmp_path / "saved"), "--input", str(tree), *ARGS,
                             "--compression", "none")
    kills = check_each_kill_finished(rows, 12)
    # No step leaves a manifest beside a part of the dataset: a reader sees the whole dataset or none.
    reference = rows[1]["reference"]
    for row in kills:
        if "manifest.json" in row["after_kill"]:
            assert {name: row["after_kill"][name] for name in reference} == reference, row["step"]


def test_an_overwrite_killed_at_each_step_never_loses_the_old_dataset(tree, tmp_path):
    """An --overwrite run replacing a dataset of other images in files of the same names (the train
    shard, labels.txt...) and of others (the old validation shard, removed), killed at each step
    and run again without --overwrite, as the guide says: until its publication is recorded the old
    dataset is there whole, byte for byte; after, the run again finishes the new one."""
    out = tmp_path / "out"
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", "8", *ARGS[2:])
    rows = kill_at_each_step(str(out), str(tmp_path / "saved"), "--input", str(tree), *ARGS[:2],
                             "--direct_running_mode", "in_memory", "--started_with_overwrite")
    kills = check_each_kill_finished(rows, 6, overwrite_first=True)
    old, new = top(rows[0]["initial"]), rows[-1]["final"]
    assert "validation-00000-of-00001.tfrecord.gz" in set(old) - set(new)
    assert {"train-00000-of-00001.tfrecord.gz", "labels.txt", "errors.jsonl", "manifest.json"} <= set(old) & set(new)
    assert old["train-00000-of-00001.tfrecord.gz"] != new["train-00000-of-00001.tfrecord.gz"]
    # Past the record, the folder holds neither dataset until the run again finishes the new one.
    assert any(top(row["after_kill"]) not in (old, new) for row in kills if recorded(row["after_kill"]))


def test_a_drop_run_killed_at_each_step_is_finished_without_converting_again(tmp_path):
    """--cross_split_duplicates drop (finding 6's example): the shards it rewrote without the copies
    are published from their staged names, the shards written by the workers left as they were,
    so a run killed anywhere resumes by publishing, never by converting an image again."""
    root = tmp_path / "tree"
    make_tree(root, {"cat": 3, "dog": 3}, splits=("train", "validation"))
    shutil.copyfile(root / "train" / "cat" / "img_000.jpg", root / "validation" / "dog" / "copy.jpg")
    rows = kill_at_each_step(str(tmp_path / "out"), str(tmp_path / "saved"), "--input", str(root), *ARGS[:2],
                             "--direct_running_mode", "in_memory", "--cross_split_duplicates", "drop")
    kills = check_each_kill_finished(rows, 7, "beam-prep: 12 of 13 images written in")
    for row in kills:  # a run again before the record resumes with every shard kept
        resumed = re.search(r"resuming run \S+: (\d+) of (\d+) shards already written", row["stderr"])
        assert (resumed is None) == recorded(row["after_kill"]), row["step"]
        assert resumed is None or resumed[1] == resumed[2], (row["step"], resumed[0])


def test_an_append_killed_at_each_step_keeps_the_old_version_whole_and_is_finished(tree, tmp_path):
    """An --append (a new class, uncompressed TFRecords with DALI indexes): before, while and after its shards
    are published, the old version's shards are there byte for byte beside a manifest; the same command
    then ends where an uninterrupted append ends."""
    out, batch = tmp_path / "out", tmp_path / "batch"
    prepare_here("--input", str(tree), "--output", str(out), *ARGS, "--compression", "none")
    make_tree(batch, {"cat": 2, "eel": 2}, size=(20, 24))
    rows = kill_at_each_step(str(out), str(tmp_path / "saved"), "--input", str(batch), "--append",
                             "--direct_running_mode", "in_memory")
    kills = check_each_kill_finished(rows, 17, "beam-prep: 15 of 16 images written in")
    old = {name: digest for name, digest in top(rows[0]["initial"]).items() if "-000" in name}  # shards, indexes
    assert len(old) == 4
    for row in kills:
        assert "manifest.json" in row["after_kill"], row["step"]
        assert {name: row["after_kill"].get(name) for name in old} == old, row["step"]
    new = set(rows[-1]["final"]) - set(rows[0]["initial"])
    assert {name for name in new if "-v2-" in name} == {name for name in new if name != "changed.jsonl"}


def test_a_run_into_gs_killed_at_each_step_is_finished_by_the_same_command(tree, gcs_server, gcs_bucket):
    """On gs:// a move is a copy and a delete (the same rename, 100 files at a time), each a step here."""
    rows = kill_at_each_step(gcs_bucket.url("out"), gcs_bucket.url("saved"), "--input", str(tree), *ARGS,
                             gcs_server=gcs_server)
    check_each_kill_finished(rows, 7)
    assert gcs_bucket.list_names("out/") == sorted(f"out/{name}" for name in rows[1]["reference"])


def test_a_gs_move_cut_between_its_copy_and_its_delete_is_finished(tree, gcs_server, gcs_bucket):
    """Killed as it published, then each file copied to its target but left in the run's folder, as a
    rename killed between its copy and its delete leaves them: the same command publishes the
    staged bytes, and nothing else is left under the output."""
    from pipelines.prepare_images import command

    argv = command("--input", str(tree), "--output", gcs_bucket.url("out"), *ARGS)
    killed = gcs_server.run(argv, cwd=REPO, extra_env={publication.KILL_VARIABLE: str(STAGED_FILES + 1)},
                            check=False)
    assert killed.returncode == -9, killed.stderr[-3000:]
    (record,) = [name for name in gcs_bucket.list_names("out/") if name.endswith(f"/{publication.RECORD}")]
    folder = record.rsplit("/", 1)[0]
    moves = json.loads(gcs_bucket.read_bytes(record))["moves"]
    assert [name for name in gcs_bucket.list_names("out/") if "/.beam-prep/" not in f"/{name}"] == []
    published = {}
    for source, target in moves:
        published[target] = gcs_bucket.read_bytes(f"{folder}/{source}")
        gcs_bucket.write_bytes(f"out/{target}", published[target])
    again = gcs_server.run(argv, cwd=REPO)
    assert "finishing run" in again.stderr and SUMMARY in again.stdout
    assert gcs_bucket.list_names("out/") == sorted(f"out/{target}" for target in published)
    assert all(gcs_bucket.read_bytes(f"out/{target}") == data for target, data in published.items())


# A gzip run's staged files: errors.jsonl, skipped.jsonl, duplicates.jsonl, labels.txt, manifest.json.
STAGED_FILES = 5


@pytest.fixture(scope="module")
def killed_mid_publish(tree, tmp_path_factory):
    """``killed_mid_publish()``: the output folder of the command with ARGS killed once it had moved its first
    shard into the folder, put back where the run wrote it (its run record names the path); made once."""
    base = tmp_path_factory.mktemp("mid-publish")
    out = base / "out"
    killed = run_prepare("--input", str(tree), "--output", str(out), *ARGS,
                         env={**os.environ, publication.KILL_VARIABLE: str(STAGED_FILES + 2)})
    assert killed.returncode == -9, killed.stderr
    assert [p.name for p in out.iterdir() if p.is_file()] == ["train-00000-of-00001.tfrecord.gz"]
    shutil.copytree(out, base / "as-killed", symlinks=True)

    def put_back() -> pathlib.Path:
        shutil.rmtree(out)
        shutil.copytree(base / "as-killed", out, symlinks=True)
        return out

    return put_back


def test_other_options_after_a_kill_mid_publish_finish_it_first(tree, killed_mid_publish, capfd):
    """A run with other options finishes the publication it finds first, then is refused as with any
    dataset there (--overwrite to replace it); with --overwrite it then replaces it."""
    out = killed_mid_publish()
    argv = ["--input", str(tree), "--output", str(out), "--image_size", "24", *ARGS[2:]]
    assert prepare_images.main(argv) == 2
    err = capfd.readouterr().err
    assert "finishing run" in err
    assert f"--output {out} already holds a dataset" in err and "--overwrite" in err
    assert json.loads((out / "manifest.json").read_text())["image"]["height"] == 16  # the killed run's
    assert not (out / layout.WORK_DIR).exists()
    assert prepare_images.main([*argv, "--overwrite"]) == 0
    assert json.loads((out / "manifest.json").read_text())["image"]["height"] == 24


def test_the_same_command_with_overwrite_finishes_then_starts_over(tree, killed_mid_publish, capfd):
    out = killed_mid_publish()
    assert prepare_images.main(["--input", str(tree), "--output", str(out), *ARGS, "--overwrite"]) == 0
    captured = capfd.readouterr()
    assert "finishing run" in captured.err and SUMMARY in captured.out
    assert "0 images/s" not in captured.out  # it converted the images again, as --overwrite asks
    assert sorted(p.name for p in out.iterdir()) == [
        "duplicates.jsonl", "errors.jsonl", "labels.txt", "manifest.json", "skipped.jsonl",
        "train-00000-of-00001.tfrecord.gz", "validation-00000-of-00001.tfrecord.gz"]


@pytest.mark.parametrize("field, value", [("moves", [["../../escaped.txt", "labels.txt"]]),
                                          ("moves", [["staged/labels.txt", "../escaped.txt"]]),
                                          ("removes", ["notes-of-mine.txt"]),
                                          ("run_id", "another-run")])
def test_a_publication_record_beam_prep_does_not_write_is_refused(tree, killed_mid_publish, capfd, field, value):
    """The record is data in the output folder: a move from or to outside the folders, a removal of a
    file no dataset holds or another run's record is refused, naming the record and --overwrite,
    with nothing moved or removed; --overwrite starts over."""
    out = killed_mid_publish()
    (record,) = (out / layout.WORK_DIR).glob(f"*/{publication.RECORD}")
    body = json.loads(record.read_text())
    body[field] = value if field != "moves" else [*value, *body["moves"]]
    record.write_text(json.dumps(body))
    (out / "notes-of-mine.txt").write_text("mine")
    (out / layout.WORK_DIR / "claim.json").unlink()  # the killed run's, released by any run after
    before = sorted(p.relative_to(out.parent) for p in out.parent.rglob("*"))
    argv = ["--input", str(tree), "--output", str(out), *ARGS]
    assert prepare_images.main(argv) == 2
    err = capfd.readouterr().err
    assert f"whose record {record} cannot be used" in err and "pass --overwrite to start over" in err
    assert sorted(p.relative_to(out.parent) for p in out.parent.rglob("*")) == before
    assert prepare_images.main([*argv, "--overwrite"]) == 0
    assert (out / "notes-of-mine.txt").read_text() == "mine" and not (out.parent / "escaped.txt").exists()
    assert (out / "manifest.json").exists() and not (out / layout.WORK_DIR).exists()


def test_a_file_removed_by_hand_mid_publish_is_named(tree, killed_mid_publish, capfd):
    out = killed_mid_publish()
    (out / "train-00000-of-00001.tfrecord.gz").unlink()  # moved, then removed
    assert prepare_images.main(["--input", str(tree), "--output", str(out), *ARGS]) == 1
    err = capfd.readouterr().err
    assert "cannot finish publishing run" in err and "e.g. train-00000-of-00001.tfrecord.gz" in err
    assert "pass --overwrite to start over" in err


def test_a_failed_replace_keeps_its_publication_for_the_next_run(tree, tmp_path, capfd):
    """A move that fails (a folder where a shard goes) ends the run with one line naming the file, and
    even a run that keeps nothing else (--sink shuffle) keeps its recorded publication: once the
    folder is gone, the same command without --overwrite finishes it and exits 0."""
    out = tmp_path / "out"
    (out / "validation-00000-of-00001.tfrecord.gz").mkdir(parents=True)
    (out / "validation-00000-of-00001.tfrecord.gz" / "mine").write_text("in the way")
    argv = ["--input", str(tree), "--output", str(out), *ARGS, "--sink", "shuffle"]
    assert prepare_images.main([*argv, "--overwrite"]) == 1
    err = capfd.readouterr().err
    assert f"cannot move to {out / 'validation-00000-of-00001.tfrecord.gz'}" in err
    assert (out / "train-00000-of-00001.tfrecord.gz").exists() and not (out / "manifest.json").exists()
    assert list((out / layout.WORK_DIR).glob(f"*/{publication.RECORD}"))
    shutil.rmtree(out / "validation-00000-of-00001.tfrecord.gz")
    assert prepare_images.main(argv) == 0
    captured = capfd.readouterr()
    assert "finishing run" in captured.err and SUMMARY in captured.out
    assert sorted(p.name for p in out.iterdir()) == [
        "duplicates.jsonl", "errors.jsonl", "labels.txt", "manifest.json", "skipped.jsonl",
        "train-00000-of-00001.tfrecord.gz", "validation-00000-of-00001.tfrecord.gz"]
    assert json.loads((out / "manifest.json").read_text())["counts"]["written"] == 11
