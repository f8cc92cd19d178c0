"""Ending a local run on Ctrl-C or SIGTERM: within seconds, its worker processes stopped.

Beam's multi-process runner starts a process per worker that does not end
with its launcher's ``KeyboardInterrupt``, and SIGTERM ends a Python process
without unwinding at all. So while a local job runs, SIGTERM raises in the main
thread as Ctrl-C does, and whatever stopped the job, the launcher ends the
worker processes it started before it says what was kept.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Iterator

__all__ = ["signal_of", "signals_as_interrupts", "stop_workers"]

_LOG = logging.getLogger(__name__)
# What names a Beam SDK worker process in its command line (SubprocessSDKEnvironment's command).
_WORKER_MODULE = "apache_beam.runners.worker.sdk_worker_main"


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's ``KeyboardInterrupt`` would be."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """While inside, SIGTERM raises ``KeyboardInterrupt`` (a subclass) in the main thread.

    Does nothing off the main thread, where Python cannot handle signals.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise _Terminated(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def signal_of(interrupt: KeyboardInterrupt) -> int:
    """The signal behind an interrupt: SIGTERM for ours, SIGINT for Python's own."""
    return getattr(interrupt, "signum", signal.SIGINT)


def stop_workers(grace_s: float = 3.0) -> int:
    """Ends the Beam SDK worker processes this process started; returns how many were running.

    Each gets SIGTERM, and SIGKILL if it has not ended after ``grace_s``. A
    worker stopped in the middle of a shard leaves a file under a temporary
    name, which the next run writes again.
    """
    import psutil  # imported here: only a stopped local run needs it

    try:
        workers = [p for p in psutil.Process().children(recursive=True) if _is_worker(p)]
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


def _is_worker(process) -> bool:
    try:
        return any(_WORKER_MODULE in part for part in process.cmdline())
    except Exception:  # noqa: BLE001 - gone already, or not ours to see
        return False
