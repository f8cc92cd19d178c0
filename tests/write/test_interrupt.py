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
