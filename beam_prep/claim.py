"""A run's claim on its output folder, so that two runs never write into one folder at once.

Two runs into one ``--output`` used to mix: one read or deleted the other's
work files, and a folder could end with a manifest but no shards. So a run
first claims its output folder and holds the claim until it ends; a second
run is refused with ``OutputBusy``, which names the holder, unless the holder
is gone, in which case its claim is taken over and reported
(``Claim.taken_over``) so that the new run can clean up after it.

The claim is ``<output>/.beam-prep/claim.json`` and holds a ``Holder`` as
JSON: which run, which process on which host, since when. How it is made
exclusive depends on where the folder is:

Local folders
    The kernel decides: the run holds ``flock(LOCK_EX)`` on the claim file
    (through a descriptor that is closed on exec) until it releases the
    claim or its process ends, however it ends; SIGKILL included, so a
    local claim is never stale. A later run that gets the lock and finds a
    holder in the file knows that run ended without releasing. A release
    unlinks the file while still holding the lock; a run that opened the
    old file meanwhile sees, once it has the lock, that the path no longer
    names that file, and starts again. A process forked (not exec'd) from
    the holder shares its lock and keeps the claim alive until it exits.
    On network filesystems the lock is only as good as the server's lock
    support.

gs:// folders
    GCS has no locks, but it checks a write's or delete's generation
    precondition (``ifGenerationMatch``) atomically with the write. The
    claim is created only if absent (generation 0), so of two runs exactly
    one creates it. A daemon thread renews it every ``heartbeat_s``, each
    time only if it is still the version we wrote. A claim is stale when
    its holder ran on this very machine (same host, boot and process
    namespace) and that process is gone, at once; otherwise when GCS last
    updated it more than ``stale_after_s`` ago, by this machine's clock.
    A stale claim is taken over by deleting exactly the version judged
    stale, then creating ours only if absent: two runs taking over at once
    cannot both win. A holder whose renewal finds another version has been
    taken over and says so (``Claim.lost``).

    The numbers: a renewal every 30 s costs one write (2,880 a day, a
    fraction of a cent) and stays far below GCS's limit of one write a
    second per object. A claim is stale after 300 s, ten missed renewals:
    long enough to ride out a renewal's own retries (six attempts of at
    most 30 s each, the claim client's timeouts, and about 8 s of back-off:
    about 190 s at worst), a throttled GCS, a pause of the process or a
    clock a few seconds off, and short enough that a run started after a
    crash elsewhere waits minutes, not hours. A holder paused for longer
    than that (a suspended laptop, a preempted VM) loses its claim, which
    it learns at its next renewal.

Other schemes (through Beam's ``FileSystems``)
    Best effort, not atomic: the claim is written if it does not exist. Two
    runs starting in the same instant may both succeed. There is no renewal,
    so only a holder that ran on this machine and is gone is taken over; a
    claim left by a run that died elsewhere must be deleted by hand, as the
    error says.

The claim shares ``.beam-prep`` with the run's work files, so code that lists
or removes that folder must leave ``claim.json`` to the claim: deleting it
under a live run lets a second run in (a local holder then reports
``Claim.lost``). A release removes the folder once it is empty.
"""
from __future__ import annotations

import dataclasses
import datetime
import fcntl
import json
import logging
import os
import secrets
import socket
import threading
import time
from typing import Callable, TypeVar

import urllib3
from apache_beam.io.filesystems import FileSystems

from beam_prep.errors import BeamPrepError, OptionsError, StorageError
from beam_prep.gcs import GcsClient, GcsPreconditionFailed
from beam_prep.layout import WORK_DIR
from beam_prep.storage import is_local, join, storage_error

__all__ = ["CLAIM_NAME", "DEFAULT_HEARTBEAT_S", "DEFAULT_STALE_AFTER_S", "Claim", "Holder", "OutputBusy",
           "claim_output", "claim_path", "new_run_id"]

_LOG = logging.getLogger(__name__)

CLAIM_NAME = "claim.json"
DEFAULT_HEARTBEAT_S = 30.0
DEFAULT_STALE_AFTER_S = 300.0
# Tries at a claim that keeps changing under us (released, taken over) before giving up;
# each failed try means another run got through.
_ATTEMPTS = 50
# A busy local claim's file may be read while its holder writes it.
_READ_TRIES = 20
_READ_PAUSE_S = 0.01
_UNKNOWN = "unknown"
# The claim is tiny: an answer slower than this is a hung request, better retried.
_GCS_TIMEOUT = urllib3.Timeout(connect=10.0, read=20.0)
_T = TypeVar("_T")


