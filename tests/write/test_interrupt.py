"""A signalled launcher stops its workers before it unwinds, whichever signal it got."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from beam_prep.write import interrupt

# A stand-in worker: a process whose command line names Beam's worker module, as the
# launcher's workers' do, and that runs until it is stopped.
STAND_IN = [sys.executable, "-c", "import time; time.sleep(120)", "apache_beam.runners.worker.sdk_worker_main"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_workers_before_it_raises(signum):
    """Raised first, the interrupt would unwind through Beam's teardown, which waits for
    workers that go on writing shards meanwhile: the run would stop late, nobody knows where."""
    worker = subprocess.Popen(STAND_IN)
    try:
        # Between fork and exec the child still has the test's command line: wait for its own.
        deadline = time.monotonic() + 60
        while not interrupt.is_worker(psutil.Process(worker.pid)):
            assert time.monotonic() < deadline, "the stand-in worker did not start in 60 s"
            time.sleep(0.01)
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


def test_the_handlers_before_are_back_outside():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with interrupt.signals_as_interrupts():
        assert signal.getsignal(signal.SIGINT) is not before[0]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
