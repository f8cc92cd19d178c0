"""One listed file to one record (``formats``: a serialised ``tf.train.Example``, or a
WebDataset sample), or to a failure report.

Plain code shared by both sinks: whichever way the records are written, every
file goes through exactly this function, and every failure has the same shape.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import threading
from typing import Any, NamedTuple

from beam_prep.errors import ImageError, StorageError
from beam_prep.io.gcs import GcsClient
from beam_prep.io.gcs_batch import BatchedReads
from beam_prep.io.storage import is_local, read_bytes
from beam_prep.model.features import ImageRecord
from beam_prep.write.images.imaging import Flat, ImageSpec, process_image
from beam_prep.write.shared.entry import UNKNOWN_LABEL, FileEntry, printable
from beam_prep.write.shared.shard_formats import ShardFormat, shard_format


class Outcome(NamedTuple):
    """Exactly one of ``example`` (the record's bytes, as its shard format stores them) and
    ``failure`` is set; ``original`` and ``flat`` as
    ``EncodedImage``'s, and ``phash``; ``sha256`` (hex, of the source file's bytes) with ``example``, for the
    duplicates report."""

    example: bytes | None
    failure: dict[str, Any] | None
    bytes_in: int
    original: str | None = None
    sha256: str | None = None
    flat: Flat | None = None
    phash: int | None = None


class FileReader:
    """Reads a listed file whole, by where it lives; one per worker, shared by its read threads.

    Local files are read with ``open()`` (Beam's filesystem dispatch costs more
    than the read); gs:// objects with one request each (``gcs.GcsClient``);
    any other scheme through Beam's ``FileSystems``. Every failure is an
    ``ImageError`` at stage ``read``, naming the reason. ``submit`` starts a
    read ahead: gs:// objects on one event-loop thread (``gcs_batch``), other
    files on the caller's pool.

    Args:
      connections: connections to keep open to GCS: as many as reads run at once.
    """

    def __init__(self, connections: int = 1) -> None:
        self._connections = connections
        self._gcs: GcsClient | None = None
        self._batched: BatchedReads | None = None
        self._lock = threading.Lock()

    def __call__(self, path: str) -> bytes:
        try:
            if is_local(path):
                # Unbuffered: FileIO reads a whole file in one allocation sized by its fstat, with
                # no buffer object around it (a few µs an image less).
                with open(path, "rb", buffering=0) as f:
                    return f.read()
            if path.startswith("gs://"):
                return self._gcs_client().read(path)
            return read_bytes(path)
        except StorageError as e:
            raise ImageError("read", str(e)) from e
        except Exception as e:  # local and remote filesystems raise different types.
            raise ImageError("read", f"cannot read file: {e}") from e

    def submit(self, path: str, pool: concurrent.futures.Executor) -> concurrent.futures.Future[bytes]:
        """Starts reading ``path``; the future's bytes or ``ImageError`` are the call's.

        gs:// objects are read on one event-loop thread, without a thread of
        ``pool`` each; ``pool`` runs the other reads, and a gs:// read the loop
        hands back (an error, a retry: see ``gcs_batch``).
        """
        if path.startswith("gs://"):
            return self._batched_reads().submit(path, pool)
        return pool.submit(self, path)

    def close(self) -> None:
        """Ends the event-loop thread of ``submit``'s gs:// reads, if one was started."""
        with self._lock:
            batched, self._batched = self._batched, None
        if batched is not None:
            batched.close()

    def _batched_reads(self) -> BatchedReads:
        batched = self._batched
        if batched is not None:
            return batched
        client = self._gcs_client()
        with self._lock:
            if self._batched is None:
                self._batched = BatchedReads(client, self, self._connections)
            return self._batched

    def _gcs_client(self) -> GcsClient:
        with self._lock:  # made on first use: a worker reading only local files never needs credentials
            if self._gcs is None:
                self._gcs = GcsClient(connections=self._connections)
            return self._gcs


def failure_report(entry: FileEntry, error: ImageError, data: bytes | None = None) -> dict[str, Any]:
    """A line of errors.jsonl: which file, at which stage, and why; with the ``sha256`` of its bytes
    where they were read (``data``), so that ``beam-prep report`` shows the file only while it is still
    the one that failed."""
    cause = error.__cause__
    report = {
        "path": printable(entry.path),
        "relpath": printable(entry.relpath),
        "label": entry.label,
        "stage": error.stage,
        "error_type": type(cause).__name__ if cause is not None else type(error).__name__,
        "message": str(error),
    }
    if data is not None:
        report["sha256"] = hashlib.sha256(data).hexdigest()
    return report


def unknown_label_report(entry: FileEntry) -> dict[str, Any]:
    """The report of a file listed under no known label: missing from --labels_file, or none at all."""
    if entry.labels is not None:
        missing = [name for name, i in zip(entry.labels, entry.label_ids or ()) if i == UNKNOWN_LABEL]
        message = (f"labels {', '.join(map(repr, missing))} are not in --labels_file" if missing
                   else "its --metadata row gives no label")
    elif not entry.label:
        message = "it has no label: its --metadata row gives none (or it is not in a folder)"
    elif entry.extra is not None:  # a --metadata row's label
        message = f"label {entry.label!r} is not in --labels_file"
    else:
        message = f"label folder {entry.label!r} is not in --labels_file"
    return failure_report(entry, ImageError("label", message))


def make_example(entry: FileEntry, spec: ImageSpec, data: bytes | ImageError | None = None,
                 file_format: ShardFormat | None = None) -> Outcome:
    """Reads, converts and serialises one file; a bad file becomes a report, never an exception.

    ``data`` is the file's bytes, or the ``ImageError`` its read raised, when the
    caller has read ahead; None reads the file here. ``file_format`` makes the
    record's bytes (default: TFRecord's ``tf.train.Example``).
    """
    try:
        if data is None:
            data = FileReader()(entry.path)
        if isinstance(data, ImageError):
            raise data
        image = process_image(data, spec)
    except ImageError as e:
        read = data if isinstance(data, bytes) else None
        return Outcome(None, failure_report(entry, e, read), len(read) if read is not None else 0)
    sha256 = hashlib.sha256(data).hexdigest()
    record = ImageRecord(
        encoded=image.data,
        image_format=spec.stored_format,
        height=image.height,
        width=image.width,
        channels=image.channels,
        label=entry.label_id,
        label_text=entry.label,
        filename=entry.relpath,
        sha256=sha256,
        label_ids=entry.label_ids,
        label_texts=entry.labels,
        extra=entry.extra,
    )
    payload = (file_format or shard_format("tfrecord")).payload(record, len(data))
    return Outcome(payload, None, len(data), image.original, sha256, image.flat, image.phash)