class OutputBusy(OptionsError):
    """Another run holds the output folder; ``holder`` says which, and since when."""

    def __init__(self, output: str, holder: Holder, state: str, advice: str) -> None:
        super().__init__(f"--output {output} is in use by {holder.describe()}, {state}; {advice}")
        self.output = output
        self.holder = holder


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a claim: a run, its process, and when it claimed (UTC, ISO 8601).

    ``heartbeat`` is when a gs:// holder last renewed its claim (None until
    it does). ``machine`` tells where ``pid`` means something: the kernel's
    boot id and the process's pid namespace, None where unknown. A dead pid
    is only believed on the very machine and namespace that wrote it, since
    host names repeat across containers and machines.
    """

    run_id: str
    host: str
    pid: int
    started: str
    heartbeat: str | None = None
    machine: str | None = None

    @classmethod
    def this_process(cls, run_id: str) -> Holder:
        return cls(run_id, socket.gethostname(), os.getpid(), _utc_now(), None, _machine_id())

    @classmethod
    def unknown(cls) -> Holder:
        """Stands for a claim whose contents cannot be read."""
        return cls(_UNKNOWN, _UNKNOWN, 0, _UNKNOWN)

    @classmethod
    def from_json(cls, data: bytes) -> Holder:
        """Raises ValueError if ``data`` is not a holder."""
        try:
            fields = json.loads(data)
            return cls(str(fields["run_id"]), str(fields["host"]), int(fields["pid"]),
                       str(fields["started"]), fields.get("heartbeat"), fields.get("machine"))
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a claim: {e}") from e

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    def describe(self) -> str:
        return f"run {self.run_id} (pid {self.pid} on {self.host}) since {self.started}"

    def is_gone(self) -> bool:
        """True only if this holder ran here (same host, machine and namespace) and its process is gone."""
        if self.pid <= 0 or self.machine is None or self.host != socket.gethostname():
            return False
        return self.machine == _machine_id() and not _pid_alive(self.pid)


class Claim:
    """A held claim on an output folder (made by ``claim_output``); a context manager that releases it.

    ``taken_over`` is the holder whose claim this one replaced: a run that
    ended without releasing (killed, crashed) and may have left work files.
    """

    def __init__(self, output: str, holder: Holder, taken_over: Holder | None) -> None:
        self.output = output
        self.path = claim_path(output)
        self.holder = holder
        self.taken_over = taken_over
        self._released = False
        self._release_lock = threading.Lock()

    @property
    def run_id(self) -> str:
        return self.holder.run_id

    @property
    def lost(self) -> bool:
        """True when the claim no longer guards the folder: another run took it over
        (gs://, after judging this run stale), or the claim file was removed (local)."""
        return False

    def release(self) -> None:
        """Gives the folder up, removing the claim; calling it again does nothing."""
        with self._release_lock:
            if self._released:
                return
            self._released = True
        self._release()

    def _release(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def claim_path(output: str) -> str:
    """Where the claim on ``output`` lives: ``<output>/.beam-prep/claim.json``."""
    return join(output, WORK_DIR, CLAIM_NAME)


def new_run_id() -> str:
    """A short id that sorts by start time (UTC, to the second) and is unique (32 random bits)."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"


def claim_output(output: str, run_id: str | None = None, *,
                 stale_after_s: float = DEFAULT_STALE_AFTER_S,
                 heartbeat_s: float | None = DEFAULT_HEARTBEAT_S) -> Claim:
    """Claims ``output`` for this run, taking over a stale claim; see the module docstring.

    Args:
      output: the output folder, local or ``scheme://``.
      run_id: this run's id (``new_run_id()`` by default).
      stale_after_s: gs:// only: a claim not renewed for this long is taken over.
      heartbeat_s: gs:// only: how often ours is renewed; None renews never
        (for a claim held briefly, and for tests). Must be below ``stale_after_s``.

    Raises:
      OutputBusy: another run holds the folder.
      OptionsError: ``heartbeat_s`` is not below ``stale_after_s``.
      StorageError: the claim cannot be read or written.
    """
    if heartbeat_s is not None and not 0 < heartbeat_s < stale_after_s:
        raise OptionsError(f"heartbeat_s ({heartbeat_s}) must be above 0 and below stale_after_s "
                         f"({stale_after_s}), or others take the claim over while this run lives")
    holder = Holder.this_process(run_id or new_run_id())
    if is_local(output):
        claim: Claim = _claim_local(output, holder)
    elif output.startswith("gs://"):
        claim = _claim_gcs(output, holder, stale_after_s, heartbeat_s)
    else:
        claim = _claim_best_effort(output, holder)
    if claim.taken_over is not None:
        _LOG.warning("took over the claim on %s from %s, which had not released it",
                     output, claim.taken_over.describe())
    _LOG.info("run %s claimed %s", holder.run_id, output)
    return claim


# --- local: flock ------------------------------------------------------------------

class _LocalClaim(Claim):
    def __init__(self, output: str, holder: Holder, taken_over: Holder | None, fd: int) -> None:
        super().__init__(output, holder, taken_over)
        self._fd = fd

    @property
    def lost(self) -> bool:
        return not self._released and not _names_file(self.path, self._fd)

    def _release(self) -> None:
        try:
            if _names_file(self.path, self._fd):  # never unlink a later run's claim
                os.unlink(self.path)
            else:
                _LOG.warning("the claim %s was removed or replaced while run %s held it",
                             self.path, self.run_id)
        finally:
            os.close(self._fd)  # drops the lock
        try:
            os.rmdir(os.path.dirname(self.path))
        except OSError:
            pass  # not empty (the run's work files), or gone already


def _claim_local(output: str, holder: Holder) -> Claim:
    path = claim_path(output)
    for _ in range(_ATTEMPTS):
        fd = _open_claim_file(path)
        if fd is None:
            continue  # a release removed the folder between makedirs and open
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            busy = _read_local_holder(fd, wait=True) or Holder.unknown()
            os.close(fd)
            raise OutputBusy(output, busy, f"still running (it holds the lock on {path})",
                             "wait for it to end, or stop it") from None
        except OSError as e:
            os.close(fd)
            raise StorageError(f"cannot lock {path}: {e}; the output folder's filesystem must "
                               "support flock") from e
        if not _names_file(path, fd):
            os.close(fd)  # released and unlinked while we waited for the lock
            continue
        previous = _read_local_holder(fd, wait=False)
        _write_local_holder(fd, holder)
        return _LocalClaim(output, holder, previous, fd)
    raise StorageError(f"cannot claim {output}: {path} kept being replaced")


def _open_claim_file(path: str) -> int | None:
    """The claim file, created if need be; None if a release removed its folder meanwhile."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except (FileNotFoundError, FileExistsError):
        # makedirs raises FileExistsError too when the folder it found existing is removed
        # before it checks that it is a folder.
        return None
    except OSError as e:
        raise storage_error("create the claim", path, e) from e


def _names_file(path: str, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        by_path = os.stat(path)
    except FileNotFoundError:
        return False
    by_fd = os.fstat(fd)
    return (by_path.st_dev, by_path.st_ino) == (by_fd.st_dev, by_fd.st_ino)


def _read_local_holder(fd: int, wait: bool) -> Holder | None:
    """The holder in the file, None if it is empty; ``wait``: give a writer a moment to finish."""
    for attempt in range(_READ_TRIES if wait else 1):
        data = os.pread(fd, 64 * 1024, 0)
        if not data.strip():
            if not wait:
                return None
        else:
            try:
                return Holder.from_json(data)
            except ValueError:
                if not wait:
                    return Holder.unknown()
        time.sleep(_READ_PAUSE_S)
    return None


def _write_local_holder(fd: int, holder: Holder) -> None:
    data = holder.to_json()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


# --- gs://: generation preconditions --------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Seen:
    """A claim as read from GCS: its holder, its version and when GCS last wrote it."""

    holder: Holder
    generation: int
    updated: str

    def age_s(self) -> float:
        return time.time() - self._updated().timestamp()

    def last_seen(self) -> str:
        return self._updated().strftime("%Y-%m-%dT%H:%M:%SZ")

    def _updated(self) -> datetime.datetime:
        return datetime.datetime.fromisoformat(self.updated.replace("Z", "+00:00"))


class _GcsClaim(Claim):
    def __init__(self, output: str, holder: Holder, taken_over: Holder | None, client: GcsClient,
                 generation: int, heartbeat_s: float | None) -> None:
        super().__init__(output, holder, taken_over)
        self._client = client
        self._generation = generation
        self._lost = False
        self._lock = threading.Lock()  # one write at a time: renewal or release
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if heartbeat_s is not None:
            self._thread = threading.Thread(target=self._renew_every, args=(heartbeat_s,),
                                            name="beam-prep-claim", daemon=True)
            self._thread.start()

    @property
    def lost(self) -> bool:
        return self._lost

    @property
    def generation(self) -> int:
        """The claim's version on GCS, as we last wrote it."""
        return self._generation

    def _renew_every(self, heartbeat_s: float) -> None:
        while not self._stop.wait(heartbeat_s):
            if not self._renew():
                return

    def _renew(self) -> bool:
        """Rewrites the claim if it is still ours; False once renewing is over."""
        with self._lock:
            if self._stop.is_set() or self._lost:
                return False
            renewed = dataclasses.replace(self.holder, heartbeat=_utc_now())
            try:
                info = self._client.create(self.path, renewed.to_json(), self._generation,
                                           content_type="application/json")
            except GcsPreconditionFailed:
                self._lost = True
                _LOG.error("run %s lost its claim on %s: another run judged it stale and took the "
                           "folder over; this run's output can no longer be trusted",
                           self.run_id, self.output)
                return False
            except BeamPrepError as e:
                _LOG.warning("could not renew the claim %s (will try again): %s", self.path, e)
                return True
            self._generation = info.generation
            return True

    def _release(self) -> None:
        self._stop.set()
        with self._lock:
            if not self._lost:
                self._delete_ours()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _delete_ours(self) -> None:
        try:
            self._client.delete(self.path, if_generation_match=self._generation)
        except GcsPreconditionFailed:
            self._lost = True
            _LOG.error("run %s had lost its claim on %s to another run", self.run_id, self.output)
        except BeamPrepError as e:
            _LOG.warning("could not remove the claim %s (the next run takes it over once it is "
                         "stale): %s", self.path, e)


def _claim_gcs(output: str, holder: Holder, stale_after_s: float,
               heartbeat_s: float | None) -> Claim:
    client = GcsClient(connections=2, timeout=_GCS_TIMEOUT)  # a renewal and a release at once
    path = claim_path(output)
    data = holder.to_json()
    taken_over = None
    seen = None
    for _ in range(_ATTEMPTS):
        try:
            info = client.create(path, data, if_generation_match=0, content_type="application/json")
            return _GcsClaim(output, holder, taken_over, client, info.generation, heartbeat_s)
        except GcsPreconditionFailed:
            pass
        seen = _read_gcs_claim(client, path)
        if seen is None:
            continue  # released or taken over meanwhile
        why = _staleness(seen, stale_after_s)
        if why is None:
            raise _gcs_busy(output, seen, stale_after_s)
        _LOG.warning("the claim on %s by %s is stale (%s); taking it over", output,
                     seen.holder.describe(), why)
        try:
            client.delete(path, if_generation_match=seen.generation)
        except GcsPreconditionFailed:
            continue  # renewed by its holder, or taken over by another run first
        # Gone (by us, or by another run that takes it over too): whichever creates first wins.
        taken_over = seen.holder
    if seen is not None:
        raise _gcs_busy(output, seen, stale_after_s)
    raise StorageError(f"cannot claim {output}: {path} kept changing")


def _read_gcs_claim(client: GcsClient, path: str) -> _Seen | None:
    """The claim now on GCS, None if there is none; the bytes are those of the version stat saw."""
    current = client.read_current(path)
    if current is None:
        return None
    info, data = current
    return _Seen(_parse_holder(data), info.generation, info.updated)


def _staleness(seen: _Seen, stale_after_s: float) -> str | None:
    """Why the claim is stale, or None while its holder may be alive."""
    if seen.holder.is_gone():
        return f"process {seen.holder.pid} on {seen.holder.host} is gone"
    age = seen.age_s()
    if age > stale_after_s:
        return f"not renewed for {age:.1f} s, more than {stale_after_s:g} s"
    return None


def _gcs_busy(output: str, seen: _Seen, stale_after_s: float) -> OutputBusy:
    return OutputBusy(output, seen.holder, f"last seen {seen.last_seen()} ({max(0.0, seen.age_s()):.0f} s ago)",
                      f"wait for it to end, or stop it: its claim ({claim_path(output)}) is taken "
                      f"over once not renewed for {stale_after_s:g} s")


# --- other schemes: best effort ----------------------------------------------------

class _BestEffortClaim(Claim):
    def _release(self) -> None:
        try:
            FileSystems.delete([self.path])
        except Exception as e:  # noqa: BLE001 - each filesystem raises its own types.
            _LOG.warning("could not remove the claim %s: %s", self.path, e)


def _claim_best_effort(output: str, holder: Holder) -> Claim:
    path = claim_path(output)
    previous = _guarded(path, "read the claim", lambda: _read_best_effort(path))
    if previous is not None and not previous.is_gone():
        raise OutputBusy(output, previous, "as its claim says",
                         f"wait for it to end, or stop it; if it is gone, delete {path}")

    def write() -> None:
        with FileSystems.create(path, mime_type="application/json") as f:
            f.write(holder.to_json())

    _guarded(path, "write the claim", write)
    return _BestEffortClaim(output, holder, previous)


def _read_best_effort(path: str) -> Holder | None:
    if not FileSystems.exists(path):
        return None
    with FileSystems.open(path, mime_type="application/json") as f:
        return _parse_holder(f.read())


def _guarded(path: str, action: str, call: Callable[[], _T]) -> _T:
    try:
        return call()
    except BeamPrepError:
        raise
    except Exception as e:  # noqa: BLE001 - each filesystem raises its own types.
        raise storage_error(action, path, e) from e


# --- helpers ---------------------------------------------------------------------------

def _parse_holder(data: bytes) -> Holder:
    try:
        return Holder.from_json(data)
    except ValueError:
        return Holder.unknown()


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _machine_id() -> str | None:
    """This kernel's boot id and this process's pid namespace (Linux); None elsewhere."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True
