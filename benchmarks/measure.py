"""Runs a command as a user would and measures its wall time, CPU time and peak memory.

CPU time and memory are the whole process tree's: the command and every child
it starts, e.g. Beam's SDK workers. CPU time is what the children this process
waited for (and theirs) used (``RUSAGE_CHILDREN``), which a machine shared with
other work moves far less than wall time. Memory is the peak of the summed
resident set size, sampled in a thread. Summing RSS counts pages shared between
processes once per process, so it is an upper bound, and it is what a user's
monitor (or an OOM killer's accounting of a container) adds up.

Some trees' CPU escapes ``RUSAGE_CHILDREN``. A process whose parent exits before
it is handed to init; a process whose parent ignores ``SIGCHLD`` is reaped by the
kernel as it exits, its time added to no one's. Ray does both: its raylet ignores
``SIGCHLD``, and its workers may outlive the raylet. ``run_measured(...,
escaping=True)`` then (Linux only) makes this process the *subreaper* of the tree
while it runs (``PR_SET_CHILD_SUBREAPER``), so that orphans are handed to it
rather than to init, and samples every process of the tree, adopted orphans
included, for its own CPU time as well as its memory, until the last orphan has
exited (it is killed after a grace period) and been reaped here, its final time
read from its zombie first. Both figures are then lower bounds of the tree's
CPU: ``RUSAGE_CHILDREN`` misses what the kernel reaped, the samples each
process's last interval (at most ``SAMPLE_SECONDS``) and processes shorter than
one; the larger is taken, and both are kept.
"""
from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import os
import pathlib
import resource
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence

import psutil

log = logging.getLogger(__name__)

SAMPLE_SECONDS = 0.1
TAIL_CHARS = 4000
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
# How long processes the command left behind may take to exit once it has before they are killed.
ORPHAN_GRACE_SECONDS = 10.0


@dataclasses.dataclass(frozen=True)
class Measured:
    """How a finished command went; ``stdout`` whole, ``stderr_tail`` for error reports."""

    seconds: float
    peak_rss_bytes: int
    returncode: int
    stdout: str
    stderr_tail: str
    started_at: float  # time.time() at start, to time files the command writes
    cpu_seconds: float = 0.0  # user + system time of the command and every process under it
    # Peak summed PSS (shared pages split between their processes) and USS (pages only one process
    # maps) of the tree, where ``run_measured`` was asked for them: RSS counts a shared page once a process.
    peak_pss_bytes: int = 0
    peak_uss_bytes: int = 0
    # With ``escaping``: the tree's processes handed to this process and reaped here, and the two
    # lower bounds of its CPU that ``cpu_seconds`` is the larger of (RUSAGE_CHILDREN's, and the sum
    # of every process's own CPU time as last sampled).
    orphans_reaped: int = 0
    cpu_seconds_rusage: float | None = None
    cpu_seconds_sampled: float | None = None

    def seconds_until_written(self, path: pathlib.Path) -> float:
        """From command start until ``path`` was last written (its mtime)."""
        return path.stat().st_mtime - self.started_at


class TreeMemorySampler:
    """Keeps the peak summed RSS of a process and all its descendants, and with ``private`` their
    peak summed PSS and USS too (read from smaps: slower, so only where asked). With ``adopted``, the
    pids of this process's children before the run: every other child of this process (the tree's
    orphans, where it is their subreaper) and its descendants count too, and each process's own CPU
    time as last seen is kept (``cpu_seconds``)."""

    def __init__(self, pid: int, interval: float = SAMPLE_SECONDS, private: bool = False,
                 adopted: set[int] | None = None) -> None:
        self._root = psutil.Process(pid)
        self._adopted = adopted
        self._cpu: dict[tuple[int, float], float] = {}  # by (pid, start time): user + system seconds
        self._lock = threading.Lock()
        self._private = private
        self.peak_pss_bytes = 0
        self.peak_uss_bytes = 0
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self.peak_bytes = 0

    def __enter__(self) -> TreeMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.peak_bytes = max(self.peak_bytes, self._sample())
            if self._stop.wait(self._interval):
                return

    @property
    def cpu_seconds(self) -> float:
        """The sum of every sampled process's own CPU time, as last seen."""
        with self._lock:
            return sum(self._cpu.values())

    def record_cpu(self, process: psutil.Process) -> None:
        """Keeps ``process``'s own CPU time now (a zombie's is its final one)."""
        try:
            times = process.cpu_times()
            key = (process.pid, process.create_time())
        except psutil.Error:
            return
        with self._lock:
            self._cpu[key] = max(self._cpu.get(key, 0.0), times.user + times.system)

    def _sample(self) -> int:
        try:
            processes = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:  # The root has exited.
            if self._adopted is None:
                return 0
            processes = []
        if self._adopted is not None:
            processes += _orphans(self._adopted | {self._root.pid}, recursive=True)
        total = pss = uss = 0
        for process in processes:
            if self._adopted is not None:
                self.record_cpu(process)
            try:
                if self._private:
                    full = process.memory_full_info()
                    total, pss, uss = total + full.rss, pss + full.pss, uss + full.uss
                else:
                    total += process.memory_info().rss
            except psutil.Error:  # A child exited between listing and reading.
                continue
        self.peak_pss_bytes = max(self.peak_pss_bytes, pss)
        self.peak_uss_bytes = max(self.peak_uss_bytes, uss)
        return total


