"""Stopping a local run midway, for the tests of resuming it: the photo tree whose run lasts
long enough to be stopped, the command started and signalled once its shards are under way,
and what a run folder and a dataset hold."""
from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import psutil
from helpers import REPO, encode, prepare_here

from beam_prep.tools.sample import picture
from beam_prep.write.journal import resume
from beam_prep.write.shared import layout
from pipelines.prepare_images import command

SHARDS = 16
# What decides the bytes ARGS' runs write (the shard count given, not the workers'): an
# uninterrupted run the tests compare a resumed one with is made in this process with these
# (``uninterrupted``), as the command's workers add nothing to what it writes.
WRITTEN_ARGS = ("--image_size", "48", "--num_shards", str(SHARDS))
ARGS = (*WRITTEN_ARGS, "--direct_num_workers", "2", "--direct_running_mode", "multi_processing")
# Enough photos that the run is still going when the test has seen two shards finish and
# pauses its workers (see photo_tree and interrupt).
PHOTOS_PER_LABEL = 40
DATASET_FILES = ("errors.jsonl", "skipped.jsonl", "labels.txt", "duplicates.jsonl", "README.md", "flat.jsonl")


def photo_tree(root: pathlib.Path) -> pathlib.Path:
    """Photos in 4 labels, a broken one, and copies, whose 16 shards keep the workers busy for
    a while after the first two are finished: time for the test to see it and pause them
    (``interrupt``) before they finish the rest.

    Progressive JPEGs without chroma subsampling: their decode costs several times a baseline
    JPEG's, which the kernel draft-decodes to 48 px almost for free (16 shards of those took
    a fraction of a second, on a loaded machine less than the signal took to reach the workers).
    """
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
    # A near duplicate of bee/img_004.jpg: half the size, at JPEG quality 50 (the resumed run must group it the same).
    picture(PHOTOS_PER_LABEL + 4, 640, 480).resize((320, 240)).save(root / "dog" / "near_e.jpg", quality=50)
    return root


def uninterrupted(tree: pathlib.Path, out: pathlib.Path, *extra: str) -> dict[str, str]:
    """The digests of what an uninterrupted run of ``tree`` with ARGS and ``extra`` writes to ``out``:
    the reference a resumed run must match, made in this process (``helpers.prepare_here``) with
    WRITTEN_ARGS, whose bytes are those of the command's run with ARGS (a resumed run that wrote
    other bytes fails its test either way)."""
    prepare_here("--input", str(tree), "--output", str(out), *WRITTEN_ARGS, *extra)
    return dataset_digests(out)


def dataset_digests(out: pathlib.Path) -> dict[str, str]:
    names = [p.name for p in out.iterdir() if layout.is_shard_name(p.name)] + list(DATASET_FILES)
    return {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in sorted(names)}


def run_folder(out: pathlib.Path) -> pathlib.Path:
    (folder,) = [p for p in (out / ".beam-prep").iterdir() if p.is_dir()]
    return folder


def finished_records(out: pathlib.Path) -> list[pathlib.Path]:
    """The records of the shards a resume takes for finished: those it can read, of any
    format and compression (originals are uncompressed unless asked)."""
    return sorted(p for p in (out / ".beam-prep").glob("*/*.done.json")
                  if resume.finished_shard(str(p.parent), p.name[:-len(".done.json")]) is not None)


def interrupt(tree: pathlib.Path, out: pathlib.Path, signum: int, *extra: str, whole_group: bool = False,
               args: tuple[str, ...] = ARGS, ready: Callable[[int], bool] | None = None,
               ) -> tuple[subprocess.CompletedProcess, float, list[int]]:
    """Starts the command, waits until ``ready(its pid)`` (by default: two shards are finished),
    sends ``signum``; the finished process, the seconds it took to end after the signal, and
    the pids of the processes it started.

    The moment the test sees the run ready, its worker processes are paused (SIGSTOP), so
    the run is stopped there however long the signal takes through the launcher on a loaded
    machine; they go on (SIGCONT) once the launcher has told each of them to stop (its SIGTERM
    is pending), which they then do first: the run is stopped where the test saw it, and its
    remaining work need only outlast the test's own look, not the signal's way as well. A
    SIGKILL to the whole group ends them paused, as a power loss would.
    """
    ready = ready or (lambda _: len(finished_records(out)) >= 2)
    process = subprocess.Popen(command("--input", str(tree), "--output", str(out), *args, *extra), cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: list(out.glob(f"{layout.WORK_DIR}/*/*.partial")), process, "a shard to be started")
        workers = [p.pid for p in psutil.Process(process.pid).children(recursive=True)]
        wait_for(lambda: ready(process.pid), process, "the run to be ready to stop")
        paused = _pause_workers(process.pid)
        sent = time.monotonic()
        (os.killpg if whole_group else os.kill)(process.pid, signum)
        if not whole_group:
            _resume_once_told_to_stop(paused)
        stdout, stderr = process.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), took, workers


def _pause_workers(pid: int) -> list[psutil.Process]:
    """SIGSTOP to the processes the launcher ``pid`` started (its workers, and the relays Beam started
    for them): the run's work stops here."""
    workers = psutil.Process(pid).children(recursive=True)
    assert workers, "no worker processes to pause"
    for worker in workers:
        worker.suspend()
    return workers


def _told_to_stop(worker: psutil.Process) -> bool:
    """Whether a paused worker has a SIGTERM waiting (or has ended): what it does first on SIGCONT."""
    try:
        if worker.status() == psutil.STATUS_ZOMBIE:
            return True
        fields = dict(line.split(":", 1) for line in pathlib.Path(f"/proc/{worker.pid}/status").read_text().splitlines())
    except (psutil.Error, OSError):
        return True
    pending = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
    return bool(pending & (1 << (signal.SIGTERM - 1)))


def _resume_once_told_to_stop(workers: list[psutil.Process], timeout: float = 30) -> None:
    """SIGCONT to the paused ``workers`` once the launcher has signalled each (or after ``timeout``:
    a launcher that never stops its workers lets them run on, and its test fails on what they do)."""
    deadline = time.monotonic() + timeout
    while not all(_told_to_stop(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.01)
    for worker in workers:
        try:
            worker.resume()
        except psutil.Error:
            pass


def wait_for(condition: Callable[[], Any], process: subprocess.Popen, what: str, timeout: float = 120) -> Any:
    """Polls ``condition`` until it gives something true, and returns that; fails if ``process`` ends first."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.02)
    return value
