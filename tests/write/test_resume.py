"""Interrupted local runs: stopped within seconds, their finished shards kept, and the same
command resuming them to the bytes an uninterrupted run writes."""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest
from helpers import REPO, assert_shard_checksums, encode, make_tree, run_prepare

from beam_prep.errors import OptionsError
from beam_prep.tools.sample import picture
from beam_prep.write.journal import progress, resume
from beam_prep.write.shared import layout
from pipelines.prepare_images import command

SHARDS = 16
ARGS = ("--image_size", "48", "--num_shards", str(SHARDS), "--direct_num_workers", "2",
        "--direct_running_mode", "multi_processing")
# Enough photos that the run is still going when the test has seen two shards finish and
# signals it, with time to spare on a loaded machine (see the tree fixture).
PHOTOS_PER_LABEL = 120
DATASET_FILES = ("errors.jsonl", "skipped.jsonl", "labels.txt", "duplicates.jsonl")


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> pathlib.Path:
    """Photos in 4 labels, a broken one, and copies, whose 16 shards keep the workers busy for
    a while after the first two are finished: time for a signal to stop them midway.

    Progressive JPEGs without chroma subsampling: their decode costs several times a baseline
    JPEG's, which the kernel draft-decodes to 48 px almost for free (16 shards of those took
    a fraction of a second, on a loaded machine less than the signal took to reach the workers).
    """
    root = tmp_path_factory.mktemp("resume") / "tree"
    for n, label in enumerate(("ant", "bee", "cat", "dog")):
        (root / label).mkdir(parents=True)
        for i in range(PHOTOS_PER_LABEL):
            photo = picture(n * PHOTOS_PER_LABEL + i, 640, 480)
            (root / label / f"img_{i:03d}.jpg").write_bytes(
                encode(photo, "JPEG", quality=90, progressive=True, subsampling=0))
    (root / "cat" / "broken.jpg").write_bytes(b"\xff\xd8 not a whole JPEG")
    (root / "dog" / "notes.txt").write_text("skipped")  # the resumed run names them as the whole run did
    (root / "ant" / ".DS_Store").write_bytes(b"")
    for original, copy in (("ant/img_000.jpg", "bee/copy_a.jpg"), ("ant/img_000.jpg", "dog/copy_b.jpg"),
                           ("bee/img_001.jpg", "cat/copy_c.jpg")):  # duplicates, in shards of their own
        shutil.copyfile(root / original, root / copy)
    # A near duplicate: half the size, at JPEG quality 50 (the resumed run must group it the same).
    picture(PHOTOS_PER_LABEL + 5, 640, 480).resize((320, 240)).save(root / "dog" / "near_e.jpg", quality=50)
    return root


def _digests(out: pathlib.Path) -> dict[str, str]:
    names = [p.name for p in out.iterdir() if layout.is_shard_name(p.name)] + list(DATASET_FILES)
    return {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in sorted(names)}


