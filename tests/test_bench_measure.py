"""The writer benchmark's measure of a command: with ``escaping``, the CPU of processes that escape
``RUSAGE_CHILDREN`` is counted, as Ray's do (its raylet ignores SIGCHLD, and its workers may outlive it)."""
from __future__ import annotations

import pathlib
import sys

import pytest

from benchmarks import measure
from benchmarks.measure import SAMPLE_SECONDS, run_measured

BURN_SECONDS = 0.8
BURN = f"import time\nwhile time.process_time() < {BURN_SECONDS}: pass"
# A command that starts a child in a session of its own and exits at once, leaving the child to burn
# BURN_SECONDS of CPU as an orphan.
ORPHANING = f"""
import subprocess, sys
subprocess.Popen([sys.executable, "-c", {BURN!r}], start_new_session=True)
"""
# A command that ignores SIGCHLD, so that the kernel reaps its child, which burns BURN_SECONDS of CPU
# (the wait returns once the child is gone, without its time).
IGNORING = f"""
import signal, subprocess, sys
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", {BURN!r}]).wait()
"""


@pytest.mark.slow  # starts subprocesses
def test_a_process_orphaned_by_the_command_is_waited_for_and_its_cpu_counted(tmp_path: pathlib.Path):
    counted = run_measured([sys.executable, "-c", ORPHANING], cwd=tmp_path, escaping=True)
    assert counted.returncode == 0 and counted.orphans_reaped == 1
    assert counted.cpu_seconds_rusage >= BURN_SECONDS and counted.cpu_seconds >= BURN_SECONDS
    missed = run_measured([sys.executable, "-c", ORPHANING], cwd=tmp_path)
    assert missed.orphans_reaped == 0 and missed.cpu_seconds < BURN_SECONDS  # gone to init with its CPU


@pytest.mark.slow  # starts subprocesses
def test_a_process_the_kernel_reaps_is_counted_from_its_samples(tmp_path: pathlib.Path):
    measured = run_measured([sys.executable, "-c", IGNORING], cwd=tmp_path, escaping=True)
    assert measured.returncode == 0
    assert measured.cpu_seconds_rusage < BURN_SECONDS  # the child's time reached no one
    assert measured.cpu_seconds == measured.cpu_seconds_sampled >= BURN_SECONDS - 2 * SAMPLE_SECONDS


@pytest.mark.slow  # starts subprocesses
def test_an_orphan_still_running_after_the_grace_period_is_killed(tmp_path: pathlib.Path, monkeypatch):
    monkeypatch.setattr(measure, "ORPHAN_GRACE_SECONDS", 0.5)
    lingering = ORPHANING.replace(repr(BURN), repr("import time; time.sleep(600)"))
    measured = run_measured([sys.executable, "-c", lingering], cwd=tmp_path, escaping=True)
    assert measured.returncode == 0 and measured.orphans_reaped == 1
