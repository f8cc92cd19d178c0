"""Runs a command as a user would and measures its wall time, CPU time and peak memory.

CPU time and memory are the whole process tree's: the command and every child
it starts, e.g. Beam's SDK workers. CPU time is what the children this process
waited for (and theirs) used (``RUSAGE_CHILDREN``), which a machine shared with
other work moves far less than wall time. Memory is the peak of the summed
resident set size, sampled in a thread. Summing RSS counts pages shared between
processes once per process, so it is an upper bound, and it is what a user's
monitor (or an OOM killer's accounting of a container) adds up.
"""
from __future__ import annotations

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

    def seconds_until_written(self, path: pathlib.Path) -> float:
        """From command start until ``path`` was last written (its mtime)."""
        return path.stat().st_mtime - self.started_at


class TreeMemorySampler:
    """Keeps the peak summed RSS of a process and all its descendants, and with ``private`` their
    peak summed PSS and USS too (read from smaps: slower, so only where asked)."""

    def __init__(self, pid: int, interval: float = SAMPLE_SECONDS, private: bool = False) -> None:
        self._root = psutil.Process(pid)
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

    def _sample(self) -> int:
        try:
            processes = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:  # The root has exited.
            return 0
        total = pss = uss = 0
        for process in processes:
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
    command: Sequence[str], cwd: pathlib.Path, env: dict[str, str] | None = None, private: bool = False
) -> Measured:
    """Runs ``command`` to completion, timed from start to exit, sampling its tree's memory.

    Output goes to temporary files rather than pipes so a chatty command can
    never block on a full pipe while we wait for it.
    """
    log.info("running %s", " ".join(command))
    # The previous run's output is still being written back to disk: flush it now,
    # so that its writeback does not take CPU from (and time away from) this run.
    os.sync()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started_at = time.time()
        start = time.perf_counter()
        process = subprocess.Popen(
            list(command), cwd=cwd, env={**os.environ, **(env or {})}, stdout=out, stderr=err
        )
        try:
            with TreeMemorySampler(process.pid, private=private) as sampler:
                returncode = process.wait()
            seconds = time.perf_counter() - start
        finally:
            if process.poll() is None:  # Interrupted: leave no workers behind.
                _kill_tree(process.pid)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        out.seek(0)
        err.seek(0)
        return Measured(seconds, sampler.peak_bytes, returncode, out.read(), err.read()[-TAIL_CHARS:],
                        started_at, cpu, sampler.peak_pss_bytes, sampler.peak_uss_bytes)


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