def run_measured(
    command: Sequence[str], cwd: pathlib.Path, env: dict[str, str] | None = None, private: bool = False,
    escaping: bool = False,
) -> Measured:
    """Runs ``command`` to completion, timed from start to exit, sampling its tree's memory.

    Output goes to temporary files rather than pipes so a chatty command can
    never block on a full pipe while we wait for it. With ``escaping`` the CPU
    of processes that escape ``RUSAGE_CHILDREN`` is counted too (the module's
    docstring says how); the wall time still ends at the command's exit.
    """
    log.info("running %s", " ".join(command))
    # The previous run's output is still being written back to disk: flush it now,
    # so that its writeback does not take CPU from (and time away from) this run.
    os.sync()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        adopted = None
        if escaping:
            adopted = {child.pid for child in psutil.Process().children()}
            _set_subreaper(True)
        started_at = time.time()
        start = time.perf_counter()
        orphans = 0
        try:
            process = subprocess.Popen(
                list(command), cwd=cwd, env={**os.environ, **(env or {})}, stdout=out, stderr=err
            )
            try:
                with TreeMemorySampler(process.pid, private=private, adopted=adopted) as sampler:
                    returncode = process.wait()
                    seconds = time.perf_counter() - start
                    if adopted is not None:
                        orphans = _reap_orphans(adopted | {process.pid}, sampler)
            finally:
                if process.poll() is None:  # Interrupted: leave no workers behind.
                    _kill_tree(process.pid)
                    if adopted is not None:
                        _reap_orphans(adopted | {process.pid}, None)
        finally:
            if escaping:
                _set_subreaper(False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        rusage_cpu = sampled_cpu = None
        if escaping:
            rusage_cpu, sampled_cpu = cpu, sampler.cpu_seconds
            cpu = max(rusage_cpu, sampled_cpu)
        out.seek(0)
        err.seek(0)
        return Measured(seconds, sampler.peak_bytes, returncode, out.read(), err.read()[-TAIL_CHARS:],
                        started_at, cpu, sampler.peak_pss_bytes, sampler.peak_uss_bytes, orphans,
                        rusage_cpu, sampled_cpu)


def _set_subreaper(on: bool) -> None:
    """Makes this process (or stops it being) the reaper of its descendants' orphans: Linux only."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _orphans(known: set[int], recursive: bool = False) -> list[psutil.Process]:
    """This process's children but ``known`` (with their descendants if ``recursive``)."""
    found = []
    try:
        children = [child for child in psutil.Process().children() if child.pid not in known]
    except psutil.Error:
        return []
    for child in children:
        found.append(child)
        if recursive:
            try:
                found += child.children(recursive=True)
            except psutil.Error:
                continue
    return found


def _reap_orphans(known: set[int], sampler: TreeMemorySampler | None) -> int:
    """Reaps the children this process adopted as subreaper (all but ``known``) as they exit, each one's
    final CPU time given to ``sampler`` first; kills those still running ``ORPHAN_GRACE_SECONDS`` on.
    Returns how many it reaped. A reaped child's children were adopted in turn, and are reaped next."""
    deadline = time.monotonic() + ORPHAN_GRACE_SECONDS
    reaped = 0
    warned = False
    while orphans := _orphans(known):
        for orphan in orphans:
            try:
                if orphan.status() != psutil.STATUS_ZOMBIE:
                    continue
                if sampler is not None:
                    sampler.record_cpu(orphan)
                orphan.wait(timeout=0)
                reaped += 1
            except (psutil.Error, psutil.TimeoutExpired):
                continue
        if time.monotonic() >= deadline:  # and again for any adopted since
            alive = _orphans(known, recursive=True)
            if not warned:
                log.warning("killing %d processes the command left running %.0f s after it exited", len(alive),
                            ORPHAN_GRACE_SECONDS)
                warned = True
            for process in alive:
                try:
                    process.kill()
                except psutil.Error:
                    continue
        time.sleep(SAMPLE_SECONDS / 2)
    if reaped:
        log.info("reaped %d processes the command's tree left behind", reaped)
    return reaped


def _kill_tree(pid: int) -> None:
    try:
        root = psutil.Process(pid)
        processes = [*root.children(recursive=True), root]
    except psutil.Error:
        return
    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(processes, timeout=5)


def directory_bytes(path: pathlib.Path) -> int:
    """Total size of the files under ``path``: what a run wrote."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def check_manifest(path: pathlib.Path, images: int) -> str | None:
    """The pipeline writes its manifest last: without it, or short of images, the run did not finish."""
    try:
        written = json.loads(path.read_text())["counts"]["written"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"no usable manifest at {path.name}: {e!r}"
    if written != images:
        return f"manifest counts.written is {written}, corpus has {images} images"
    return None
