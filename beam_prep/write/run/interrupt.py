"""Ending a local run on Ctrl-C or SIGTERM: within seconds, its worker processes stopped.

Beam's multi-process runner starts a process per worker that does not end
with its launcher's ``KeyboardInterrupt``, and SIGTERM ends a Python process
without unwinding at all. So while a local job runs, SIGINT and SIGTERM stop the
worker processes the launcher started, then raise in the main thread as Ctrl-C
does; whatever else stopped the job, the launcher ends them too before it says
what was kept.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

__all__ = ["WORKER_MODULE", "WORKER_NAME", "adopt", "is_worker", "name_worker", "signal_of", "signals_as_interrupts",
           "stop_workers"]

_LOG = logging.getLogger(__name__)
# What names a Beam SDK worker process in its command line (SubprocessSDKEnvironment's command).
WORKER_MODULE = "apache_beam.runners.worker.sdk_worker_main"
# The process name (Linux's ``comm``: ``ps -e``, ``psutil.Process.name``) of a worker forked from
# its launcher (``warm_pool``), whose command line is the launcher's: at most 15 bytes.
WORKER_NAME = "beam-prep-work"
_PR_SET_NAME = 15  # prctl(2)
# Workers this process forked (``adopt``): found by their id from the fork on, before they are named.
_FORKED: set[int] = set()
_STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Signalled(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised where Ctrl-C's ``KeyboardInterrupt`` would be."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM stop the workers (``stop_workers``), then raise
    ``KeyboardInterrupt`` (a subclass that names the signal) in the main thread.

    The workers first: a launcher signalled alone (``kill``, a container stopped;
    a terminal's Ctrl-C reaches the workers too) would otherwise unwind through
    Beam's teardown, which waits for its workers while they go on writing shards,
    so the run would stop well after it was told to, and where nobody can say.
    Does nothing off the main thread, where Python cannot handle signals.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        stop_workers()
        raise _Signalled(signum)

    previous = {signum: signal.signal(signum, handler) for signum in _STOPPING_SIGNALS}
    try:
        yield
    finally:
        for signum, then in previous.items():
            signal.signal(signum, then)


def signal_of(interrupt: KeyboardInterrupt) -> int:
    """The signal behind an interrupt: the one ours names, SIGINT for Python's own."""
    return getattr(interrupt, "signum", signal.SIGINT)


def adopt(pid: int) -> None:
    """Counts process ``pid``, forked from this one to serve as workers, and its own forks among
    the workers ``stop_workers`` ends, whatever their name."""
    _FORKED.add(pid)


def name_worker() -> None:
    """Names this process ``WORKER_NAME``, for ``is_worker`` (a fork of its launcher, which keeps
    the launcher's command line); does nothing where the system has no such name."""
    import ctypes  # here: only a forked worker names itself

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, WORKER_NAME.encode(), 0, 0, 0)


def stop_workers(grace_s: float = 3.0) -> int:
    """Ends the Beam SDK worker processes this process started; returns how many were running.

    Each gets SIGTERM, and SIGKILL if it has not ended after ``grace_s``. A
    worker stopped in the middle of a shard leaves a file under a temporary
    name, which the next run writes again.
    """
    import psutil  # imported here: only a stopped local run needs it

    try:
        workers = [p for p in psutil.Process().children(recursive=True) if is_worker(p) or _forked(p)]
    except psutil.Error:
        return 0
    for worker in workers:
        with contextlib.suppress(psutil.Error):
            worker.terminate()
    _, alive = psutil.wait_procs(workers, timeout=grace_s)
    for worker in alive:
        with contextlib.suppress(psutil.Error):
            worker.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    if workers:
        _LOG.debug("stopped %d worker processes", len(workers))
    return len(workers)


def is_worker(process) -> bool:
    """Whether a ``psutil.Process`` is a Beam SDK worker, by its command line or, forked from its
    launcher, by its name (``WORKER_NAME``)."""
    try:
        return process.name() == WORKER_NAME or any(WORKER_MODULE in part for part in process.cmdline())
    except Exception:  # noqa: BLE001 - gone already, or not ours to see
        return False


def _forked(process) -> bool:
    """Whether a ``psutil.Process`` is one this process forked for workers (``adopt``), or a fork of one."""
    try:
        return process.pid in _FORKED or process.ppid() in _FORKED
    except Exception:  # noqa: BLE001 - gone already
        return False
