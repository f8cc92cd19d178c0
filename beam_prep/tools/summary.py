"""What a prepared output folder holds, summed up for a person to look at before training.

``summarize(OUT)`` builds a typed :class:`Summary` from the three things a
finished run leaves: the manifest (read with the reader's own
:func:`~beam_prep.reader.sources.read_manifest`, so inspection checks it the
way training will), each shard file's size (one ``stat`` per shard, run
concurrently because on ``gs://`` each is a round trip), ``errors.jsonl``,
whose failures are grouped by stage and reason, and ``skipped.jsonl``, a few
of whose files are kept per reason as examples. ``inspection`` turns it into
the table ``beam-prep inspect`` prints, and into what ``--json`` prints.

A local folder's files are read with ``os`` and ``open``, so that ``inspect``
imports no TensorFlow (seconds of a core, for a summary that takes
milliseconds); any other (``gs://``) through ``tf.io.gfile``, as the reader
reads it. A shard the manifest lists but the folder lacks is reported in the
summary (``missing``), not raised: the point is to see what is there.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import os
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from beam_prep.errors import DatasetError, StorageError
from beam_prep.io.storage import is_local, join, storage_error
from beam_prep.model.dataset import DatasetInfo
from beam_prep.write.shared.layout import ERRORS, SKIPPED

__all__ = [
    "ClassRow",
    "FailureGroup",
    "Imbalance",
    "ShardStats",
    "SplitSummary",
    "Spread",
    "Summary",
    "open_output",
    "summarize",
]

_LOG = logging.getLogger(__name__)

# Concurrent stat requests: a thousand shards on gs:// take a few seconds, not minutes.
STAT_THREADS = 16
# Skipped files shown per reason: enough to recognise what they are; the file has every one.
SKIPPED_EXAMPLES = 3


@dataclasses.dataclass(frozen=True)
class Spread:
    """Smallest, median and largest of some values (shard sizes, records per shard)."""

    min: float
    median: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        return cls(min(values), statistics.median(values), max(values)) if values else None


@dataclasses.dataclass(frozen=True)
class ShardStats:
    """One split's shard files: how many, how big, how many records each.

    ``bytes`` covers the files that exist; ``records`` is None when the manifest
    does not list per-shard counts (the shuffle sink does not know them).
    """

    count: int
    total_bytes: int
    bytes: Spread | None
    records: Spread | None
    missing: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Imbalance:
    """Largest class count divided by the smallest; ``ratio`` is None when a class has none."""

    ratio: float | None
    largest: tuple[str, int]
    smallest: tuple[str, int]

    @classmethod
    def of(cls, counts: Mapping[str, int]) -> Imbalance | None:
        if not counts:
            return None
        largest = max(counts.items(), key=lambda kv: kv[1])
        smallest = min(counts.items(), key=lambda kv: kv[1])
        ratio = largest[1] / smallest[1] if smallest[1] else None
        return cls(ratio, largest, smallest)


@dataclasses.dataclass(frozen=True)
class SplitSummary:
    name: str
    num_examples: int
    shards: ShardStats
    imbalance: Imbalance | None  # None when the manifest has no class counts


@dataclasses.dataclass(frozen=True)
class ClassRow:
    """One class: its stored id (index + the writer's label offset), name and counts per split."""

    id: int
    name: str
    counts: Mapping[str, int]
    total: int


@dataclasses.dataclass(frozen=True)
class FailureGroup:
    """Failed images that share a stage and a reason (the error's type), with the first as an example."""

    stage: str
    reason: str
    count: int
    example_path: str
    example_message: str


@dataclasses.dataclass(frozen=True)
class Summary:
    """Everything ``beam-prep inspect`` shows about one output folder."""

    root: str
    info: DatasetInfo
    splits: tuple[SplitSummary, ...]
    classes: tuple[ClassRow, ...]  # largest first; empty when the manifest has no class counts
    imbalance: Imbalance | None  # over all splits
    counts: Mapping[str, int]  # listed, written, failed, skipped
    skipped_by_reason: Mapping[str, int]
    failed_by_stage: Mapping[str, int]
    failures: tuple[FailureGroup, ...]  # from errors.jsonl, most frequent first
    errors_file: str | None  # None when the folder has no errors.jsonl
    created: str | None = None
    beam_prep_version: str | None = None
    duplicates: Mapping[str, Any] | None = None  # the manifest's; None from versions before it
    originals: Mapping[str, Any] | None = None  # the manifest's, with --image_format original only
    flat_images: Mapping[str, Any] | None = None  # the manifest's; None from versions before it
    # From skipped.jsonl: reason -> the first SKIPPED_EXAMPLES relative paths, by path (the files
    # --cross_split_duplicates drop left out too, by their reasons).
    skipped_examples: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    skipped_file: str | None = None  # None when the folder has no skipped.jsonl (versions before it)

    @property
    def missing_shards(self) -> tuple[str, ...]:
        return tuple(name for s in self.splits for name in s.shards.missing)


def open_output(path: str) -> tuple[DatasetInfo, dict[str, Any]]:
    """The checked dataset model and the whole manifest of the output folder ``path``.

    Raises:
      DatasetError: a local folder that does not exist, or no usable manifest
        (naming it, as the reader does).
      StorageError: the folder cannot be read.
    """
    from beam_prep.reader.sources import read_manifest

    if is_local(path) and not os.path.isdir(path):
        raise DatasetError(f"output folder {path} does not exist" if not os.path.exists(path)
                           else f"{path} is not a folder: give the output folder of a beam-prep run")
    return read_manifest(path)


def summarize(path: str, opened: tuple[DatasetInfo, dict[str, Any]] | None = None,
              side_files: bool = True) -> Summary:
    """Reads ``path``'s manifest, stats its shards, groups its ``errors.jsonl`` and takes
    examples from its ``skipped.jsonl``.

    Args:
      path: the output folder.
      opened: its manifest, already read (``open_output``): not read again.
      side_files: False leaves errors.jsonl and skipped.jsonl unread (``failures`` and
        ``skipped_examples`` empty), for a caller that reads them its own way, once.

    Raises:
      DatasetError: the folder or its manifest is missing or unusable; errors.jsonl
        or skipped.jsonl is not one JSON object a line.
      StorageError: something cannot be read (permissions, network).
    """
    info, manifest = opened or open_output(path)
    sizes = _shard_sizes([f for split in info.splits.values() for f in split.files])
    splits = tuple(_split_summary(info, name, sizes) for name in info.splits)
    classes = _class_rows(info)
    totals = {row.name: row.total for row in classes}
    errors_file = join(info.root, ERRORS)
    failures = _failure_groups(errors_file) if side_files else None
    skipped_file = join(info.root, SKIPPED)
    dropped = (manifest.get("duplicates") or {}).get("dropped_by_reason", {})  # named in skipped.jsonl too
    skipped_examples = (_skipped_examples(skipped_file, {**manifest.get("skipped_by_reason", {}), **dropped})
                        if side_files else None)
    return Summary(
        root=info.root, info=info, splits=splits, classes=classes,
        imbalance=Imbalance.of(totals),
        counts=dict(manifest.get("counts", {})),
        skipped_by_reason=dict(manifest.get("skipped_by_reason", {})),
        failed_by_stage=dict(manifest.get("failed_by_stage", {})),
        failures=tuple(failures) if failures is not None else (),
        errors_file=errors_file if failures is not None else None,
        created=manifest.get("created"), beam_prep_version=manifest.get("beam_prep_version"),
        duplicates=manifest.get("duplicates"), originals=manifest.get("originals"),
        flat_images=manifest.get("flat_images"),
        skipped_examples=skipped_examples or {},
        skipped_file=skipped_file if skipped_examples is not None else None)


def _shard_sizes(files: Sequence[str]) -> dict[str, int | None]:
    """Each file's size in bytes, None for one that does not exist."""
    if not files:
        return {}
    if all(is_local(f) for f in files):
        return {f: _local_size(f) for f in files}
    import tensorflow as tf

    def size(path: str) -> int | None:
        try:
            return int(tf.io.gfile.stat(path).length)
        except tf.errors.NotFoundError:
            return None
        except tf.errors.OpError as e:
            raise StorageError(f"cannot stat {path}: {e.message}") from e

    with concurrent.futures.ThreadPoolExecutor(min(STAT_THREADS, len(files))) as pool:
        return dict(zip(files, pool.map(size, files)))


def _local_size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None
    except OSError as e:
        raise storage_error("stat", path, e) from e


@contextlib.contextmanager
def _lines(path: str) -> Iterator[Iterable[str] | None]:
    """The text lines of ``path``, or None where it does not exist; a failed read raises
    StorageError naming it. A local file with ``open``, any other through ``tf.io.gfile``."""
    if is_local(path):
        try:
            f = open(path, encoding="utf-8")
        except FileNotFoundError:
            yield None
            return
        except OSError as e:
            raise storage_error("read", path, e) from e
        with f:
            try:
                yield f
            except (OSError, UnicodeDecodeError) as e:
                raise storage_error("read", path, e) from e
        return
    import tensorflow as tf

    try:
        exists = tf.io.gfile.exists(path)  # asked first: a GFile opens at its first read, in the caller's loop
    except tf.errors.OpError as e:
        raise StorageError(f"cannot read {path}: {e.message}") from e
    if not exists:
        yield None
        return
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            yield f
    except tf.errors.OpError as e:
        raise StorageError(f"cannot read {path}: {e.message}") from e


def _split_summary(info: DatasetInfo, name: str, sizes: Mapping[str, int | None]) -> SplitSummary:
    split = info.splits[name]
    present = [sizes[f] for f in split.files if sizes.get(f) is not None]
    missing = tuple(shard for shard, f in zip(split.shards, split.files) if sizes.get(f) is None)
    if missing:
        _LOG.warning("split %s: %d of its %d shards are missing, e.g. %s", name, len(missing),
                     len(split.shards), join(info.root, missing[0]))
    stats = ShardStats(count=len(split.shards), total_bytes=sum(present), bytes=Spread.of(present),
                       records=Spread.of(split.shard_num_examples or ()), missing=missing)
    imbalance = Imbalance.of(split.class_counts) if split.class_counts is not None else None
    return SplitSummary(name, split.num_examples, stats, imbalance)


def _class_rows(info: DatasetInfo) -> tuple[ClassRow, ...]:
    """A row per label, largest total first (then by id); none if a split lacks class counts."""
    if not info.splits or any(s.class_counts is None for s in info.splits.values()):
        return ()
    rows = []
    for index, name in enumerate(info.labels):
        counts = {split: int(s.class_counts.get(name, 0)) for split, s in info.splits.items()}
        rows.append(ClassRow(index + info.label_offset, name, counts, sum(counts.values())))
    return tuple(sorted(rows, key=lambda row: (-row.total, row.id)))


def _failure_groups(errors_file: str) -> list[FailureGroup] | None:
    """errors.jsonl grouped by (stage, error type), most frequent first; None if there is no file."""
    groups: dict[tuple[str, str], list[Any]] = {}
    with _lines(errors_file) as lines:
        if lines is None:
            _LOG.warning("%s does not exist: failures are counted by stage only", errors_file)
            return None
        for key, failure in failures(lines, errors_file):
            if key in groups:
                groups[key][0] += 1
            else:
                groups[key] = [1, str(failure.get("path", "")), str(failure.get("message", ""))]
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return [FailureGroup(stage, reason, n, example_path, message)
            for (stage, reason), (n, example_path, message) in ordered]


def failures(lines: Iterable[str], errors_file: str) -> Iterator[tuple[tuple[str, str], dict[str, Any]]]:
    """Each failure of errors.jsonl's ``lines`` with its group, ``(stage, error type)``.

    Raises:
      DatasetError: a line is not a failure report (naming ``errors_file`` and the line).
    """
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            failure = json.loads(line)
            key = (str(failure["stage"]), str(failure.get("error_type", "unknown")))
        except (ValueError, KeyError, TypeError) as e:
            raise DatasetError(f"{errors_file} line {number} is not a failure report: {e}") from e
        yield key, failure


def _skipped_examples(skipped_file: str, counts: Mapping[str, int],
                      per_reason: int = SKIPPED_EXAMPLES) -> dict[str, tuple[str, ...]] | None:
    """The first ``per_reason`` relative paths of each reason in skipped.jsonl (sorted by path, so the
    first by name); None if there is no such file, as in datasets from versions before it.

    Read only until each reason the manifest counts (``counts``) has its examples: a tree
    of annotations beside its images may skip millions of files.
    """
    examples: dict[str, list[str]] = {}
    missing = sum(min(int(n), per_reason) for n in counts.values())
    with _lines(skipped_file) as lines:
        if lines is None:
            return None
        for number, line in enumerate(lines, 1):
            if missing <= 0:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                reason, relpath = str(row["reason"]), str(row["relpath"])
            except (ValueError, KeyError, TypeError) as e:
                raise DatasetError(f"{skipped_file} line {number} is not a skipped file's: {e}") from e
            shown = examples.setdefault(reason, [])
            if len(shown) < per_reason:
                shown.append(relpath)
                missing -= reason in counts
    return {reason: tuple(paths) for reason, paths in examples.items()}