@pytest.fixture(scope="module")
def uninterrupted(tree, tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("whole") / "out"
    result = run_prepare("--input", str(tree), "--output", str(out), *ARGS)
    assert result.returncode == 0, result.stderr
    digests = _digests(out)
    assert len(digests) == SHARDS + len(DATASET_FILES)
    assert json.loads((out / "manifest.json").read_text())["duplicates"]["extra_copies"] == 3
    lines = [json.loads(line) for line in (out / "duplicates.jsonl").read_text().splitlines()]
    assert len([r for r in lines if r["kind"] == "exact"]) == 5
    near = {r["path"]: r["group"] for r in lines if r["kind"] == "near"}
    assert near[str(tree / "bee" / "img_005.jpg")] == near[str(tree / "dog" / "near_e.jpg")]
    return digests


def _run_folder(out: pathlib.Path) -> pathlib.Path:
    (folder,) = [p for p in (out / ".beam-prep").iterdir() if p.is_dir()]
    return folder


def _finished(out: pathlib.Path) -> list[pathlib.Path]:
    """The records of the shards a resume takes for finished: those it can read, of any
    format and compression (originals are uncompressed unless asked)."""
    return sorted(p for p in (out / ".beam-prep").glob("*/*.done.json")
                  if resume.finished_shard(str(p.parent), p.name[:-len(".done.json")]) is not None)


def _interrupt(tree: pathlib.Path, out: pathlib.Path, signum: int, *extra: str, whole_group: bool = False,
               args: tuple[str, ...] = ARGS, ready: Callable[[int], bool] | None = None,
               ) -> tuple[subprocess.CompletedProcess, float, list[int]]:
    """Starts the command, waits until ``ready(its pid)`` (by default: two shards are finished),
    sends ``signum``; the finished process, the seconds it took to end after the signal, and
    the pids of the processes it started.

    Those processes are listed once the workers are writing, before the run is ready, so
    that the signal follows the moment the test sees the run ready: the run's remaining work
    must outlast the signal's way through the launcher, not the test's own steps as well.
    """
    ready = ready or (lambda _: len(_finished(out)) >= 2)
    process = subprocess.Popen(command("--input", str(tree), "--output", str(out), *args, *extra), cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait_for(lambda: list(out.glob(f"{layout.WORK_DIR}/*/*.partial")), process, "a shard to be started")
        workers = [p.pid for p in psutil.Process(process.pid).children(recursive=True)]
        _wait_for(lambda: ready(process.pid), process, "the run to be ready to stop")
        sent = time.monotonic()
        (os.killpg if whole_group else os.kill)(process.pid, signum)
        stdout, stderr = process.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), took, workers


def _wait_for(condition: Callable[[], Any], process: subprocess.Popen, what: str, timeout: float = 120) -> Any:
    """Polls ``condition`` until it gives something true, and returns that; fails if ``process`` ends first."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.02)
    return value


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_run_ends_in_seconds_and_the_same_command_resumes_it(tree, uninterrupted, tmp_path, signum):
    out = tmp_path / "out"
    stopped, took, workers = _interrupt(tree, out, signum)
    assert stopped.returncode == 128 + signum, stopped.stderr
    assert took < 10
    finished = _finished(out)
    assert 2 <= len(finished) < SHARDS, "the run ended before it could be stopped midway"
    # One line says what was kept and what to do; no traceback, no worker left running.
    assert stopped.stderr.splitlines()[-1] == (
        f"interrupted: {len(finished)} of {SHARDS} shards written; run the same command again to resume, "
        "or pass --overwrite to start over"), stopped.stderr
    assert "Traceback" not in stopped.stderr and stopped.stdout == ""
    assert [pid for pid in workers if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"] == []
    assert not list(out.glob("*.tfrecord.gz")) and not (out / "manifest.json").exists()

    folder = _run_folder(out)
    kept = {p.name[:-len(".done.json")]: (folder / p.name[:-len(".done.json")]).stat().st_ino for p in finished}
    resumed = run_prepare("--input", str(tree), "--output", str(out), *ARGS)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming run {folder.name}: {len(finished)} of {SHARDS} shards already written" in resumed.stderr
    assert _digests(out) == uninterrupted
    # The finished shards were kept, not written again: the same files, moved into place.
    assert {name: (out / name).stat().st_ino for name in kept} == kept
    manifest = json.loads((out / "manifest.json").read_text())
    listed = 4 * PHOTOS_PER_LABEL + 5  # the broken file, the three copies and the near copy
    assert manifest["counts"] == {"listed": listed, "written": listed - 1, "failed": 1, "skipped": 2}
    assert (manifest["duplicates"]["images"], manifest["duplicates"]["extra_copies"]) == (2, 3)
    assert not (out / ".beam-prep").exists()


# Over 32 x 16 x 2 images, the default plan of a resumable run on 2 workers is 32 shards
# (sharding.max_shard_images): the share a stop at halfway keeps is then the same at any
# size, the 5,000 images included.
HALFWAY_IMAGES = 2560
HALFWAY_ARGS = ("--direct_num_workers", "2", "--direct_running_mode", "multi_processing")


@pytest.fixture(scope="module")
def halfway_tree(tmp_path_factory) -> pathlib.Path:
    """Photos whose shorter side is under twice the default 224 px, so that each is decoded
    whole (no JPEG draft) and the run lasts long enough to be stopped halfway. A few pictures,
    each file told apart by a JPEG comment: quicker to make than a picture each."""
    root = tmp_path_factory.mktemp("halfway") / "tree"
    pictures = [picture(seed, 640, 440) for seed in range(8)]
    for i in range(HALFWAY_IMAGES):
        folder = root / f"label_{i % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img_{i:05d}.jpg").write_bytes(encode(pictures[i % 8], "JPEG", quality=90,
                                                         comment=f"photo {i}".encode()))
    return root


def _progress_of(pid: int) -> progress.Progress:
    """The images the workers of the run launched as ``pid`` have finished, from their reports
    (in the test's TMPDIR, which the run inherits): what its progress bar shows."""
    folders = list(pathlib.Path(os.environ["TMPDIR"]).glob(f"{progress.FOLDER_PREFIX}{pid}-*"))
    return progress.read_progress(str(folders[0]), HALFWAY_IMAGES) if folders else progress.Progress(HALFWAY_IMAGES)


def test_a_run_stopped_halfway_keeps_most_of_its_work_and_rates_only_the_rest(halfway_tree, tmp_path):
    """Ctrl-C once the workers have done half the images, with the default shard plan: the
    resume keeps at least 40% of the images (the plan by size alone, two shards, one a worker,
    kept none).
    The resumed run's rate is that of the images it processed, not of its kept ones too."""
    out = tmp_path / "out"
    shares: list[float] = []

    def halfway(pid: int) -> bool:
        shares.append(_progress_of(pid).done / HALFWAY_IMAGES)
        return shares[-1] >= 0.5

    stopped, _, _ = _interrupt(halfway_tree, out, signal.SIGINT, args=HALFWAY_ARGS, ready=halfway)
    assert stopped.returncode == 128 + signal.SIGINT, stopped.stderr
    assert shares[-1] < 0.75, f"stopped at {shares[-1]:.0%}, not halfway"
    assert re.search(r"interrupted: \d+ of 32 shards written", stopped.stderr), stopped.stderr
    finished = [resume.finished_shard(str(p.parent), p.name[:-len(".done.json")]) for p in _finished(out)]

    resumed = run_prepare("--input", str(halfway_tree), "--output", str(out), *HALFWAY_ARGS)
    assert resumed.returncode == 0, resumed.stderr
    shards, images = (int(n.replace(",", "")) for n in re.search(
        rf"resuming run \S+: (\d+) of 32 shards already written \(([\d,]+) of {HALFWAY_IMAGES:,} images\)",
        resumed.stderr).groups())
    assert (shards, images) == (len(finished), resume.images_in(finished))  # the finished shards' records
    kept = images / HALFWAY_IMAGES
    assert 0.4 <= kept < 1, f"kept {kept:.0%} of the images, stopped at {shares[-1]:.0%}"
    rate, seconds = re.search(r"then ([\d,]+) images/s for ([\d.]+) s", resumed.stdout).groups()
    processed = float(rate.replace(",", "")) * float(seconds)
    assert processed == pytest.approx(HALFWAY_IMAGES - images, rel=0.15, abs=30), resumed.stdout
    assert json.loads((out / "manifest.json").read_text())["counts"]["written"] == HALFWAY_IMAGES


def test_a_killed_run_resumes_and_a_tampered_shard_is_written_again(tree, uninterrupted, tmp_path):
    """SIGKILL to the whole process group, as a power loss: nothing runs after it."""
    out = tmp_path / "out"
    killed, _, _ = _interrupt(tree, out, signal.SIGKILL, whole_group=True)
    assert killed.returncode == -signal.SIGKILL
    finished = _finished(out)
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
    assert _digests(out) == uninterrupted  # duplicates.jsonl included
    assert_shard_checksums(out)  # kept shards' sha256 from their records, the rewritten ones' anew


def test_a_resumed_run_of_originals_counts_kept_and_reencoded_as_an_uninterrupted_one(tree, tmp_path):
    """The counts of the shards finished before the stop come from their records."""
    mixed = tmp_path / "mixed"
    shutil.copytree(tree, mixed)
    for label in ("ant", "bee", "cat", "dog"):
        for i in range(10):  # already 48x48: kept byte for byte
            (mixed / label / f"small_{i}.jpg").write_bytes(encode(picture(1000 + i, 48, 48), "JPEG", quality=90))
    args = (*ARGS, "--image_format", "original")
    whole = tmp_path / "whole"
    assert run_prepare("--input", str(mixed), "--output", str(whole), *args).returncode == 0
    out = tmp_path / "out"
    stopped, _, _ = _interrupt(mixed, out, signal.SIGTERM, "--image_format", "original")
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    resumed = run_prepare("--input", str(mixed), "--output", str(out), *args)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming run" in resumed.stderr
    assert _digests(out) == _digests(whole)
    assert sum(name.endswith(".tfrecord") for name in _digests(whole)) == SHARDS  # uncompressed, by default
    # Every other record is one of the fixture's photos, all larger than 48x48.
    resized = json.loads((whole / "manifest.json").read_text())["counts"]["written"] - 40
    assert resized > 200
    expected = {"kept": 40, "reencoded": resized, "reencoded_by_reason": {"resized": resized}}
    for folder in (whole, out):
        assert json.loads((folder / "manifest.json").read_text())["originals"] == expected
    assert "  originals kept byte for byte: 40" in resumed.stdout.splitlines()


def test_other_options_are_refused_and_overwrite_starts_over(tree, uninterrupted, tmp_path):
    out = tmp_path / "out"
    stopped, _, _ = _interrupt(tree, out, signal.SIGTERM)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    folder = _run_folder(out)
    before = sorted(p.name for p in folder.iterdir())

    other = [*ARGS[:1], "32", *ARGS[2:]]
    refused = run_prepare("--input", str(tree), "--output", str(out), *other)
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == (
        f"error: --output {out} holds unfinished run {folder.name}, started with --image_size 48x48 where "
        "this run has 32x32; run it with the same options to resume it, or pass --overwrite to start over")
    assert sorted(p.name for p in folder.iterdir()) == before

    fresh = run_prepare("--input", str(tree), "--output", str(out), *other, "--overwrite")
    assert fresh.returncode == 0, fresh.stderr
    assert "resuming" not in fresh.stderr
    assert json.loads((out / "manifest.json").read_text())["image"]["height"] == 32
    assert not (out / ".beam-prep").exists()


@pytest.fixture(scope="module")
def uninterrupted_as(tree, tmp_path_factory) -> Callable[[str], dict[str, str]]:
    """The digests of an uninterrupted run in ``--file_format``, made once a format."""
    made: dict[str, dict[str, str]] = {}

    def digests(file_format: str) -> dict[str, str]:
        if file_format not in made:
            out = tmp_path_factory.mktemp(f"whole-{file_format}") / "out"
            result = run_prepare("--input", str(tree), "--output", str(out), *ARGS, "--file_format", file_format)
            assert result.returncode == 0, result.stderr
            made[file_format] = _digests(out)
            assert len(made[file_format]) == SHARDS + len(DATASET_FILES)
        return made[file_format]

    return digests


@pytest.mark.parametrize("file_format, signum", [("array_record", signal.SIGKILL), ("webdataset", signal.SIGKILL)])
def test_every_file_format_resumes_to_the_bytes_of_an_uninterrupted_run(tree, uninterrupted_as, tmp_path,
                                                                         file_format, signum):
    """SIGKILL to the whole group, as a power loss: a format's shards torn mid-write. How SIGINT and
    SIGTERM stop a run does not depend on the format (test_a_stopped_run_ends_in_seconds...)."""
    out = tmp_path / "out"
    stopped, _, _ = _interrupt(tree, out, signum, "--file_format", file_format,
                               whole_group=signum == signal.SIGKILL)
    assert stopped.returncode in (-signal.SIGKILL, 128 + signum), stopped.stderr
    assert 2 <= len(_finished(out)) < SHARDS
    resumed = run_prepare("--input", str(tree), "--output", str(out), *ARGS, "--file_format", file_format)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming run" in resumed.stderr
    digests = _digests(out)
    suffix = {"array_record": ".array_record", "webdataset": ".tar"}[file_format]
    assert sum(name.endswith(suffix) for name in digests) == SHARDS
    assert digests == uninterrupted_as(file_format)


def test_a_resume_with_another_file_format_is_refused_naming_it(tree, tmp_path):
    out = tmp_path / "out"
    stopped, _, _ = _interrupt(tree, out, signal.SIGTERM)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    folder = _run_folder(out)
    before = sorted(p.name for p in folder.iterdir())
    refused = run_prepare("--input", str(tree), "--output", str(out), *ARGS, "--file_format", "array_record")
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == (
        f"error: --output {out} holds unfinished run {folder.name}, started with --file_format \"tfrecord\" where "
        'this run has "array_record"; run it with the same options to resume it, or pass --overwrite to start over')
    assert sorted(p.name for p in folder.iterdir()) == before


def test_an_interrupted_overwrite_resumes_without_it_and_replaces_the_dataset(tree, uninterrupted, tmp_path):
    out = tmp_path / "out"
    make_tree(tmp_path / "old", {"old": 2}, size=(24, 20))
    assert run_prepare("--input", str(tmp_path / "old"), "--output", str(out), *ARGS).returncode == 0
    old = (out / "manifest.json").read_text()

    stopped, _, _ = _interrupt(tree, out, signal.SIGINT, "--overwrite")
    assert stopped.stderr.splitlines()[-1].endswith(
        "run the same command without --overwrite to resume, or with it to start over"), stopped.stderr
    assert (out / "manifest.json").read_text() == old  # the old dataset is whole until the new one is

    resumed = run_prepare("--input", str(tree), "--output", str(out), *ARGS)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming run" in resumed.stderr
    assert _digests(out) == uninterrupted
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


def test_a_dry_run_prints_the_plan_and_writes_nothing(tmp_path):
    tree, out = tmp_path / "tree", tmp_path / "out"
    make_tree(tree, {"ant": 7, "bee": 5, "owl": 3}, size=(24, 20))
    (tree / "notes.txt").write_text("x")
    (tree / "ant" / "notes.txt").write_text("x")
    (tree / "loose.jpg").write_bytes((tree / "ant" / "img_000.jpg").read_bytes())
    labels = tmp_path / "labels.txt"
    labels.write_text("bee\nant\n")
    result = run_prepare("--input", str(tree), "--output", str(out), "--dry_run", "--labels_file", str(labels),
                         "--validation_percent", "40", "--num_shards", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert re.fullmatch(rf"dry run: {re.escape(str(tree))} lists 15 images in 2 labels \(bee, ant\); "
                        r"planned in [\d.]+ s, nothing written", lines[0]), lines
    train, validation = (int(re.search(rf"  {split}: (\d+) images in 2 shards", result.stdout).group(1))
                         for split in ("train", "validation"))
    assert train + validation == 12 and validation > 0
    assert "  not written, label not in --labels_file: 3 images (each would be reported in errors.jsonl)" in lines
    assert lines[-2:] == ["  skipped, image outside the label folders: 1", "  skipped, not an image file: 2"]
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


def test_a_resumed_run_with_a_table_writes_what_the_whole_run_writes(tree, tmp_path):
    """--metadata through a stop and a resume: the resumed run works from the listing its first
    launcher wrote, label lists and fields included, and ends with the uninterrupted run's records."""
    names = sorted(p.relative_to(tree).as_posix() for p in tree.glob("*/*.jpg"))
    table = tmp_path / "metadata.jsonl"
    table.write_text("".join(
        json.dumps({"file_name": name, "labels": sorted({name.split("/")[0], ("ant", "bee", "cat", "dog")[i % 4]}),
                    "caption": f"photo {i}", "score": i / 7}) + "\n" for i, name in enumerate(names)))
    args = (*ARGS, "--metadata", str(table))
    whole = tmp_path / "whole"
    assert run_prepare("--input", str(tree), "--output", str(whole), *args).returncode == 0
    out = tmp_path / "out"
    stopped, _, _ = _interrupt(tree, out, signal.SIGTERM, "--metadata", str(table))
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    assert 2 <= len(_finished(out)) < SHARDS, "the run ended before it could be stopped midway"
    resumed = run_prepare("--input", str(tree), "--output", str(out), *args)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming run" in resumed.stderr
    assert _digests(out) == _digests(whole)
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["multi_label"], manifest["extra_features"]) == (True, {"caption": "bytes", "score": "float"})
    assert manifest["counts"] == {"listed": len(names), "written": len(names) - 1, "failed": 1, "skipped": 2}
