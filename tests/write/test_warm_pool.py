"""A local run's workers start while it lists (``warm_pool``): the run is served by them, a relay
without one starts Beam's own worker, nothing is left running, and only this user reaches them."""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid

import psutil
import pytest
from helpers import REPO, make_tree, run_prepare

import beam_prep
from beam_prep.cli.early import early_workers, start_workers_early
from beam_prep.errors import OptionsError
from beam_prep.write.run import interrupt, warm_pool, warm_worker

pytestmark = pytest.mark.slow

POOL_LOG = "beam_prep.write.run.warm_pool"


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("warm") / "in"
    make_tree(root, {"a": 6, "b": 6}, size=(20, 16))
    return root


def waiting_workers() -> set[int]:
    """This process's waiting workers, by their command line."""
    return {p.pid for p in psutil.Process().children() if warm_worker.__name__ in " ".join(p.cmdline())}


def handed_over(caplog) -> list[int]:
    return [worker for worker, _ in handed(r.getMessage() for r in caplog.records if r.name == POOL_LOG)]


def handed(lines) -> list[tuple[int, int]]:
    """``(worker, process)`` of each relay handed over, as the pool logs it: the worker's id, and
    that of the process its launcher started (the worker itself, or the one it is a fork of)."""
    prefix = "a relay handed to waiting worker "
    return [tuple(int(n) for n in line[len(prefix):].split(", of process ")) for line in lines
            if line.startswith(prefix)]


def test_the_command_is_served_by_the_workers_it_started_before_it_listed(tree, tmp_path):
    """Order of events, not time: the process started before the listing begins (one, which
    imports once for both workers and forks the second) is the one whose workers the relays are
    handed to, two workers of two processes, and every one is reaped when the command ends."""
    result = _command_with_pool_log(tree, tmp_path / "out", "--direct_num_workers", "2", setup=_LOOK_WHILE_LISTING)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("beam-prep: 12 of 12 images written"), result.stdout
    (seen,) = [set(map(int, line.split()[1:])) for line in result.stderr.splitlines()
               if line.startswith("waiting-while-listing")]
    served = handed(result.stderr.splitlines())
    assert len(seen) == 1 and {process for _, process in served} == seen, result.stderr
    assert len({worker for worker, _ in served}) == 2 and seen < {worker for worker, _ in served}, result.stderr
    assert warm_pool.NOT_TAKEN not in result.stderr
    # A fork of the launcher, after its import of Beam: its command line, and the name workers are known by.
    (looked,) = [line.split()[1:] for line in result.stderr.splitlines() if line.startswith("worker-seen")]
    assert looked == [str(*seen), "True", interrupt.WORKER_NAME], result.stderr


# The command's workers waiting as its listing begins (its only processes then), said on stderr: each
# one's id, whether its command line is the launcher's (a fork of it), and its name.
_LOOK_WHILE_LISTING = """
import psutil
from beam_prep.write.run import pipeline
_list_tree = pipeline.list_tree
def _looking(*args, **kwargs):
    me = psutil.Process()
    workers = me.children()
    print("waiting-while-listing", *[p.pid for p in workers], file=sys.stderr, flush=True)
    for p in workers:
        print("worker-seen", p.pid, p.cmdline() == me.cmdline(), p.name(), file=sys.stderr, flush=True)
    return _list_tree(*args, **kwargs)
pipeline.list_tree = _looking
"""


def test_a_library_run_refused_by_its_listing_starts_no_worker(tmp_path):
    """``beam_prep.prepare`` starts its workers once it has listed: a run its checks or its listing
    refuse starts no process (an empty tree here)."""
    (tmp_path / "in").mkdir()
    before = set(waiting_workers())
    with pytest.raises(OptionsError):
        beam_prep.prepare(str(tmp_path / "in"), str(tmp_path / "out"), direct_num_workers=2,
                          direct_running_mode="multi_processing")
    assert waiting_workers() == before == set()


