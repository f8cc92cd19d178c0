"""Interrupted local runs: stopped within seconds, their finished shards kept, and the same
command resuming them to the bytes an uninterrupted run writes. (Other file formats, originals,
tables and a stop at halfway: test_resume_variants.py; the two modules spread over the workers.)"""
from __future__ import annotations

import json
import logging
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest
from helpers import REPO, assert_shard_checksums, make_tree, prepare_here, run_prepare
from interrupts import (
    ARGS,
    DATASET_FILES,
    PHOTOS_PER_LABEL,
    SHARDS,
    WRITTEN_ARGS,
    dataset_digests,
    finished_records,
    interrupt,
    photo_tree,
    run_folder,
)
from interrupts import uninterrupted as uninterrupted_run

import beam_prep
from beam_prep.errors import OptionsError
from beam_prep.write.journal import resume
from beam_prep.write.shared import layout


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> pathlib.Path:
    """The photos ``interrupt`` stops a run of midway (``interrupts.photo_tree``)."""
    return photo_tree(tmp_path_factory.mktemp("resume") / "tree")


@pytest.fixture(scope="module")
def uninterrupted(tree, tmp_path_factory) -> dict[str, str]:
    """What the resumed runs must write: an uninterrupted run's digests, made in this process."""
    out = tmp_path_factory.mktemp("whole") / "out"
    digests = uninterrupted_run(tree, out)
    assert len(digests) == SHARDS + len(DATASET_FILES)
    assert json.loads((out / "manifest.json").read_text())["duplicates"]["extra_copies"] == 3
    lines = [json.loads(line) for line in (out / "duplicates.jsonl").read_text().splitlines()]
    assert len([r for r in lines if r["kind"] == "exact"]) == 5
    near = {r["path"]: r["group"] for r in lines if r["kind"] == "near"}
    assert near[str(tree / "bee" / "img_004.jpg")] == near[str(tree / "dog" / "near_e.jpg")]
    return digests


