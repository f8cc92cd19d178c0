"""A run killed at any step of publishing its dataset: the same command finishes it, byte for byte.

Each test kills a run at every step of its publication in turn (``publication.KILL_VARIABLE``:
the run SIGKILLs itself right after step N), locally and on gs:// (the GCS test server), and runs
the same command again after each kill (``tests/children/publish_kills.py``, which forks the
runs from one process: a run costs its own work only, and each resumes a run killed as its
publication began, so that it only publishes). Every file under the output, the run's folder
included, must then be what an uninterrupted run leaves, and the old dataset an ``--overwrite``
run replaces is never lost: whole and unchanged until the publication is recorded, finished into
the new one after. Then what a rerun does with other options, a record that is not one
beam-prep writes, a file removed by hand, and a gs:// move cut between its copy and its delete.
"""
from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess

import pytest
from helpers import REPO, child, make_tree, prepare_here

from beam_prep.write.finish import publication
from beam_prep.write.shared import layout

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
