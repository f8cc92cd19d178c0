"""A tree as a hostile or unlucky user makes it, and runs that are killed or overlap.

Each case once went wrong without a word: images dropped, a run refused, a
folder left holding half a dataset. Every file must end in a shard, in
errors.jsonl or in skipped.jsonl with its reason, and the counts must add up.
"""
from __future__ import annotations

import collections
import json
import os
import pathlib
import re
import signal
import subprocess
import time

from helpers import REPO, child, make_tree, prepare_here, read_split, run_prepare

from beam_prep.write.plan.listing import SKIP_DEPTH, SKIP_HIDDEN, SKIP_NOT_IMAGE
from beam_prep.write.plan.walk import SKIP_SEEN_FOLDER, SKIP_SPECIAL
from pipelines import prepare_images

ARGS = ("--image_size", "16", "--max_pixels", "100000")


def hostile_tree(tmp_path: pathlib.Path) -> pathlib.Path:
    """train/ and validation/ beside junk, links, a loop, a pipe and names a label or a file cannot have."""
    root = tmp_path / "tree"
    make_tree(root, {"cat": 3, "dog": 2}, splits=["train", "validation"], size=(24, 20))
    make_tree(tmp_path / "elsewhere", {"owl": 2, "one": 1}, size=(24, 20))
    owl = tmp_path / "elsewhere" / "owl"
    (root / "train" / "owl").symlink_to(owl, target_is_directory=True)         # followed: 2 images
    (root / "train" / "owl" / "again").symlink_to(owl, target_is_directory=True)  # a loop: listed once
    (root / "train" / "cat" / "linked.jpg").symlink_to(tmp_path / "elsewhere" / "one" / "img_000.jpg")
    (root / "train" / "cat" / "self.jpg").symlink_to("self.jpg")                # errors.jsonl, stage read
    with open(os.fsencode(str(root / "train" / "dog")) + b"/bad\xff\xfe.jpg", "wb") as f:
        f.write((root / "train" / "dog" / "img_000.jpg").read_bytes())          # prepared by its bytes
    os.mkfifo(root / "train" / "dog" / "pipe.jpg")                              # never read: it would block
    make_tree(root / ".ipynb_checkpoints", {"train": 1}, size=(24, 20))         # junk at the split depth
    make_tree(root / "__MACOSX", {"train": 1}, size=(24, 20))
    (root / "train" / "cat" / "Thumbs.db").write_bytes(b"x")
    make_tree(root, {"stray": 1}, size=(24, 20))                               # a label folder outside the splits
    (root / "README.md").write_text("notes")
    with open(os.fsencode(str(root)) + b"/notes\xff.txt", "wb") as f:              # skipped, named with \xff
        f.write(b"notes")
    return root


# Every skipped file of hostile_tree, by its name as skipped.jsonl shows it, and why.
SKIPPED = {
    ".ipynb_checkpoints/train/img_000.jpg": SKIP_HIDDEN,
    "README.md": SKIP_NOT_IMAGE,
    "__MACOSX/train/img_000.jpg": SKIP_HIDDEN,
    "notes\\xff.txt": SKIP_NOT_IMAGE,
    "stray/img_000.jpg": SKIP_DEPTH,
    "train/cat/Thumbs.db": SKIP_HIDDEN,
    "train/dog/pipe.jpg": SKIP_SPECIAL,
    "train/owl/again": SKIP_SEEN_FOLDER,
}