@pytest.fixture(scope="module")
def stopped_run(tree, tmp_path_factory):
    """``stopped_run(signum)``: the command with ARGS stopped by ``signum`` once two shards are
    finished (``interrupt``), made once a signal for the tests that start from such a run. Each call
    puts a copy of the output folder as the stop left it back where the run wrote it (the path its
    run record names), and gives that folder, the stopped process, the seconds it took to end after
    the signal, and those of the processes it started that were still running once it had ended."""
    made: dict[int, tuple] = {}

    def stopped(signum: int) -> tuple[pathlib.Path, subprocess.CompletedProcess, float, list[int]]:
        if signum not in made:
            base = tmp_path_factory.mktemp(f"stopped-{signum}")
            process, took, workers = interrupt(tree, base / "out", signum)
            running = [pid for pid in workers if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
            shutil.copytree(base / "out", base / "as-stopped", symlinks=True)
            made[signum] = (base, process, took, running)
        base, process, took, running = made[signum]
        shutil.rmtree(base / "out")
        shutil.copytree(base / "as-stopped", base / "out", symlinks=True)
        return base / "out", process, took, running

    return stopped


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_run_ends_in_seconds_and_the_same_command_resumes_it(tree, uninterrupted, stopped_run, signum):
    out, stopped, took, running = stopped_run(signum)
    assert stopped.returncode == 128 + signum, stopped.stderr
    assert took < 10
    finished = finished_records(out)
    assert 2 <= len(finished) < SHARDS, "the run ended before it could be stopped midway"
    # One line says what was kept and what to do; no traceback, no worker left running.
    assert stopped.stderr.splitlines()[-1] == (
        f"interrupted: {len(finished)} of {SHARDS} shards written; run the same command again to resume, "
        "or pass --overwrite to start over"), stopped.stderr
    assert "Traceback" not in stopped.stderr and stopped.stdout == ""
    assert running == []
    assert not list(out.glob("*.tfrecord.gz")) and not (out / "manifest.json").exists()

    folder = run_folder(out)
    kept = {p.name[:-len(".done.json")]: (folder / p.name[:-len(".done.json")]).stat().st_ino for p in finished}
    resumed = run_prepare("--input", str(tree), "--output", str(out), *ARGS)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming run {folder.name}: {len(finished)} of {SHARDS} shards already written" in resumed.stderr
    assert dataset_digests(out) == uninterrupted
    # The finished shards were kept, not written again: the same files, moved into place.
    assert {name: (out / name).stat().st_ino for name in kept} == kept
    manifest = json.loads((out / "manifest.json").read_text())
    listed = 4 * PHOTOS_PER_LABEL + 5  # the broken file, the three copies and the near copy
    assert manifest["counts"] == {"listed": listed, "written": listed - 1, "failed": 1, "skipped": 2}
    assert (manifest["duplicates"]["images"], manifest["duplicates"]["extra_copies"]) == (2, 3)
    assert not (out / ".beam-prep").exists()


def test_inspect_names_an_interrupted_run_and_the_command_that_resumes_it(tree, uninterrupted, stopped_run,
                                                                           capsys):
    """Not "no manifest.json: not a beam-prep dataset": the run, how far it got, and the command, which
    resumes it as given (exit 2 as for any folder that is no dataset yet)."""
    from pipelines import inspect_output

    out, _, _, _ = stopped_run(signal.SIGINT)
    finished, name = len(finished_records(out)), run_folder(out).name
    capsys.readouterr()
    assert inspect_output.main([str(out)]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    command = ["beam-prep", "prepare", "--input", str(tree), "--output", str(out), "--direct_num_workers", "2",
               "--image_size", "48", "--num_shards", str(SHARDS)]
    assert line == (f"error: {out} holds an interrupted run ({name}), not a dataset yet: "
                    f"{finished} of {SHARDS} shards done ({4 * PHOTOS_PER_LABEL + 5:,} images planned), no "
                    f"manifest.json; to resume it, run the same command again: {shlex.join(command)}")
    assert captured.out == ""
    resumed = run_prepare(*shlex.split(line.rsplit(": ", 1)[1])[2:])
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming run {name}: {finished} of {SHARDS} shards already written" in resumed.stderr
    assert dataset_digests(out) == uninterrupted


@pytest.mark.parametrize("command", [["rm", "-rf", "/"], ["beam-prep", "prepare", "--output", "/elsewhere"],
                                     ["beam-prep", "prepare", "--output", "OUT", "--overwrite"],
                                     ["beam-prep", "prepare", "--input", "a\nb", "--output", "OUT"], "beam-prep"])
def test_a_run_record_shows_only_a_command_that_resumes_into_its_own_folder(tmp_path, command):
    """The record is data in the folder: another command, folder, --overwrite (which starts over) or a
    word that is not printable is not put before the user."""
    from beam_prep.write.journal.interrupted import find_interrupted

    out = tmp_path / "out"
    work = out / ".beam-prep" / "r1"
    work.mkdir(parents=True)
    command = [str(out) if part == "OUT" else part for part in command] if isinstance(command, list) else command
    (work / "run.json").write_text(json.dumps({"run_format": resume.RUN_FORMAT, "run_id": "r1", "command": command,
                                               "plan": {"num_shards": {"train": 2}, "split_counts": {"train": 5}}}))
    run = find_interrupted(str(out))
    assert (run.finished, run.shards, run.images, run.command) == (0, 2, 5, None)
    assert run.describe(str(out)).endswith("to resume it, run the command that started it again, with the same options")


def test_a_killed_run_resumes_and_a_tampered_shard_is_written_again(tree, uninterrupted, tmp_path):
    """SIGKILL to the whole process group, as a power loss: nothing runs after it."""
    out = tmp_path / "out"
    killed, _, _ = interrupt(tree, out, signal.SIGKILL, whole_group=True)
    assert killed.returncode == -signal.SIGKILL
    finished = finished_records(out)
    assert 2 <= len(finished) < SHARDS
    tampered = finished[0].parent / finished[0].name[:-len(".done.json")]
    data = bytearray(tampered.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tampered.write_bytes(bytes(data))
    unhashed = finished[1].name[:-len(".done.json")]
    (finished[1].parent / layout.hashes_name(unhashed)).unlink()

    resumed = run_prepare("--input", str(tree), "--output", str(out), *ARGS)
    assert resumed.returncode == 0, resumed.stderr
    assert re.search(rf"shard {re.escape(tampered.name)} was finished but no longer matches its recorded size "
                     "and sha256: writing it again", resumed.stderr), resumed.stderr
    assert f"shard {unhashed} was finished but has lost its hash file" in resumed.stderr
    assert dataset_digests(out) == uninterrupted  # duplicates.jsonl included
    assert_shard_checksums(out)  # kept shards' sha256 from their records, the rewritten ones' anew


def test_other_options_are_refused_and_overwrite_starts_over(tree, uninterrupted, stopped_run, capsys, caplog):
    """The refusals run the command's main in this process: refused before any work, it starts nothing.
    The run with --overwrite too, on the in-memory runner: what it writes is the subject."""
    from pipelines import prepare_images

    out, stopped, _, _ = stopped_run(signal.SIGTERM)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    folder = run_folder(out)
    before = sorted(p.name for p in folder.iterdir())

    other = [*ARGS[:1], "32", *ARGS[2:]]
    capsys.readouterr()
    assert prepare_images.main(["--input", str(tree), "--output", str(out), *other]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: --output {out} holds unfinished run {folder.name}, started with --image_size 48x48 where "
        "this run has 32x32; run it with the same options to resume it, or pass --overwrite to start over")
    assert sorted(p.name for p in folder.iterdir()) == before
    assert prepare_images.main(["--input", str(tree), "--output", str(out), *ARGS, "--file_format",
                                "array_record"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: --output {out} holds unfinished run {folder.name}, started with --file_format \"tfrecord\" where "
        'this run has "array_record"; run it with the same options to resume it, or pass --overwrite to start over')
    assert sorted(p.name for p in folder.iterdir()) == before

    caplog.clear()
    prepare_here("--input", str(tree), "--output", str(out), *WRITTEN_ARGS[:1], "32", *WRITTEN_ARGS[2:],
                 "--overwrite")
    assert not [r.getMessage() for r in caplog.records if "resuming" in r.getMessage()]
    assert json.loads((out / "manifest.json").read_text())["image"]["height"] == 32
    assert not (out / ".beam-prep").exists()


def test_an_interrupted_overwrite_resumes_without_it_and_replaces_the_dataset(tree, uninterrupted, tmp_path):
    out = tmp_path / "out"
    make_tree(tmp_path / "old", {"old": 2}, size=(24, 20))
    prepare_here("--input", str(tmp_path / "old"), "--output", str(out), *WRITTEN_ARGS)  # made in this process
    old = (out / "manifest.json").read_text()

    stopped, _, _ = interrupt(tree, out, signal.SIGINT, "--overwrite")
    assert stopped.stderr.splitlines()[-1].endswith(
        "run the same command without --overwrite to resume, or with it to start over"), stopped.stderr
    assert (out / "manifest.json").read_text() == old  # the old dataset is whole until the new one is

    resumed = run_prepare("--input", str(tree), "--output", str(out), *ARGS)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming run" in resumed.stderr
    assert dataset_digests(out) == uninterrupted
    assert json.loads((out / "manifest.json").read_text())["labels"] == ["ant", "bee", "cat", "dog"]


def test_a_run_folder_that_cannot_be_resumed_is_refused_naming_overwrite(tmp_path):
    out = tmp_path / "out"
    folder = out / ".beam-prep" / "20260101T000000Z-0123abcd"
    folder.mkdir(parents=True)
    (folder / "train-00000.jsonl").write_text("")  # an older version's run: listings, no run.json
    with pytest.raises(OptionsError, match=r"unfinished run 20260101T000000Z-0123abcd, which cannot be resumed "
                                           r"\(.*another beam-prep version, or damaged\); pass --overwrite"):
        resume.find_resumable(str(out), [folder.name], {})
    for older in (0, resume.RUN_FORMAT - 1):  # a run folder of another version: its files mean other things
        (folder / resume.RUN_RECORD).write_text(json.dumps({"run_format": older, "run_id": folder.name}))
        with pytest.raises(OptionsError, match="cannot be resumed"):
            resume.find_resumable(str(out), [folder.name], {})
    (folder / resume.RUN_RECORD).write_text('{"run_format": 1, "run_id": "cut sh')
    with pytest.raises(OptionsError, match="cannot be resumed"):
        resume.find_resumable(str(out), [folder.name], {})


def test_a_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    """The command's main in this process: a dry run lists and plans, and starts nothing."""
    from pipelines import prepare_images

    tree, out = tmp_path / "tree", tmp_path / "out"
    make_tree(tree, {"ant": 7, "bee": 5, "owl": 3}, size=(24, 20))
    (tree / "notes.txt").write_text("x")
    (tree / "ant" / "notes.txt").write_text("x")
    (tree / "loose.jpg").write_bytes((tree / "ant" / "img_000.jpg").read_bytes())
    labels = tmp_path / "labels.txt"
    labels.write_text("bee\nant\n")
    capsys.readouterr()
    code = prepare_images.main(["--input", str(tree), "--output", str(out), "--dry_run", "--labels_file",
                                str(labels), "--validation_percent", "40", "--num_shards", "2"])
    result = capsys.readouterr()
    assert code == 0, result.err
    lines = result.out.splitlines()
    assert re.fullmatch(rf"dry run: {re.escape(str(tree))} lists 15 images in 2 labels \(bee, ant\); "
                        r"planned in [\d.]+ s, nothing written", lines[0]), lines
    train, validation = (int(re.search(rf"  {split}: (\d+) images in 2 shards", result.out).group(1))
                         for split in ("train", "validation"))
    assert train + validation == 12 and validation > 0
    assert "  not written, label not in --labels_file: 3 images (each would be reported in errors.jsonl)" in lines
    assert lines[-2:] == ["  skipped, image outside the label folders: 1", "  skipped, not an image file: 2"]
    assert not out.exists()


def test_a_dry_run_from_python_returns_the_plan_and_logs_it(tmp_path, caplog):
    """A notebook keeps the plan: an object with the counts, splits, shards and labels, printed as the
    command prints it; nothing is written."""
    from beam_prep.write.plan.planned import PlannedRun, SplitPlan

    tree, out = tmp_path / "tree", tmp_path / "out"
    make_tree(tree, {"ant": 6, "bee": 4}, size=(24, 20))
    (tree / "notes.txt").write_text("x")
    with caplog.at_level(logging.INFO, logger="beam_prep"):
        planned = beam_prep.prepare(str(tree), str(out), dry_run=True, num_shards=3)
    assert isinstance(planned, PlannedRun)
    assert (planned.input, planned.output, planned.labels, planned.listed) == (str(tree), str(out), ("ant", "bee"), 10)
    assert planned.splits == {"train": SplitPlan(images=10, shards=3)}
    assert planned.skipped_by_reason == {"not an image file": 1}
    lines = str(planned).splitlines()
    assert re.fullmatch(rf"dry run: {re.escape(str(tree))} lists 10 images in 2 labels \(ant, bee\); "
                        r"planned in [\d.]+ s, nothing written", lines[0]), lines
    assert lines[1:] == ["  train: 10 images in 3 shards", "  skipped, not an image file: 1"]
    assert str(planned) in caplog.text
    assert planned.to_json()["splits"] == {"train": {"images": 10, "shards": 3}}
    assert not out.exists()


def test_a_dry_run_flag_takes_false_as_false():
    from beam_prep.api import _dry_run_as_bool

    assert _dry_run_as_bool(["--dry_run", "--x", "1"]) == ["--dry_run=True", "--x", "1"]
    assert _dry_run_as_bool(["--dry_run", "false", "--dry_run=0", "--y"]) == ["--y"]
    assert _dry_run_as_bool(["--dry_run=True", "--", "--dry_run"]) == ["--dry_run=True", "--", "--dry_run"]


# Rewrites one large record again and again, so that a kill at any moment most likely
# lands while it is being written.
WRITER = """
import sys
from beam_prep.write.journal import resume
failures = [{"path": "x" * 20_000_000, "stage": "decode"}]
while True:
    resume.write_shard_record(sys.argv[1], resume.ShardRecord("train-00000", 1, 2, "0" * 64, {}, failures, {}))
"""


def test_a_record_is_there_whole_or_not_at_all_whenever_its_writer_is_killed(tmp_path):
    """A writer killed mid-record leaves no record the resume cannot read: such a record is
    silently taken for unfinished by the resume, and for finished by whoever lists the folder."""
    for attempt in range(8):
        work = tmp_path / f"work-{attempt}"
        work.mkdir()
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(work)], cwd=REPO)
        try:
            deadline = time.monotonic() + 60
            while not (work / "train-00000.done.json").exists():
                assert writer.poll() is None and time.monotonic() < deadline
                time.sleep(0.005)
            time.sleep(0.1 + 0.037 * attempt)  # a few rewrites later, at a different point of one
        finally:
            writer.kill()
            writer.wait()
        assert resume.finished_shard(str(work), "train-00000") is not None, f"attempt {attempt}"
        assert resume.finished_count(str(work), ["train-00000"]) == 1


def test_a_record_naming_another_shard_is_not_taken_for_finished(tmp_path):
    """A record's name reaches the manifest and the move that publishes the shards: one that
    names another file (``../../victim``, damaged or written into the output folder by someone
    else) is not the shard's, which is written again; the run failed on it at every resume."""
    for name in ("../../victim.txt", "train-00001", "/etc/passwd"):
        body = resume.ShardRecord(name, 1, 2, "0" * 64, {}, [], {})
        (tmp_path / resume.done_name("train-00000")).write_text(json.dumps(body.__dict__))
        assert resume.finished_shard(str(tmp_path), "train-00000") is None, name
    resume.write_shard_record(str(tmp_path), resume.ShardRecord("train-00000", 1, 2, "0" * 64, {}, [], {}))
    assert resume.finished_shard(str(tmp_path), "train-00000").name == "train-00000"


def test_a_run_record_naming_another_folder_or_split_is_not_resumed(tmp_path):
    """run.json is data in the output folder: its run id names the folder the resumed run reads its
    listings from, writes its shards to and removes at the end, and its split names name those files.
    One naming ``../../victim`` or a split ``../../x`` would put them outside the output folder (shards
    published to ``OUTPUT/../../x-00000-of-00001...``): it cannot be resumed."""
    out = tmp_path / "out"
    name = "20260101T000000Z-0123abcd"
    folder = out / ".beam-prep" / name
    folder.mkdir(parents=True)

    def record(run_id: str = name, plan_id: str = name, split: str = "train") -> resume.RunRecord:
        return resume.RunRecord(run_id, {}, False, {"run_id": plan_id, "num_shards": {split: 1},
                                                    "split_counts": {split: 3}})

    resume.write_run_record(str(folder), record())
    assert resume.find_resumable(str(out), [name], {}) == record()
    for hostile in (record(run_id="../../victim"), record(plan_id="../../victim"), record(split="../../x"),
                    record(split="Train")):
        resume.write_run_record(str(folder), hostile)
        with pytest.raises(OptionsError, match=f"unfinished run {name}, which cannot be resumed"):
            resume.find_resumable(str(out), [name], {})


def test_a_listing_naming_a_file_outside_the_input_is_refused_before_the_resumed_run_reads_it(tree, stopped_run,
                                                                                               tmp_path, capsys):
    """The listings a resumed run reads are data in the output folder, as its records are: a line
    naming a picture elsewhere on the machine (someone else's, with a share of the output folder)
    was read into the dataset. Refused with exit 2, naming the listing, the line and the path.
    (The resumed run is the command's main in this process, on the in-memory runner: refused
    before any work, it starts nothing.)"""
    from pipelines import prepare_images

    out, stopped, _, _ = stopped_run(signal.SIGTERM)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    victim = tmp_path / "private" / "me.jpg"
    victim.parent.mkdir()
    victim.write_bytes((tree / "ant" / "img_000.jpg").read_bytes()[:-1] + b"\xd9")
    work = run_folder(out)
    listing = work / layout.shard_listing_name("train", SHARDS - 1)
    lines = listing.read_text().splitlines()
    entry = json.loads(lines[0])
    lines[0] = json.dumps({**entry, "path": str(victim), "size": victim.stat().st_size})
    listing.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert prepare_images.main(["--input", str(tree), "--output", str(out), *WRITTEN_ARGS,
                                "--direct_running_mode", "in_memory"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {listing}: line 1's path is {str(victim)!r}, not a path under {tree} (it is absolute elsewhere, "
        "or holds . or ..): only files under it are opened; the unfinished run cannot be resumed: pass "
        "--overwrite to start over")
    assert not (out / "manifest.json").exists()
