"""Claims on gs:// folders: an object written only under generation preconditions; see ``beam_prep.write.run.claim``."""
from __future__ import annotations

import dataclasses
import datetime
import logging
import threading
import time

from beam_prep.errors import BeamPrepError, StorageError
from beam_prep.io.gcs import GcsClient, GcsPreconditionFailed
from beam_prep.io.gcs_transport import Timeout
from beam_prep.write.run.claim.holder import (
    _ATTEMPTS,
    Claim,
    Holder,
    OutputBusy,
    _parse_holder,
    _utc_now,
    claim_path,
)

_LOG = logging.getLogger(__name__)

# The claim is tiny: an answer slower than this is a hung request, better retried.
_GCS_TIMEOUT = Timeout(connect=10.0, read=20.0)


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
