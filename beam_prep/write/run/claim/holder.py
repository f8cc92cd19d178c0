"""Who holds an output folder's claim, and the claim every kind of folder shares."""
from __future__ import annotations

import dataclasses
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from beam_prep.errors import BeamPrepError, OptionsError
from beam_prep.io.storage import join, storage_error
from beam_prep.write.shared.layout import WORK_DIR

CLAIM_NAME = "claim.json"
DEFAULT_HEARTBEAT_S = 30.0
DEFAULT_STALE_AFTER_S = 300.0
# Tries at a claim that keeps changing under us (released, taken over) before giving up;
# each failed try means another run got through.
_ATTEMPTS = 50
_UNKNOWN = "unknown"
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


def _guarded(path: str, action: str, call: Callable[[], _T]) -> _T:
    try:
        return call()
    except BeamPrepError:
        raise
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error(action, path, e) from e


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
