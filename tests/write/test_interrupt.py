"""A signalled launcher stops its workers before it unwinds, whichever signal it got."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from beam_prep.write.run import interrupt

# A stand-in worker: a process whose command line names Beam's worker module, as the
# launcher's workers' do, and that says so once it runs, then runs until it is stopped.
STAND_IN = [sys.executable, "-c", "import time; print('running', flush=True); time.sleep(120)",
            "apache_beam.runners.worker.sdk_worker_main"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_workers_before_it_raises(signum):
    """Raised first, the interrupt would unwind through Beam's teardown, which waits for
    workers that go on writing shards meanwhile: the run would stop late, nobody knows where."""
    worker = subprocess.Popen(STAND_IN, stdout=subprocess.PIPE, text=True)
    try:
        # Until it has said so, it may still be the fork of this process, with this command line.
        assert worker.stdout.readline() == "running\n"
        assert interrupt.is_worker(psutil.Process(worker.pid))
        with pytest.raises(KeyboardInterrupt) as raised, interrupt.signals_as_interrupts():
            os.kill(os.getpid(), signum)
            time.sleep(5)  # ended by the handler's interrupt
        # Stopped (and reaped by psutil) before the interrupt was raised, not after.
        assert worker.poll() is not None or not psutil.pid_exists(worker.pid)
        assert interrupt.signal_of(raised.value) == signum
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        worker.stdout.close()


def test_the_handlers_before_are_back_outside():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with interrupt.signals_as_interrupts():
        assert signal.getsignal(signal.SIGINT) is not before[0]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def _stand_in(code: str) -> subprocess.Popen:
    """A process that runs ``code``, then says so and runs until it is stopped."""
    return subprocess.Popen([sys.executable, "-c", f"{code}\nimport time; print('running', flush=True); time.sleep(120)"],
                            stdout=subprocess.PIPE, text=True)


def _ended(process: subprocess.Popen) -> bool:
    return process.poll() is not None or not psutil.pid_exists(process.pid)


def test_a_worker_forked_from_its_launcher_is_known_by_its_name():
    """A fork keeps its launcher's command line: it names itself instead, and is stopped as any worker."""
    named = _stand_in("from beam_prep.write.run import interrupt; interrupt.name_worker()")
    unnamed = _stand_in("pass")
    try:
        assert named.stdout.readline() == unnamed.stdout.readline() == "running\n"
        assert psutil.Process(named.pid).name() == interrupt.WORKER_NAME
        assert interrupt.is_worker(psutil.Process(named.pid))
        assert not interrupt.is_worker(psutil.Process(unnamed.pid))
        assert interrupt.stop_workers() == 1
        assert _ended(named) and unnamed.poll() is None
    finally:
        for process in (named, unnamed):
            if process.poll() is None:
                process.kill()
                process.wait()
            process.stdout.close()


def test_a_process_forked_for_workers_is_stopped_before_it_has_a_name(monkeypatch):
    """From the fork on (``adopt``), not from when the fork names itself, and its own forks with it."""
    monkeypatch.setattr(interrupt, "_FORKED", set())
    parent = _stand_in("import subprocess, sys\n"
                       "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])")
    try:
        assert parent.stdout.readline() == "running\n"
        (child,) = psutil.Process(parent.pid).children()
        assert interrupt.stop_workers() == 0  # neither named nor adopted: not a worker
        interrupt.adopt(parent.pid)
        assert interrupt.stop_workers() == 2
        assert _ended(parent) and not child.is_running()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()
