"""A signalled or failed launcher stops the processes its run started, and no other one."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from helpers import REPO, make_tree, prepare_here
from interrupts import wait_for
from small_disk import small_disk

from beam_prep.errors import RunInterrupted
from beam_prep.write.finish import publication
from beam_prep.write.journal import progress
from beam_prep.write.run import interrupt
from beam_prep.write.run.claim import CLAIM_NAME
from beam_prep.write.run.warm_pool import WORKER_MODULE
from beam_prep.write.shared import layout
from pipelines.prepare_images import command

pytestmark = pytest.mark.slow  # each test starts processes

# What ran a process before it says it runs: the lines a stand-in prints then.
RUNNING = "running\n"


def _stand_in(code: str = "pass", *args: str) -> subprocess.Popen:
    """A process that runs ``code``, then says so and runs until it is stopped; ``args`` end its
    command line (``WORKER_MODULE``: named as Beam's workers are)."""
    process = subprocess.Popen([sys.executable, "-c", f"{code}\nimport time; print('running', flush=True); "
                                "time.sleep(120)", *args], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == RUNNING
    return process


def _ended(process: subprocess.Popen) -> bool:
    return process.poll() is not None or not psutil.pid_exists(process.pid)


def _end(*processes: subprocess.Popen) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()


def _looks_like_ours() -> list[subprocess.Popen]:
    """Processes a run did not start that look like its workers: one whose command line names
    Beam's worker module, and one named as a worker forked from its launcher is."""
    return [_stand_in("pass", WORKER_MODULE),
            _stand_in("from beam_prep.write.run import interrupt; interrupt.name_worker()")]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_runs_processes_before_it_raises(signum):
    """Raised first, the interrupt would unwind through Beam's teardown, which waits for
    workers that go on writing shards meanwhile: the run would stop late, nobody knows where.
    A process that only looks like a worker, not the run's, goes on."""
    worker = _stand_in("pass", WORKER_MODULE)
    others = _looks_like_ours()
    try:
        started = interrupt.Started()
        assert started.add(worker.pid)
        with pytest.raises(KeyboardInterrupt) as raised, interrupt.signals_as_interrupts() as stopping:
            stopping.append(started)
            os.kill(os.getpid(), signum)
            time.sleep(5)  # ended by the handler's interrupt
        # Stopped (and reaped by psutil) before the interrupt was raised, not after.
        assert _ended(worker)
        assert interrupt.signal_of(raised.value) == signum
        assert [other.poll() for other in others] == [None, None]
    finally:
        _end(worker, *others)


def test_the_handlers_before_are_back_outside():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with interrupt.signals_as_interrupts():
        assert signal.getsignal(signal.SIGINT) is not before[0]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_worker_forked_from_its_launcher_names_itself_for_ps_alone():
    """Its name is for a person's ``ps``: a run that did not record it leaves it running."""
    named, = others = _looks_like_ours()[1:]
    try:
        assert psutil.Process(named.pid).name() == interrupt.WORKER_NAME
        assert interrupt.Started().stop() == 0
        assert named.poll() is None
    finally:
        _end(*others)


def test_a_recorded_process_is_stopped_with_the_processes_it_started():
    """Its own forks too (a warm worker's copies), recorded or not; nothing else."""
    parent = _stand_in("import subprocess, sys\n"
                       "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])")
    others = _looks_like_ours()
    try:
        (child,) = psutil.Process(parent.pid).children()
        started = interrupt.Started()
        assert started.add(parent.pid)
        assert started.stop() == 2
        assert _ended(parent) and not child.is_running()
        assert [other.poll() for other in others] == [None, None]
    finally:
        _end(parent, *others)


def test_a_process_recorded_once_the_run_stopped_is_stopped_at_once():
    """A relay that reaches the pool after the run stopped its processes is not served: ended."""
    started = interrupt.Started()
    assert started.stop() == 0
    late = _stand_in()
    try:
        assert not started.add(late.pid)
        assert late.wait(timeout=30) == -signal.SIGTERM
    finally:
        _end(late)


def test_a_recorded_process_that_ended_is_not_signalled():
    """Recorded with its start time (``psutil.Process``): once it has ended, its id may name another
    process, which is not the one recorded."""
    gone = _stand_in()
    started = interrupt.Started()
    assert started.add(gone.pid)
    _end(gone)
    assert started.stop() == 0


def test_this_process_is_never_recorded():
    started = interrupt.Started()
    assert started.add(os.getpid()) and started.add(0)
    assert started.stop() == 0


# A library caller: its main thread runs ``beam_prep.prepare``, which fails on a full disk, while its
# other thread runs a multi-process Beam pipeline of its own (held until prepare is over) and two
# processes that look like beam-prep's workers (a command line naming Beam's worker module, and
# the name a forked worker gives itself). What it saw, as JSON.
_CALLER = r"""
import json, os, pathlib, subprocess, sys, threading, time
import apache_beam as beam
import psutil
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
import beam_prep
from beam_prep.write.run.warm_pool import WORKER_MODULE

flags, tree, out = map(pathlib.Path, sys.argv[1:4])
WAIT_S = 120


def wait_for(condition, what):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT_S} s for {what}"
        time.sleep(0.02)


class Hold(beam.DoFn):
    # Each element says which worker holds it, then waits for the word that prepare is over.
    def process(self, element):
        (flags / f"worker-{os.getpid()}").touch()
        deadline = time.monotonic() + WAIT_S
        while not (flags / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        yield element


facts = {}
STAND_IN = "import sys, time; open(sys.argv[1], 'w').close(); time.sleep(600)"


def callers_own_work():
    own = [subprocess.Popen([sys.executable, "-c", STAND_IN, str(flags / "module"), WORKER_MODULE]),
           subprocess.Popen([sys.executable, "-c", "from beam_prep.write.run import interrupt; "
                             "interrupt.name_worker(); " + STAND_IN, str(flags / "named")])]
    try:
        options = PipelineOptions(["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
        with beam.Pipeline(runner=FnApiRunner(), options=options) as p:
            _ = (p | beam.Create(range(4)) | beam.Reshuffle() | beam.ParDo(Hold())
                 | beam.combiners.Count.Globally() | beam.Map(lambda n: (flags / "count").write_text(str(n))))
        facts["pipeline"] = (flags / "count").read_text()
    except Exception as e:
        facts["pipeline"] = repr(e)
    finally:
        facts["own"] = [p.poll() for p in own]
        for p in own:
            p.kill()
            p.wait()


def alive(process):
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


thread = threading.Thread(target=callers_own_work)
thread.start()
wait_for(lambda: all((flags / name).exists() for name in ("module", "named")), "the caller's processes")
wait_for(lambda: list(flags.glob("worker-*")), "the caller's pipeline to run")
me = psutil.Process()
before = me.children(recursive=True)
try:
    beam_prep.prepare(str(tree), str(out), image_format="raw", image_size=64, direct_num_workers=2,
                      direct_running_mode="multi_processing")
    facts["prepare"] = "written"
except Exception as e:
    facts["prepare"] = str(e)
facts["survived"] = [alive(p) for p in before]
facts["left"] = [" ".join(p.cmdline()) for p in me.children(recursive=True) if p not in before and alive(p)]
(flags / "go").touch()
thread.join(timeout=3 * WAIT_S)
facts["joined"] = not thread.is_alive()
print(json.dumps(facts), flush=True)
os._exit(0)
"""


def test_a_failed_library_run_leaves_its_callers_own_processes_running(tmp_path):
    """``beam_prep.prepare`` fails on a full disk (a 300 KB tmpfs) while its caller's other thread
    runs a multi-process pipeline: the run stops what it started, and the caller's pipeline
    workers and look-alike processes go on, and its pipeline finishes."""
    make_tree(tmp_path / "in", {"a": 30, "b": 30}, size=(64, 64), fmt="PNG", ext=".png")  # 720 KB of raw pixels
    (tmp_path / "flags").mkdir()
    with small_disk(tmp_path / "disk") as disk:
        ran = subprocess.run([sys.executable, "-c", _CALLER, str(tmp_path / "flags"), str(tmp_path / "in"),
                              str(disk / "out")], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr
    facts = json.loads(ran.stdout.splitlines()[-1])
    assert "No space left on device" in facts["prepare"], facts
    assert facts["survived"] and all(facts["survived"]), facts
    assert facts["left"] == [], facts  # what the run started is gone once it has failed
    assert facts["joined"] and facts["pipeline"] == "4" and facts["own"] == [None, None], facts


def _session(leader: int) -> list[psutil.Process]:
    """The live processes of the session ``leader`` started (``start_new_session``), wherever they were
    re-parented."""
    found = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == leader and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (OSError, psutil.Error):
            continue
    return found


def test_a_launcher_killed_as_its_workers_start_leaves_none_running(tmp_path):
    """SIGKILL gives the launcher no chance to stop anything: without warm workers
    (``BEAM_PREP_WARM_WORKERS=0``) each relay runs Beam's worker as its child and ends it once the
    launcher is gone. Beam's worker alone, killed as it started (before it reached the launcher's
    control service), waited for ever, re-parented to init."""
    make_tree(tmp_path / "in", {"a": 20, "b": 20}, size=(64, 48))
    process = subprocess.Popen(command("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                                       "--image_size", "16", "--direct_num_workers", "2",
                                       "--direct_running_mode", "multi_processing"), cwd=REPO,
                               env={**os.environ, "BEAM_PREP_WARM_WORKERS": "0"}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: [p for p in _session(process.pid) if p.cmdline()[1:3] == ["-m", WORKER_MODULE]], process,
                 "Beam's worker to start")
        process.kill()
        process.wait()
        deadline = time.monotonic() + 60  # bounded: a loaded machine's seconds, never a worker's for ever
        while (left := _session(process.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left == [], [" ".join(p.cmdline())[:120] for p in left]
    finally:
        for leftover in _session(process.pid):
            with contextlib.suppress(psutil.Error):
                leftover.kill()
        process.stderr.close()


def _signalled_after(monkeypatch, module: object, name: str, calls: int = 1) -> None:
    """``module.name`` sends this process SIGTERM as its ``calls``-th call returns: the run's handler
    then interrupts it right there, as a person's signal landing at that moment would."""
    original = getattr(module, name)
    count = [0]

    def signalling(*args, **kwargs):
        value = original(*args, **kwargs)
        count[0] += 1
        if count[0] == calls:
            os.kill(os.getpid(), signal.SIGTERM)
        return value

    monkeypatch.setattr(module, name, signalling)


def _published(out) -> tuple[dict, list[str]]:
    """The output's manifest, and the run folders left in it."""
    return json.loads((out / "manifest.json").read_text()), layout.unfinished_runs(str(out), CLAIM_NAME)


@pytest.mark.parametrize("when", ["as the publication ends", "as the run tidies up after it"])
def test_a_signal_once_the_dataset_is_published_ends_the_run_as_written(tmp_path, monkeypatch, when):
    """SIGTERM as the last step of the publication is done (the run folder gone), or after it while
    the run tidies up: the run's work is over, so it ends as a run that was not signalled, its
    dataset reported written, not as one interrupted ("0 of 2 shards written", and a rerun that
    refuses the folder for the dataset in it)."""
    make_tree(tmp_path / "in", {"a": 3, "b": 3}, size=(20, 16))
    if when == "as the publication ends":
        _signalled_after(monkeypatch, publication, "carry_out")
    else:
        _signalled_after(monkeypatch, progress, "read_progress")
    try:
        manifest = prepare_here("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                                "--image_size", "16", "--num_shards", "2")
    except KeyboardInterrupt as e:  # a failure of this test, not pytest's own Ctrl-C
        pytest.fail(f"interrupted: {e!r}")
    assert manifest["counts"]["written"] == 6
    assert _published(tmp_path / "out") == (manifest, [])


def test_a_signal_while_publishing_says_the_same_command_finishes_it(tmp_path, monkeypatch):
    """SIGTERM after the publication's first move: the run says it stopped while publishing and that
    the same command finishes it (not "0 of 2 shards written... to resume"), which it does."""
    make_tree(tmp_path / "in", {"a": 3, "b": 3}, size=(20, 16))
    args = ("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--image_size", "16",
            "--num_shards", "2")
    with monkeypatch.context() as patched:
        _signalled_after(patched, publication, "_move")
        with pytest.raises(KeyboardInterrupt) as stopped:  # any, not to end pytest's session
            prepare_here(*args)
    assert isinstance(stopped.value, RunInterrupted), repr(stopped.value)
    assert str(stopped.value) == (f"stopped while publishing its dataset into {tmp_path / 'out'}: run the same "
                                  "command again to finish publishing it")
    assert stopped.value.signum == signal.SIGTERM and stopped.value.resumable
    manifest = prepare_here(*args)
    assert manifest["counts"]["written"] == 6 and _published(tmp_path / "out") == (manifest, [])