def test_a_default_socket_timeout_in_the_launcher_changes_nothing(tree, tmp_path):
    """Beam's GCP credentials set one for a gs:// run; the non-blocking flag it gives a socket goes
    with its descriptor to the worker, whose end must block all the same."""
    result = _command_with_pool_log(tree, tmp_path / "out", "--direct_num_workers", "1",
                                    setup="import socket; socket.setdefaulttimeout(30.0)")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("a relay handed to waiting worker") == 1, result.stderr
    assert warm_pool.NOT_TAKEN not in result.stderr, result.stderr
    assert result.stdout.startswith("beam-prep: 12 of 12 images written"), result.stdout


def test_a_relay_with_no_worker_waiting_starts_beams_own(tree, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(warm_pool.WarmPool, "start", lambda self, count: None)
    caplog.set_level(logging.DEBUG, logger=POOL_LOG)
    manifest = beam_prep.prepare(str(tree), str(tmp_path / "out"), image_size=16, num_shards=2,
                                 direct_num_workers=2, direct_running_mode="multi_processing")
    assert manifest["counts"]["written"] == 12
    cold = [r for r in caplog.records if r.name == POOL_LOG and "no worker waiting" in r.getMessage()]
    assert len(cold) == 2 and handed_over(caplog) == []


def _answer(pool: warm_pool.WarmPool) -> bytes:
    """What the launcher answers a relay that connects: the first byte it gets."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as relay:
        relay.connect(warm_pool._socket_address(pool.address))
        return relay.recv(1)


def test_the_process_beam_starts_is_the_relay_the_pool_records():
    """Beam's worker command runs the relay in place of its shell (``exec``): the process Beam
    started, and waits for, is the one the pool records when it connects, the one the run stops.
    Without warm workers (``BEAM_PREP_WARM_WORKERS=0``) the pool starts none and records Beam's."""
    with warm_pool.WarmPool(warm=False) as pool:
        pool.start(2)
        assert pool.waiting == 0 and pool._started == []
        # Beam's command without Beam's environment: the worker it starts exits at once.
        relay = subprocess.Popen(pool.relay_command(), shell=True, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        relay.wait(timeout=120)
        assert [p.pid for p in pool.started._processes] == [relay.pid]


def test_a_worker_gone_while_waiting_is_passed_over():
    with warm_pool.WarmPool() as pool:
        pool.start(1)
        (process, _), = pool._waiting
        process.kill()
        process.wait()
        assert _answer(pool) == warm_worker.COLD
        assert pool.waiting == 0


def _relay(address: str, launcher: int | None = None) -> subprocess.CompletedProcess:
    """The relay as Beam's worker command runs it, with ``python -m platform`` for Beam's worker
    (it prints the platform): what the relay runs where no waiting worker serves it. Its launcher
    this process (its parent), unless ``launcher`` names another."""
    return subprocess.run([sys.executable, "-I", "-S", "-c", warm_pool.RELAY, address, "platform",
                           str(os.getpid() if launcher is None else launcher)],
                          capture_output=True, text=True, timeout=120)


def test_a_relay_that_reaches_no_launcher_starts_beams_worker():
    ran = _relay(f"@beam-prep-workers-none-{uuid.uuid4().hex}")
    assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr
    assert warm_pool.NOT_TAKEN not in ran.stderr


def test_a_relay_whose_launcher_is_not_its_parent_starts_nothing():
    """The launcher pid on the relay's command line is the process it watches (and outlives no longer
    than): one that is not its parent (here ``init``, alive for ever) is refused, and no worker starts."""
    ran = _relay(f"@beam-prep-workers-none-{uuid.uuid4().hex}", launcher=1)
    assert ran.returncode == 1 and ran.stdout == ""
    assert ran.stderr == "beam-prep: the relay's parent is not the launcher 1 it was given: it stops\n"


class _NotAProcess:
    pid = 0

    def terminate(self) -> None:
        pass


def test_a_relay_whose_worker_cannot_take_over_starts_beams_worker():
    """A worker that takes the relay and then fails (here: answers ``cold`` at once): the relay
    starts Beam's worker itself, and says so in the job's log."""
    with warm_pool.WarmPool() as pool:
        ours, theirs = socket.socketpair()
        pool._waiting.append((_NotAProcess(), ours))

        def failing_worker() -> None:
            theirs.sendall(warm_worker.READY.pack(os.getpid()))
            _, fds, _, _ = socket.recv_fds(theirs, 1, 1)
            with socket.socket(fileno=fds[0]) as relay:
                relay.sendall(warm_worker.TAKEN)
                relay.recv(4)
                relay.sendall(warm_worker.COLD_STATUS)

        thread = threading.Thread(target=failing_worker)
        thread.start()
        ran = _relay(pool.address)
        thread.join()
        theirs.close()
    assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr
    assert warm_pool.NOT_TAKEN in ran.stderr


def test_workers_beyond_the_runs_count_are_stopped(monkeypatch):
    """A process none of whose workers the run needs is terminated, not left to finish its
    imports; one that still has a worker waiting goes on, and forks none for the sockets closed;
    nothing of either is left running once the pool is closed."""
    mark = uuid.uuid4().hex
    monkeypatch.setenv("BEAM_PREP_TEST_MARK", mark)
    with warm_pool.WarmPool() as pool:
        pool.start(2)
        pool.start(1)
        (two, _), _, (one, _) = pool._waiting
        pool.fit(1)
        assert pool.waiting == 1 and pool._waiting[0][0] is two
        assert one.wait(timeout=30) != 0  # terminated
        assert two.poll() is None
        pool.fit(2)
        assert pool.waiting == 2
        assert pool._ready(pool._waiting[0][1]) == two.pid  # it imported, and serves the first socket
    assert all(p.poll() is not None for p in pool._started)
    assert [p.pid for p in psutil.process_iter() if _marked(p, mark)] == []


def _marked(process: psutil.Process, mark: str) -> bool:
    try:
        return process.environ().get("BEAM_PREP_TEST_MARK") == mark
    except psutil.Error:
        return False


@pytest.mark.skipif(not hasattr(os, "setuid") or os.geteuid() != 0, reason="needs another user: run as root")
def test_another_user_is_refused():
    with warm_pool.WarmPool() as pool:
        pool.start(1)
        code = ("import os, socket, sys; os.setuid(65534); s = socket.socket(socket.AF_UNIX); "
                f"s.connect({warm_pool._socket_address(pool.address)!r}); sys.stdout.write(repr(s.recv(1)))")
        refused = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert refused.stdout == "b''"  # closed without an answer
        assert pool.waiting == 1  # its worker still waits for the run


# A process of this user that no run started: it leaves its parent (a fork whose parent exits), then
# reaches the pool's socket, and says what it was answered.
_STRANGER = """
import os, socket, sys, time
if os.fork():
    os._exit(0)
while os.getppid() == {parent}:
    time.sleep(0.01)
s = socket.socket(socket.AF_UNIX)
s.connect({address!r})
sys.stdout.write(repr(s.recv(1)))
"""


def test_a_process_the_run_did_not_start_is_refused_and_never_recorded():
    """The same user's, but not a descendant of the launcher (as every relay Beam starts is): it
    would be stopped with the run's processes, and it would take a worker meant for the run."""
    with warm_pool.WarmPool() as pool:
        pool.start(1)
        code = ("import os; parent = os.getpid()\n"
                f"exec({_STRANGER!r}.format(parent=parent, address={warm_pool._socket_address(pool.address)!r}))")
        refused = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert refused.stdout == "b''", refused.stderr  # closed without an answer
        (worker, _), = pool._waiting  # still waiting for the run, the one process recorded
        assert [p.pid for p in pool.started._processes] == [worker.pid]


@pytest.mark.parametrize("argv,count", [
    ([], 1),
    (["--direct_num_workers", "3"], 3),
    (["--direct_num_workers=2", "--runner", "DirectRunner"], 2),
    (["--direct_num_workers", "0"], 1),
    (["--direct_running_mode", "multi_processing"], 1),
    (["--direct_running_mode", "in_memory"], None),
    (["--runner", "DataflowRunner"], None),
    (["--dry_run"], None),
    (["--help"], None),
])
def test_the_command_line_says_how_many_workers_start_early(argv, count):
    assert early_workers(["--input", "in", "--output", "out", *argv]) == count


def test_a_tree_is_expected_to_need_a_worker_per_256_files_up_to_the_cores(tmp_path):
    """Counted before the listing, so that every worker the run will fit to starts while it lists:
    Beam starts no work until all have connected."""
    for label, count in (("a", 300), ("b", 300)):
        (tmp_path / "in" / label).mkdir(parents=True)
        for i in range(count):
            (tmp_path / "in" / label / f"{i}.jpg").touch()
    assert warm_pool.expected_workers(str(tmp_path / "in"), 8) == 3  # 600 files: 3 workers of 256
    assert warm_pool.expected_workers(str(tmp_path / "in"), 2) == 2
    assert warm_pool.expected_workers(str(tmp_path / "in" / "a"), 8) == 2
    assert warm_pool.expected_workers(str(tmp_path / "missing"), 8) == 1
    assert warm_pool.expected_workers("gs://bucket/images", 8) == 8


def test_a_tree_of_many_folders_is_counted_as_large_without_a_walk_of_all_of_them(tmp_path, monkeypatch):
    """The count stops at the cap's worth of folders, as at its worth of files: a tree of a
    million nearly empty folders costs no more to guess than a small one."""
    for i in range(600):
        (tmp_path / "in" / f"label{i:03d}").mkdir(parents=True)
    visited = []
    walk = warm_pool.os.walk

    def counted_walk(*args, **kwargs):
        for entry in walk(*args, **kwargs):
            visited.append(entry[0])
            yield entry

    monkeypatch.setattr(warm_pool.os, "walk", counted_walk)
    assert warm_pool.expected_workers(str(tmp_path / "in"), 2) == 2
    assert len(visited) == 2 * warm_pool.IMAGES_PER_WORKER


def test_the_early_pool_is_the_runs_or_closed():
    start_workers_early(["--input", "in", "--output", "out", "--direct_num_workers", "2"])
    pool = warm_pool.take_early()
    assert pool is not None and pool.waiting == 2 and warm_pool.take_early() is None
    pool.close()
    start_workers_early(["--input", "in", "--output", "out"])
    warm_pool.close_early()
    assert warm_pool.take_early() is None


def test_a_refused_command_leaves_no_worker_running(tmp_path):
    mark = uuid.uuid4().hex
    env = dict(os.environ, BEAM_PREP_TEST_MARK=mark)
    refused = run_prepare("--input", str(tmp_path / "missing"), "--output", str(tmp_path / "out"), env=env)
    assert refused.returncode == 2, refused.stderr
    assert not (tmp_path / "out").exists()
    assert [p.pid for p in psutil.process_iter() if _marked(p, mark)] == []


def test_the_command_is_served_by_its_early_workers(tree, tmp_path):
    """``python -m pipelines.prepare_images`` forks its worker once it has imported Beam, before it lists: that
    worker, not one Beam starts, writes the shards."""
    result = _command_with_pool_log(tree, tmp_path / "out", "--direct_num_workers", "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("beam-prep: 12 of 12 images written"), result.stdout
    assert result.stderr.count("a relay handed to waiting worker") == 1, result.stderr
    assert "no worker waiting" not in result.stderr and warm_pool.NOT_TAKEN not in result.stderr


def _command_with_pool_log(tree, out, *args: str, setup: str = "") -> subprocess.CompletedProcess:
    """``python -m pipelines.prepare_images`` with ``--verbose`` and the pool's debug records on stderr,
    after ``setup`` (Python) runs in it."""
    return subprocess.run([sys.executable, "-c", _VERBOSE_POOL.format(setup=setup), "--input", str(tree),
                           "--output", str(out), "--image_size", "16", "--verbose", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


# The command as `python -m pipelines.prepare_images` runs it, the pool's debug records shown.
_VERBOSE_POOL = """
import logging, runpy, sys
{setup}
logging.getLogger("beam_prep.write.run.warm_pool").setLevel(logging.DEBUG)
handler = logging.StreamHandler(sys.stderr)
handler.setLevel(logging.DEBUG)
logging.getLogger("beam_prep.write.run.warm_pool").addHandler(handler)
sys.argv = ["prepare_images", *sys.argv[1:]]
runpy.run_module("pipelines.prepare_images", run_name="__main__")
"""


# A forked pool, in a process of its own (the test's has threads: it may not fork), its facts as JSON.
_FORKED_POOL = """
import json, os, signal, sys
import psutil
from beam_prep.write.run import interrupt, warm_pool
from beam_prep.write.run.lean_imports import import_beam
import_beam()
facts = {"may_fork": warm_pool.may_fork()}
me = psutil.Process()
with warm_pool.WarmPool() as pool:
    pool.start(2, fork=True)
    pool.start(1, fork=True)
    (two, _), (_, second), (one, _) = pool._waiting
    facts["handles"] = [type(p).__name__ for p in (two, one)]
    first = psutil.Process(two.pid)
    facts["first"] = [first.name(), first.cmdline() == me.cmdline(), first.ppid() == me.pid]
    its_fork = psutil.Process(pool._ready(second))  # the second worker, once it waits
    facts["its_fork"] = [its_fork.name(), its_fork.ppid() == two.pid]
    pool.fit(2)
    facts["one_ended"] = one.wait(timeout=30)
    facts["two_running"] = two.poll() is None
    facts["stopped"] = pool.started.stop()
facts["two_ended"] = two.poll()
print(json.dumps(facts))
"""


def test_a_pool_forked_from_its_launcher_serves_stops_and_reaps_its_workers():
    """The command's workers forked from the launcher after its import of Beam (``may_fork``): named
    as workers, with the launcher's command line; stopped beyond the run's count; stopped by the
    run (``started``, as on a signal), the fork's own fork too; reaped; nothing left running."""
    mark = uuid.uuid4().hex
    ran = subprocess.run([sys.executable, "-c", _FORKED_POOL], capture_output=True, text=True, timeout=120,
                         cwd=REPO, env=dict(os.environ, BEAM_PREP_TEST_MARK=mark))
    assert ran.returncode == 0, ran.stderr
    facts = json.loads(ran.stdout)
    assert facts["may_fork"] and facts["handles"] == ["_Forked", "_Forked"]
    assert facts["first"] == [interrupt.WORKER_NAME, True, True]
    assert facts["one_ended"] == -signal.SIGTERM and facts["two_running"]
    assert facts["its_fork"] == [interrupt.WORKER_NAME, True]
    assert facts["stopped"] == 2 and facts["two_ended"] is not None
    assert [p.pid for p in psutil.process_iter() if _marked(p, mark)] == []


def test_a_process_with_threads_of_its_own_starts_its_workers_anew():
    """A fork keeps only the thread that forks: a lock another holds would stay held in the
    worker. A library caller's process with a thread of its own starts a new interpreter."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="a caller's thread")
    thread.start()
    try:
        assert not warm_pool.may_fork()
        with warm_pool.WarmPool() as pool:
            pool.start(1, fork=True)
            (process, _), = pool._waiting
            assert isinstance(process, subprocess.Popen)
            assert warm_worker.__name__ in process.args
    finally:
        stop.set()
        thread.join()
