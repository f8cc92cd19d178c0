"""How many images a local job's workers have processed, seen by the launcher while the job runs.

Beam's metrics reach the launcher of a local job only with its result, at the
end, and the multi-process DirectRunner's workers are separate processes. So
each DoFn that converts images keeps its counts in a small JSON file in a
folder the launcher made, rewritten whole (write, then rename) at most every
``WRITE_EVERY_S`` seconds and once at the end, and the launcher sums the files
as it pleases (``Watcher``). Counts are of images a worker has finished, written
or failed, not of shards started. Images finished before any worker starts (the
shards a resumed run keeps, files under a label missing from --labels_file) are
the launcher's to add (``Carried``): counted done, never in the rate.

The folder is in the temp directory, never in ``--output``: that may be gs://,
and must hold the dataset's files alone. A file is named by the unit of work
that owns it (a shard, in the streaming sink), so a retried shard rewrites its
own counts instead of adding to them. On Dataflow none of this runs: the job's
counters (``tally.NAMESPACE``) carry the same numbers.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["Carried", "Phases", "Progress", "Reporter", "Watcher", "phases", "progress_folder", "read_progress",
           "reporter"]

_LOG = logging.getLogger(__name__)
# A worker rewrites its file at most this often: a few small writes a second per
# worker cost nothing next to decoding images, and keep a bar moving smoothly.
WRITE_EVERY_S = 0.5
_SUFFIX = ".json"
FOLDER_PREFIX = "beam-prep-progress-"


class Reporter:
    """A worker's counts for one unit of work (a shard), kept in ``folder/<name>.json``.

    Created when the work starts: its file says so at once (zero images done), so
    the launcher can tell start-up from processing.
    """

    def __init__(self, folder: str, name: str, clock: Callable[[], float] = time.time) -> None:
        self._path = os.path.join(folder, name + _SUFFIX)
        self._clock = clock
        self._started = clock()
        self._updated = self._started
        self._written_at = float("-inf")
        self.done = 0
        self.failed = 0
        self.flush()

    def add(self, ok: bool) -> None:
        """Counts one finished image (``ok``: it became a record); writes the file if it is due."""
        self.done += 1
        self.failed += int(not ok)
        self._updated = self._clock()
        if self._updated - self._written_at >= WRITE_EVERY_S:
            self.flush()

    def flush(self) -> None:
        """Writes the counts now. A file that cannot be written only costs the progress display."""
        record = {"done": self.done, "failed": self.failed, "started": self._started, "updated": self._updated}
        temporary = f"{self._path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "w", encoding="utf-8") as f:
                json.dump(record, f)
            os.replace(temporary, self._path)
        except OSError as e:
            _LOG.debug("cannot write progress to %s: %s", self._path, e)
        self._written_at = self._updated


class _Unwatched:
    """A reporter where nobody can watch (a remote runner's workers): counts nothing, writes nothing."""

    def add(self, ok: bool) -> None:
        pass

    def flush(self) -> None:
        pass


def reporter(folder: str | None, name: str) -> Reporter | _Unwatched:
    """A ``Reporter`` for work ``name`` in ``folder``, or one that does nothing if ``folder`` is None."""
    return _Unwatched() if folder is None else Reporter(folder, name)


@dataclasses.dataclass(frozen=True)
class Carried:
    """Images the launcher counts finished before any worker starts, none of them work of this
    run's workers: the shards a resumed run keeps, and files under a label missing from
    --labels_file (each a failure).

    Attributes:
      done: images, written or failed.
      failed: of ``done``, those without a record.
    """

    done: int = 0
    failed: int = 0


@dataclasses.dataclass(frozen=True)
class Progress:
    """The job's counts so far, over all workers.

    Attributes:
      total: images listed.
      done: images finished, written or failed (at most ``total``), ``carried`` included.
      failed: images that became no record, so far.
      started: when the first worker began converting images (wall time, s), None before.
      updated: when the last image counted here was finished, None before any.
      carried: of ``done``, the images no worker of this run processed (``Carried``):
        left out of the rate, which would otherwise count a resumed run's kept
        shards as work done in no time.
    """

    total: int
    done: int = 0
    failed: int = 0
    started: float | None = None
    updated: float | None = None
    carried: int = 0

    @property
    def finished(self) -> bool:
        return self.done >= self.total

    @property
    def processed(self) -> int:
        """Images this run's workers finished."""
        return self.done - self.carried

    def rate(self, now: float) -> float | None:
        """Images processed a second since processing began, until ``now`` or the last image; None before any."""
        if self.started is None or self.processed <= 0:
            return None
        end = self.updated if self.finished and self.updated is not None else now
        return self.processed / max(end - self.started, 1e-3)

    def eta(self, now: float) -> float | None:
        """Seconds left at the rate so far; None while there is no rate."""
        rate = self.rate(now)
        return None if rate is None else (self.total - self.done) / rate


def read_progress(folder: str, total: int, carried: Carried = Carried()) -> Progress:
    """Sums the workers' files in ``folder``, and ``carried``, counted from the start.

    A file that cannot be read is skipped: the next reading will have it.
    """
    done, failed, started, updated = carried.done, carried.failed, None, None
    try:
        names = [n for n in os.listdir(folder) if n.endswith(_SUFFIX)]
    except OSError:
        names = []
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                record = json.load(f)
            d, fl, s, u = int(record["done"]), int(record["failed"]), float(record["started"]), float(record["updated"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        done, failed = done + d, failed + fl
        started = s if started is None else min(started, s)
        if d:
            updated = u if updated is None else max(updated, u)
    # A retried bundle of the shuffle sink counts its images again: never past the listing.
    return Progress(total=total, done=min(done, total), failed=min(failed, total),
                    started=started, updated=updated, carried=min(carried.done, total))


@dataclasses.dataclass(frozen=True)
class Phases:
    """Where a run's time went: start-up (listing, building the job, starting workers)
    until the first image's work began, then processing at ``rate``."""

    startup_seconds: float
    processing_seconds: float
    images: int

    @property
    def rate(self) -> float:
        return self.images / max(self.processing_seconds, 1e-3)


def phases(progress: Progress, launched: float) -> Phases | None:
    """The phases of a finished run launched at wall time ``launched``, its rate that of the
    images its workers processed; None if they processed none."""
    if progress.started is None or progress.updated is None or progress.processed <= 0:
        return None
    return Phases(startup_seconds=max(progress.started - launched, 0.0),
                  processing_seconds=max(progress.updated - progress.started, 0.0),
                  images=progress.processed)


@contextlib.contextmanager
def progress_folder() -> Iterator[str]:
    """A fresh folder for the workers' files, in the temp directory, removed at the end.

    Its name holds the launcher's process id, so the folders of launchers that
    were killed (and never reached their ``finally``) are removed by the next run.
    """
    _remove_orphans(tempfile.gettempdir())
    folder = tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _remove_orphans(parent: str) -> None:
    """Removes progress folders whose launcher process is gone."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        pid = name[len(FOLDER_PREFIX):].split("-", 1)[0]
        if not name.startswith(FOLDER_PREFIX) or not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive, and not ours to judge
        return True
    return True


class Watcher:
    """For the life of a ``with`` block, calls ``on_progress`` with the counts every ``interval`` seconds,
    and once more with the last counts when the block ends.

    On a thread of its own, as the local runner blocks the launcher's until the
    job ends. An exception in ``on_progress`` is logged and ends the watching,
    never the job.
    """

    def __init__(self, folder: str, total: int, on_progress: Callable[[Progress], None],
                 carried: Carried = Carried(), interval: float = 0.5) -> None:
        self._read = lambda: read_progress(folder, total, carried)
        self._on_progress = on_progress
        self._interval = interval
        self._stop = threading.Event()
        self._broken = False
        self._thread = threading.Thread(target=self._watch, name="beam-prep-progress", daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._report()  # the workers' last reports may have come after the last reading

    def _watch(self) -> None:
        while not self._stop.wait(self._interval) and self._report():
            pass

    def _report(self) -> bool:
        """Calls ``on_progress`` with the counts now; False once it has failed."""
        if self._broken:
            return False
        try:
            self._on_progress(self._read())
        except Exception:  # noqa: BLE001 - a display's bug must not stop a job.
            _LOG.exception("the progress display failed; the job goes on without it")
            self._broken = True
        return not self._broken
