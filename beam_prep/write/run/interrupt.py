"""Ending a local run on Ctrl-C, SIGTERM or a failure: within seconds, the processes it started stopped.

Beam's multi-process runner starts a process per worker that does not end
with its launcher's ``KeyboardInterrupt``, and SIGTERM ends a Python process
without unwinding at all. So while a local job runs, SIGINT and SIGTERM stop the
processes the run started, then raise in the main thread as Ctrl-C does;
whatever else stopped the job, the launcher stops them too. A run stops only
what it recorded as it started it (``Started``), never a process found by its
name or command line: a library caller's own processes go on.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

__all__ = ["WORKER_NAME", "Started", "Stopping", "name_worker", "signal_of", "signals_as_interrupts"]

_LOG = logging.getLogger(__name__)
# The process name (Linux's ``comm``: ``ps -e``) a worker forked from its launcher (``warm_pool``)
# gives itself, since it keeps the launcher's command line: for a person's ``ps``, at most 15 bytes.
WORKER_NAME = "beam-prep-work"
_PR_SET_NAME = 15  # prctl(2)
_STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How long a process told to stop (SIGTERM) has before it is killed.
GRACE_S = 3.0


class Started:
    """The processes a run started, each recorded as it started: its id with its start time
    (a ``psutil.Process``), so that a process that later reuses the id is never taken for it.

    ``stop`` ends them and the processes they started in turn (a worker's forks); one recorded
    after ``stop`` is ended as it is recorded. Thread-safe: the pool records from its thread.
    """

    def __init__(self) -> None:
        # Re-entrant: the signal handler stops the run in the main thread, which may hold it in ``add``.
        self._lock = threading.RLock()
        self._processes: list[psutil.Process] = []
        self._stopped = False

    def add(self, pid: int) -> bool:
        """Records process ``pid``, which the run started and which cannot have ended unseen (its
        parent has not reaped it, or it waits on the run). Returns False where ``stop`` has run:
        the process is then told to stop at once, and the run should not use it. This process
        itself, or no id (0: a peer in another pid namespace), is never recorded."""
        import psutil  # here: a run with no worker process never needs it

        process = None
        if 0 < pid != os.getpid():
            with contextlib.suppress(psutil.Error):  # gone already: nothing to stop
                process = psutil.Process(pid)
        with self._lock:
            if not self._stopped:
                if process is not None:
                    self._processes.append(process)
                return True
        if process is not None:
            with contextlib.suppress(psutil.Error):
                process.terminate()
        return False

    def stop(self, grace_s: float = GRACE_S) -> int:
        """Ends each recorded process still running and those it started: SIGTERM, then SIGKILL
        to any still running after ``grace_s``. Returns how many were running.

        A worker stopped in the middle of a shard leaves a file under a temporary name, which
        the next run writes again.
        """
        import psutil

        with self._lock:
            self._stopped = True
            recorded = list(self._processes)
        running: dict[int, psutil.Process] = {}
        for process in recorded:
            # ``is_running`` compares the start time too: an id reused since is not this process.
            with contextlib.suppress(psutil.Error):
                if process.is_running():
                    running.update((p.pid, p) for p in (process, *process.children(recursive=True)))
        processes = list(running.values())
        for process in processes:
            with contextlib.suppress(psutil.Error):
                process.terminate()
        _, alive = psutil.wait_procs(processes, timeout=grace_s)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(alive, timeout=grace_s)
        if processes:
            _LOG.debug("stopped %d worker processes", len(processes))
        return len(processes)


class _Signalled(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised where Ctrl-C's ``KeyboardInterrupt`` would be."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Stopping(list):
    """The records (``Started``) a signal stops (``signals_as_interrupts``). Once ``over`` is set (the
    run's dataset is published, and only its tidying up is left), a signal stops them and raises
    nothing: there is no work left to stop, and an interrupt would report a finished run as stopped."""

    over = False


@contextlib.contextmanager
def signals_as_interrupts() -> Iterator[Stopping]:
    """While inside, SIGINT and SIGTERM stop the processes of each record (``Started``) the caller
    adds to the list it is given, then raise ``KeyboardInterrupt`` (a subclass that names the
    signal) in the main thread, unless the list says the run is ``over``.

    The workers first: a launcher signalled alone (``kill``, a container stopped;
    a terminal's Ctrl-C reaches the workers too) would otherwise unwind through
    Beam's teardown, which waits for its workers while they go on writing shards,
    so the run would stop well after it was told to, and where nobody can say.
    Does nothing off the main thread, where Python cannot handle signals.
    """
    stopping = Stopping()
    if threading.current_thread() is not threading.main_thread():
        yield stopping
        return

    def handler(signum: int, frame: object) -> None:
        for started in stopping:
            started.stop()
        if not stopping.over:
            raise _Signalled(signum)
        _LOG.info("%s once the dataset was published: the run ends as it was", signal.Signals(signum).name)

    previous = {signum: signal.signal(signum, handler) for signum in _STOPPING_SIGNALS}
    try:
        yield stopping
    finally:
        for signum, then in previous.items():
            signal.signal(signum, then)


def signal_of(interrupt: KeyboardInterrupt) -> int:
    """The signal behind an interrupt: the one ours names, SIGINT for Python's own."""
    return getattr(interrupt, "signum", signal.SIGINT)


def name_worker() -> None:
    """Names this process ``WORKER_NAME``, for a person's ``ps`` (a fork of its launcher keeps the
    launcher's command line); does nothing where the system has no such name."""
    import ctypes  # here: only a forked worker names itself

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, WORKER_NAME.encode(), 0, 0, 0)