def test_a_hostile_tree_loses_nothing_and_counts_everything(tmp_path):
    out = tmp_path / "out"
    tree = hostile_tree(tmp_path)
    result = run_prepare("--input", str(tree), "--output", str(out), *ARGS)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["labels"] == ["cat", "dog", "owl"]
    assert manifest["counts"] == {"listed": 15, "written": 14, "failed": 1, "skipped": 8}
    assert manifest["skipped_by_reason"] == {SKIP_DEPTH: 1, SKIP_HIDDEN: 3, SKIP_SEEN_FOLDER: 1,
                                             SKIP_NOT_IMAGE: 2, SKIP_SPECIAL: 1}
    # Each skipped file is named with its reason, sorted by path; they add up to the manifest's counts.
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert [(s["relpath"], s["reason"]) for s in skipped] == sorted(SKIPPED.items())
    assert all(s["path"] == f"{tree}/{s['relpath']}" for s in skipped)
    assert collections.Counter(s["reason"] for s in skipped) == manifest["skipped_by_reason"]
    assert "  skipped, not a regular file: 1 (see skipped.jsonl)" in result.stdout.splitlines()
    assert {s: info["class_counts"] for s, info in manifest["splits"].items()} == {
        "train": {"cat": 4, "dog": 3, "owl": 2}, "validation": {"cat": 3, "dog": 2, "owl": 0}}
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert [(e["relpath"], e["stage"]) for e in errors] == [("train/cat/self.jpg", "read")]
    assert "Too many levels of symbolic links" in errors[0]["message"]
    names = {r["image/filename"] for r in read_split(out, "train")}
    assert b"train/dog/bad\xff\xfe.jpg" in names and b"train/owl/img_001.jpg" in names
    assert (out / "labels.txt").read_text().splitlines() == manifest["labels"]
    assert "skipped, image outside the label folders: 1" in result.stdout
    # bad\xff\xfe.jpg is a copy of dog/img_000.jpg: reported as the messages name it.
    copies = [row for line in (out / "duplicates.jsonl").read_text().splitlines()
              if (row := json.loads(line))["kind"] == "exact"]
    (sha256,) = {c["sha256"] for c in copies if c["path"].endswith("train/dog/bad\\xff\\xfe.jpg")}
    assert sorted(c["path"][len(str(tmp_path)) + 1:] for c in copies if c["sha256"] == sha256) == \
        ["tree/train/dog/bad\\xff\\xfe.jpg", "tree/train/dog/img_000.jpg"]


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(prepare_images.command(*args), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_for(pattern: str, folder: pathlib.Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not list(folder.glob(pattern)):
        assert proc.poll() is None, f"the run ended before {pattern} appeared: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {pattern} after {timeout} s"
        time.sleep(0.01)


def test_a_killed_overwrite_leaves_the_old_dataset_whole(tmp_path, capsys):
    """The killed run is the command's; the runs before and after it are made in this process
    (``prepare_here``, the refused one the command's main: refused before any work, it starts nothing)."""
    tree, out = tmp_path / "tree", tmp_path / "out"
    make_tree(tree, {"a": 3, "b": 2}, size=(24, 20))
    prepare_here("--input", str(tree), "--output", str(out), *ARGS)
    old = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    make_tree(tree, {"c": 400}, size=(96, 64))

    run = _start("--input", str(tree), "--output", str(out), "--overwrite", "--num_shards", "1",
                 "--direct_running_mode", "in_memory", *ARGS)
    try:
        _wait_for(".beam-prep/*/train-*.partial", out, run)  # the shard, half written
        os.killpg(run.pid, signal.SIGKILL)
    finally:
        run.wait()
    # The new run's shard was never under a dataset's name: the old dataset is as it was.
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == old
    assert len(read_split(out, "train")) == 5

    # The killed run would resume with its own options; with others, the folder is refused.
    capsys.readouterr()
    assert prepare_images.main(["--input", str(tree), "--output", str(out), *ARGS]) == 2
    refused = capsys.readouterr().err
    assert re.search(r"holds unfinished run \d{8}T\d{6}Z-\w+, started with --num_shards 1 where this run has 0; "
                     r".*pass --overwrite to start over", refused), refused
    prepare_here("--input", str(tree), "--output", str(out), "--overwrite", *ARGS)
    assert len(read_split(out, "train")) == 405
    assert [p.name for p in out.iterdir() if p.is_dir()] == []


def test_a_failed_run_keeps_its_finished_shards_for_the_same_command_to_resume(tmp_path):
    tree, out = tmp_path / "tree", tmp_path / "out"
    make_tree(tree, {"a": 2}, size=(24, 20))
    out.mkdir()
    (out / "train-00000-of-00001.tfrecord.gz").mkdir()  # publishing cannot put a shard here
    args = ("--input", str(tree), "--output", str(out), "--overwrite", "--num_shards", "1", *ARGS)
    result = run_prepare(*args)
    assert result.returncode == 1, result.stderr
    assert "kept 1 of 1 shards, finished before it failed: run the same command without --overwrite to " \
           "resume" in result.stderr, result.stderr
    assert not (out / "manifest.json").exists()
    (out / "train-00000-of-00001.tfrecord.gz").rmdir()
    resumed = run_prepare(*args[:4], "--num_shards", "1", *ARGS)
    assert resumed.returncode == 0, resumed.stderr
    assert "1 of 1 shards already written" in resumed.stderr
    assert len(read_split(out, "train")) == 2 and not (out / ".beam-prep").exists()


def test_a_run_into_a_folder_another_run_holds_is_refused(tmp_path, capsys):
    """The refused run is the command's main in this process (refused before any work, it starts
    nothing), the run once the holder is gone ``prepare_here``."""
    tree, out = tmp_path / "tree", tmp_path / "out"
    make_tree(tree, {"a": 2}, size=(24, 20))
    holder = subprocess.Popen(child("claim_holder", str(out)), cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        capsys.readouterr()
        code = prepare_images.main(["--input", str(tree), "--output", str(out), "--overwrite", *ARGS])
        refused = capsys.readouterr().err
    finally:
        holder.communicate("", timeout=60)
    assert code == 2
    assert re.search(rf"--output {re.escape(str(out))} is in use by run run-elsewhere \(pid {holder.pid} on "
                     r".*\) since \d{4}-\d\d-\d\dT.*wait for it to end", refused), refused
    assert not out.joinpath(".beam-prep").exists() and not list(out.glob("*.tfrecord.gz"))
    prepare_here("--input", str(tree), "--output", str(out), *ARGS)
