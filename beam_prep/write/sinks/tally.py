"""One image to one counted record, the step both sinks share, and the counters a user watches.

Whichever sink writes the shards, every file goes through ``count_image``: made
into its record (``examples.make_example``), counted in the runner's counters
(``Counters``) and in the progress display (``journal.progress``), and kept as
an ``ExampleRow`` or a failure report.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from apache_beam.metrics import Metrics

from beam_prep.errors import ImageError
from beam_prep.write.finish import duplicates
from beam_prep.write.images.examples import Outcome, make_example
from beam_prep.write.images.imaging import Flat, ImageSpec
from beam_prep.write.journal.progress import Reporter
from beam_prep.write.shared.entry import FileEntry
from beam_prep.write.shared.shard_formats import ShardFormat

__all__ = ["NAMESPACE", "Counted", "Counters", "ExampleRow", "count_image"]

NAMESPACE = "beam_prep"  # of every counter the pipeline reports


class Counters:
    """The counters a user watches in the runner's UI (``failed_<stage>`` made as stages appear)."""

    def __init__(self) -> None:
        self.written = Metrics.counter(NAMESPACE, "written")
        self.bytes_in = Metrics.counter(NAMESPACE, "bytes_in")
        self.bytes_out = Metrics.counter(NAMESPACE, "bytes_out")
        self._failed: dict[str, Any] = {}

    def count(self, outcome: Outcome) -> bool:
        """Counts one file's outcome; True if it became a record."""
        self.bytes_in.inc(outcome.bytes_in)
        if outcome.failure is not None:
            stage = outcome.failure["stage"]
            if stage not in self._failed:
                self._failed[stage] = Metrics.counter(NAMESPACE, f"failed_{stage}")
            self._failed[stage].inc()
            return False
        self.written.inc()
        self.bytes_out.inc(len(outcome.example))
        return True


class ExampleRow(NamedTuple):
    """One file made into a record: what a sink keeps of it for its shard and the manifest.

    Attributes:
      split: the split the record goes to.
      labels: the label names it counts under in ``class_counts`` (``FileEntry.counted_labels``).
      example: the record's bytes, as its shard format stores them.
      original: with ``--image_format original``, ``KEPT`` or the reason it was re-encoded; else None.
      hash_line: its line in the duplicates report's hash files (``duplicates.hash_line``).
      flat: the one flat colour the image shows, if so (``imaging.Flat``; ``flat.FlatImages``).
    """

    split: str
    labels: tuple[str, ...]
    example: bytes
    original: str | None
    hash_line: str
    flat: Flat | None


class Counted(NamedTuple):
    """A file's ``count_image``: exactly one of ``row`` (it became a record) and ``failure``
    (its failure report, ``examples.failure_report``) is set."""

    row: ExampleRow | None
    failure: dict[str, Any] | None


def count_image(entry: FileEntry, data: bytes | ImageError | None, spec: ImageSpec, file_format: ShardFormat,
                counters: Counters, reporter: Reporter) -> Counted:
    """One file to its record, counted: the per-image step of both sinks.

    Args:
      entry: the listed file.
      data: its bytes, the ``ImageError`` its read raised, or None to read it here.
      spec: what the image becomes.
      file_format: the shards' format, which makes the record's bytes.
      counters: the runner's counters, counted once for the file.
      reporter: the progress report (``progress.reporter``: a ``Reporter``, or its stand-in where
        nobody watches), told whether it became a record.

    Returns:
      The record's row, or the file's failure report.
    """
    outcome = make_example(entry, spec, data, file_format)
    ok = counters.count(outcome)
    reporter.add(ok)
    if not ok:
        return Counted(None, outcome.failure)
    return Counted(ExampleRow(entry.split, entry.counted_labels, outcome.example, outcome.original,
                              duplicates.hash_line(outcome.sha256, entry.split, entry.path,
                                                                  None if outcome.flat else outcome.phash,
                                                                  entry.label if entry.labels is None else entry.labels),
                              outcome.flat), None)
