"""A local run's workers started while the launcher lists, so that their start-up overlaps its work.

Beam's worker command becomes a relay that the launcher hands to a waiting
worker (``warm_worker``), or that starts Beam's own worker where none waits;
every process the pool starts, and every relay that reaches it, is recorded
(``interrupt.Started``) for the run to stop. docs/design/sinks.md has the rest.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import select
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator

from beam_prep.io.storage import is_local
from beam_prep.write.run import interrupt, warm_worker

__all__ = ["IMAGES_PER_WORKER", "NOT_TAKEN", "RELAY", "WARM_VARIABLE", "WORKER_MODULE", "WarmPool", "close_early",
           "enabled", "expected_workers", "start_early", "take_early", "warm_pool", "workers_for"]

_LOG = logging.getLogger(__name__)
# Beam's SDK worker, as SubprocessSDKEnvironment's command runs it: what a relay with no waiting worker starts.
WORKER_MODULE = "apache_beam.runners.worker.sdk_worker_main"

# The relay's line in a job's log where the worker it was handed to could not take over.
NOT_TAKEN = "a waiting worker could not take over"
# The relay, run by Beam's worker command line as `python -I -S -c RELAY <address> <worker module> <launcher pid>`:
# the standard library only (-I -S: no site, no user paths), as it starts for every worker. Where no
# waiting worker takes it, it starts Beam's worker as its child (``cold``) and kills it once the launcher
# is gone (a pidfd of it, refused unless the launcher is its parent): a launcher killed with SIGKILL stops nothing, and Beam's worker, its control
# channel gone, waits on its threads for ever. The child dies with it too (PR_SET_PDEATHSIG: set by this
# single-threaded process for its own child, so never fired by a thread's exit). Beam's worker takes this
# process's place where the system has no pidfds.
RELAY = """\
import json, os, select, signal, socket, struct, sys
address, module, launcher = sys.argv[1], sys.argv[2], int(sys.argv[3])
command = [sys.executable, "-m", module]
def cold():
    try:
        watched = os.pidfd_open(launcher)
    except ProcessLookupError:
        sys.exit(1)
    except (AttributeError, OSError):
        os.execv(sys.executable, command)
    if os.getppid() != launcher:
        sys.stderr.write(f"beam-prep: the relay's parent is not the launcher {launcher} it was given: it stops\\n")
        sys.exit(1)
    import ctypes
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    me = os.getpid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    pid = os.fork()
    if pid == 0:
        try:
            prctl(1, int(signal.SIGKILL))
            if os.getppid() == me:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
                os.execv(sys.executable, command)
        finally:
            os._exit(127)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGTERM))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    child = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(watched, select.POLLIN)
    poller.register(child, select.POLLIN)
    if child not in [fd for fd, _ in poller.poll()]:
        os.kill(pid, signal.SIGKILL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    sys.exit(128 - code if code < 0 else code)
answer = b""
try:
    relay = socket.socket(socket.AF_UNIX)
    relay.connect("\\0" + address[1:] if address.startswith("@") else address)
    answer = relay.recv(1)
except OSError:
    pass
if answer != b"W":
    cold()
environment = json.dumps(dict(os.environ)).encode()
try:
    socket.send_fds(relay, [struct.pack("!I", len(environment))], [1, 2])
    relay.sendall(environment)
    status = relay.makefile("rb").readline().strip()
except OSError:
    status = b"cold"
if status == b"cold":
    sys.stderr.write("beam-prep: a waiting worker could not take over; Beam's worker starts instead\\n")
    sys.stderr.flush()
    cold()
sys.exit(int(status) if status.lstrip(b"-").isdigit() else 1)
"""
# How long a worker may take to exit once it has given its relay its status, or been told to stop.
_EXIT_S = 30
# Longest path a Unix socket's address holds, on every platform (sun_path is 104 or 108 bytes).
_MAX_SOCKET_PATH = 100
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
# The pool's thread, which hands relays over (``WarmPool._hand_over``).
_THREAD_NAME = "beam-prep-warm-pool"
# Set to 0, Beam starts its workers as the pipeline runs (the start-up benchmark's baseline).
WARM_VARIABLE = "BEAM_PREP_WARM_WORKERS"


def enabled() -> bool:
    """Whether runs start their workers early: unless ``BEAM_PREP_WARM_WORKERS=0``."""
    return os.environ.get(WARM_VARIABLE, "1") != "0"


# Images a worker process is worth starting for: starting one (Python, Beam, our modules) costs
# about the CPU of converting a few hundred images, so a small job runs on fewer workers.
IMAGES_PER_WORKER = 256


def workers_for(images: int, most: int) -> int:
    """Workers for a run of ``images`` images: one per ``IMAGES_PER_WORKER``, 1 to ``most``."""
    return max(1, min(most, -(-images // IMAGES_PER_WORKER)))


def expected_workers(root: str, most: int) -> int:
    """Before the listing, the workers a run of ``root`` is likely to fit to (``workers_for``), from
    the files under it counted up to what ``most`` workers take: the count costs milliseconds,
    however large the tree. They are started then, not once the listing is done, since Beam
    starts no work before every worker has connected: one started late would hold up the rest.
    A gs:// root counts as large: its listing takes longer than a start-up, and a run over the
    network is rarely a small one, and so does a tree with more folders than the cap's files
    (the walk stops there too). A guess only: the run fits the count once it has listed."""
    if not is_local(root):
        return most
    cap = most * IMAGES_PER_WORKER
    seen = 0
    for folders, (_, _, files) in enumerate(os.walk(root), 1):
        seen += len(files)
        if seen >= cap or folders >= cap:
            return most
    return workers_for(seen, most)


def _worker_environment() -> dict[str, str]:
    """A waiting worker's environment, until it takes a relay's: the command's, with numpy's
    OpenBLAS on one thread (no worker uses it), so that the process forks with none beside its own."""
    return {**os.environ, "OPENBLAS_NUM_THREADS": "1"}


def _socket_address(address: str) -> str:
    """A Linux abstract name (``@name``) as ``socket`` takes it; a path as it is."""
    return "\0" + address[1:] if address.startswith("@") else address


class WarmPool:
    """Worker processes waiting with their imports done, and the socket their relays reach them on.

    Use as a context manager (``warm_pool``): ``close`` stops every worker that
    no relay took and the socket's thread. ``started`` records every process the
    pool starts and every relay that reaches it (the worker Beam started), for the
    run to stop (``interrupt.Started.stop``). With ``warm`` False it starts no
    worker: each relay starts Beam's, and is recorded all the same.
    """

    def __init__(self, local: bool = False, warm: bool = True) -> None:
        self._local = local  # its workers' run reads and writes local files only (``warm_worker.LOCAL``)
        self._warm = warm
        self.started = interrupt.Started()
        self._folder: str | None = None
        self._listener, self.address = self._listen()
        self._waiting: list[tuple[subprocess.Popen, socket.socket]] = []
        self._started: list[subprocess.Popen] = []
        self._handed: set[int] = set()  # the processes (``_started``) one of whose workers took (or takes) a relay
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._hand_over, name=_THREAD_NAME, daemon=True)
        self._thread.start()

    def _listen(self) -> tuple[socket.socket, str]:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.setblocking(True)
        try:
            if sys.platform.startswith("linux"):  # an abstract name: no file to remove, any TMPDIR
                name = f"beam-prep-workers-{os.getpid()}-{secrets.token_hex(16)}"
                listener.bind("\0" + name)
                address = "@" + name
            else:
                self._folder = tempfile.mkdtemp(prefix="bp-")  # mode 0700: only this user reaches it
                address = os.path.join(self._folder, "w")
                if len(address.encode()) > _MAX_SOCKET_PATH:
                    raise OSError(f"the temp folder's path is too long for a socket: {address}")
                listener.bind(address)
            listener.listen(64)
        except BaseException:
            listener.close()
            self._remove_folder()
            raise
        return listener, address

    def relay_command(self) -> str:
        """Beam's worker command line for this pool (``SubprocessSDKEnvironment``'s, run by a shell):
        the shell becomes the relay (``exec``), so that the process Beam started is the one the
        pool records when it connects."""
        return "exec " + shlex.join([sys.executable, "-I", "-S", "-c", RELAY, self.address, WORKER_MODULE,
                                     str(os.getpid())])

    def start(self, count: int, fork: bool = False) -> None:
        """Starts ``count`` more waiting workers: one process that imports for all of them and
        forks the others once it has (``warm_worker``). With ``fork``, that process is a fork of
        this one, whose imports are done already, where ``may_fork`` allows; a new interpreter
        otherwise. None where the pool was made without ``warm``."""
        if count <= 0 or not self._warm:
            return
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(count)]
        theirs = [pair[1].fileno() for pair in pairs]
        try:
            for ours, their in pairs:
                ours.setblocking(True)
                their.setblocking(True)  # the worker's end blocks, whatever this process's default timeout
            if fork and may_fork():
                process = self._fork(pairs)
            else:
                process = subprocess.Popen(
                    [sys.executable, "-m", warm_worker.__name__, ",".join(map(str, theirs)), WORKER_MODULE,
                     *([warm_worker.LOCAL] if self._local else [])],
                    pass_fds=theirs, stdin=subprocess.DEVNULL, env=_worker_environment())
                self.started.add(process.pid)  # before its first reap: the id is still its own
        except BaseException:
            for ours, _ in pairs:
                ours.close()
            raise
        finally:
            for _, their in pairs:
                their.close()
        with self._lock:
            self._waiting.extend((process, ours) for ours, _ in pairs)
            self._started.append(process)

    def _fork(self, pairs: list[tuple[socket.socket, socket.socket]]) -> _Forked:
        """The workers' first process as a fork of this one (``start``): it serves the sockets'
        worker ends (``warm_worker.serve``) and exits, never returning here."""
        # The workers' imports, here rather than in the fork: the launcher imports the sinks' code
        # for its own pipeline anyway, and Beam's harness costs it little more.
        warm_worker.prepare(local=self._local)
        sys.stdout.flush()  # what this process has buffered, written once, by this process
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            self.started.add(pid)
            return _Forked(pid)
        code = 1
        try:
            interrupt.name_worker()
            self._leave_launcher([ours for ours, _ in pairs])
            code = warm_worker.serve([their.detach() for _, their in pairs], local=self._local)
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)  # never the launcher's exit: its atexit hooks, its files, its workers

    def _leave_launcher(self, ours: list[socket.socket]) -> None:
        """In a fork (``_fork``): what belongs to the launcher let go, so that the process is what a
        worker started anew would be: the run's socket and the launcher's ends of the workers'
        closed, stdin emptied, the launcher's log handlers and signal handlers gone."""
        self._listener.close()  # else a relay could still reach a socket no one accepts on, once the launcher is gone
        for sock in (*ours, *(waiting for _, waiting in self._waiting)):
            sock.close()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        logging.getLogger().handlers.clear()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def fit(self, count: int) -> None:
        """Exactly ``count`` workers waiting: more started, or those beyond it stopped."""
        with self._lock:
            extra = self._waiting[count:]
            del self._waiting[count:]
            missing = count - len(self._waiting)
        self._stop(extra)
        self.start(max(missing, 0))

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    def _hand_over(self) -> None:
        """The socket's thread: each relay to a waiting worker, or told to start Beam's worker itself."""
        while True:
            try:
                relay, _ = self._listener.accept()
            except OSError as e:
                if self._closed:
                    return
                _LOG.warning("the run's worker socket: %s", e)
                continue
            with relay:
                if self._closed:
                    return
                relay.setblocking(True)  # a default timeout (Beam's GCP credentials set one) makes it not
                try:
                    self._hand(relay)
                except Exception:  # noqa: BLE001 - a relay left without an answer would wait for ever
                    _LOG.exception("a relay could not be handed over: it starts Beam's worker")
                    with contextlib.suppress(OSError):
                        relay.sendall(warm_worker.COLD)

    def _hand(self, relay: socket.socket) -> None:
        """``relay`` to the first waiting worker still there, or told to start Beam's worker; each
        recorded (``started``) first, and neither used once the run has stopped its processes."""
        pid, uid = self._peer(relay)
        if uid is not None and uid != os.getuid():
            _LOG.warning("a process of user %d reached the run's worker socket: refused", uid)
            return
        if pid is not None and not _started_here(pid):
            _LOG.warning("process %d, which this run did not start, reached its worker socket: refused", pid)
            return
        if pid is not None and not self.started.add(pid):
            return
        while True:
            with self._lock:
                worker = self._waiting.pop(0) if self._waiting else None
                if worker is not None:  # its process is not to be stopped while it takes the relay
                    self._handed.add(worker[0].pid)
            if worker is None:
                _LOG.debug("a relay and no worker waiting: it starts Beam's")
                relay.sendall(warm_worker.COLD)
                return
            process, ours = worker
            try:
                pid = self._ready(ours)
                if pid is None:  # that worker is gone: the next one
                    continue
                if not self.started.add(pid):
                    return
                socket.send_fds(ours, [b"R"], [relay.fileno()])
            except OSError:
                continue
            finally:
                ours.close()
            _LOG.debug("a relay handed to waiting worker %d, of process %d", pid, process.pid)
            return

    @staticmethod
    def _ready(ours: socket.socket) -> int | None:
        """The worker's process id once it waits for a relay (``warm_worker.READY``); None if it is gone."""
        message = b""
        while len(message) < warm_worker.READY.size:
            chunk = ours.recv(warm_worker.READY.size - len(message))
            if not chunk:
                return None
            message += chunk
        (pid,) = warm_worker.READY.unpack(message)
        return pid

    @staticmethod
    def _peer(relay: socket.socket) -> tuple[int | None, int | None]:
        """The process id and user of the relay's end, as the kernel gives them where it does
        (``SO_PEERCRED``); elsewhere (None, None): the socket's folder is this user's alone, and
        the relay's process goes unrecorded."""
        if not hasattr(socket, "SO_PEERCRED"):
            return None, None
        pid, uid, _ = _PEERCRED.unpack(relay.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        return pid, uid

    def close(self) -> None:
        """Stops the workers still waiting, then the socket's thread; those serving Beam go on."""
        with self._lock:
            self._closed = True
            waiting, self._waiting = self._waiting, []
        self._stop(waiting)
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as wake:
            wake.connect(_socket_address(self.address))  # wakes the thread's accept
        self._thread.join()
        self._listener.close()
        for process in self._started:  # reaped, so that their CPU is their launcher's
            try:
                process.wait(timeout=_EXIT_S)
            except subprocess.TimeoutExpired:
                _LOG.warning("a worker process (%d) did not exit %d s after its work: killed", process.pid, _EXIT_S)
                process.kill()
                process.wait()
        self._remove_folder()

    def _stop(self, workers: list[tuple[subprocess.Popen, socket.socket]]) -> None:
        """Closes each worker's socket (a waiting worker then exits); a process none of whose
        workers still waits or was handed a relay is terminated, not left to finish its imports."""
        for _, ours in workers:
            ours.close()
        with self._lock:
            busy = {process.pid for process, _ in self._waiting} | self._handed
        for process in {process.pid: process for process, _ in workers}.values():
            if process.pid not in busy:
                process.terminate()

    def _remove_folder(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> WarmPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _started_here(pid: int) -> bool:
    """Whether process ``pid`` descends from this one (the relays Beam starts do), or is this one."""
    import psutil  # here: as ``interrupt.Started``, only a run with workers needs it

    if pid == os.getpid():
        return True
    try:
        return any(parent.pid == os.getpid() for parent in psutil.Process(pid).parents())
    except psutil.Error:
        return False


def may_fork() -> bool:
    """Whether this process may fork its workers (``WarmPool.start``): on Linux (a pidfd waits for
    and signals the fork, never another process that reuses its id), from the main thread, with no
    thread running but this module's. A fork keeps only the thread that forks, so a lock another
    thread holds would stay held in it: a library caller's process, with threads of its own,
    starts its workers anew."""
    return (threading.current_thread() is threading.main_thread()
            and all(thread is threading.main_thread() or thread.name == _THREAD_NAME for thread in threading.enumerate())
            and _pidfds())


@functools.cache
def _pidfds() -> bool:
    """Whether this system gives pidfds: Python has the calls from 3.9 on Linux, the kernel from 5.3."""
    if not (hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


class _Forked:
    """A process ``WarmPool`` forked, with what of ``subprocess.Popen``'s interface the pool uses.
    Its pidfd waits for it and signals it: never another process that has its id once it is reaped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd: int | None = os.pidfd_open(pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)  # readable once the process has ended
            if not poller.poll(None if timeout is None else timeout * 1000):
                raise subprocess.TimeoutExpired([str(self.pid)], timeout)
            self._reap(0)
        return self.returncode

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signum)

    def _reap(self, options: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, options)
        except ChildProcessError:  # reaped elsewhere (``interrupt.Started.stop``): its status is gone, as Popen says
            pid, status = self.pid, 0
        if pid:
            self.returncode = os.waitstatus_to_exitcode(status)
            os.close(self._pidfd)
            self._pidfd = None


@contextlib.contextmanager
def warm_pool() -> Iterator[WarmPool | None]:
    """The command's pool (``start_early``), or a new one with no worker started yet (a run
    starts them once its output is checked: a refused run starts none), which starts none with
    ``BEAM_PREP_WARM_WORKERS=0`` (it only records Beam's); None (Beam starts its workers, and
    nothing records them) where the socket cannot be made. Closed on leaving."""
    pool = take_early()
    if pool is None:
        try:
            pool = WarmPool(warm=enabled())
        except OSError as e:
            _LOG.info("local workers start when the pipeline runs: %s", e)
            yield None
            return
    with pool:
        yield pool


_EARLY: list[WarmPool] = []  # the command's pool, started before its run


def start_early(count: int, local: bool = False, fork: bool = False) -> None:
    """The command's pool, ``count`` workers started before its run (``beam_prep.cli.early``
    decides from its arguments; ``local``: its run reads and writes local files only; ``fork``:
    forked from this process, as ``WarmPool.start`` says); a run takes it over (``take_early``),
    and the command closes it after (``close_early``), whether or not a run took it."""
    if _EARLY or not enabled():
        return
    try:
        pool = WarmPool(local=local)
    except OSError:
        return  # the run says why, as it makes its own
    _EARLY.append(pool)
    pool.start(count, fork=fork)


def take_early() -> WarmPool | None:
    """The pool ``start_early`` started, for the run to use (and close); None if there is none."""
    return _EARLY.pop() if _EARLY else None


def close_early() -> None:
    """Closes a pool ``start_early`` started and no run took (refused options, a busy output)."""
    while _EARLY:
        _EARLY.pop().close()

