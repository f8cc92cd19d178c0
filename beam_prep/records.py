"""One listed file to one serialised ``tf.train.Example``, or to a failure report.

Plain code shared by both sinks: whichever way the records are written, every
file goes through exactly this function, and every failure has the same shape.
"""
from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_prep.errors import ImageError
from beam_prep.features import ImageRecord, encode_example
from beam_prep.imaging import ImageSpec, process_image
from beam_prep.listing import FileEntry
from beam_prep.storage import is_local


class Outcome(NamedTuple):
    """Exactly one of ``example`` and ``failure`` is set."""

    example: bytes | None
    failure: dict[str, Any] | None
    bytes_in: int


def read_file(path: str) -> bytes:
    """Local files are read directly: Beam's filesystem dispatch costs 0.044 ms a call, 2% of an image's CPU."""
    try:
        if is_local(path):
            with open(path, "rb") as f:
                return f.read()
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            return f.read()
    except Exception as e:  # noqa: BLE001 - local and GCS raise different types.
        raise ImageError("read", f"cannot read file: {e}") from e


def failure_report(entry: FileEntry, error: ImageError) -> dict[str, Any]:
    """A line of errors.jsonl: which file, at which stage, and why."""
    cause = error.__cause__
    return {
        "path": entry.path,
        "relpath": entry.relpath,
        "label": entry.label,
        "stage": error.stage,
        "error_type": type(cause).__name__ if cause is not None else type(error).__name__,
        "message": str(error),
    }


def unknown_label_report(entry: FileEntry) -> dict[str, Any]:
    return failure_report(
        entry, ImageError("label", f"label folder {entry.label!r} is not in --labels_file"))


def make_example(entry: FileEntry, spec: ImageSpec) -> Outcome:
    """Reads, converts and serialises one file; a bad file becomes a report, never an exception."""
    data = b""
    try:
        data = read_file(entry.path)
        image = process_image(data, spec)
    except ImageError as e:
        return Outcome(None, failure_report(entry, e), len(data))
    record = ImageRecord(
        encoded=image.data,
        image_format=spec.image_format,
        height=image.height,
        width=image.width,
        channels=image.channels,
        label=entry.label_id,
        label_text=entry.label,
        filename=entry.relpath,
        sha256=hashlib.sha256(data).hexdigest(),
    )
    return Outcome(encode_example(record), None, len(data))
