"""What a prepared output folder holds, summed up for a person to look at before training.

``summarize(OUT)`` builds a typed :class:`Summary` from the three things a
finished run leaves: the manifest (read with the reader's own
:func:`~beam_prep.reader.sources.read_manifest`, so inspection checks it the
way training will), each shard file's size (one ``stat`` per shard, run
concurrently because on ``gs://`` each is a round trip), and ``errors.jsonl``,
whose failures are grouped by stage and reason. :func:`render_text` turns it
into the table ``beam-prep inspect`` prints, :func:`to_json` into what
``--json`` prints.

Everything goes through ``tf.io.gfile``, as the reader does, so local and
``gs://`` outputs take the same code. A shard the manifest lists but the folder
lacks is reported in the summary (``missing``), not raised: the point is to
see what is there.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from beam_prep.errors import DatasetError, StorageError
from beam_prep.io.storage import is_local, join
from beam_prep.model.dataset import DatasetInfo, ImageInfo
from beam_prep.wording import count
from beam_prep.write.imaging import REENCODE_REASONS
from beam_prep.write.layout import DUPLICATES, ERRORS

__all__ = [
    "ClassRow",
    "FailureGroup",
    "Imbalance",
    "ShardStats",
    "SplitSummary",
    "Spread",
    "Summary",
    "describe_image",
    "format_bytes",
    "format_number",
    "open_output",
    "originals_lines",
    "render_text",
    "summarize",
    "to_json",
]

_LOG = logging.getLogger(__name__)

# Concurrent stat requests: a thousand shards on gs:// take a few seconds, not minutes.
STAT_THREADS = 16
# The class table's row standing for the classes it leaves out.
ELIDED = "..."


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


def summarize(path: str) -> Summary:
    """Reads ``path``'s manifest, stats its shards and groups its ``errors.jsonl``.

    Raises:
      DatasetError: the folder or its manifest is missing or unusable; errors.jsonl
        is not one JSON object a line.
      StorageError: something cannot be read (permissions, network).
    """
    info, manifest = open_output(path)
    sizes = _shard_sizes([f for split in info.splits.values() for f in split.files])
    splits = tuple(_split_summary(info, name, sizes) for name in info.splits)
    classes = _class_rows(info)
    totals = {row.name: row.total for row in classes}
    errors_file = join(info.root, ERRORS)
    failures = _failure_groups(errors_file)
    return Summary(
        root=info.root, info=info, splits=splits, classes=classes,
        imbalance=Imbalance.of(totals),
        counts=dict(manifest.get("counts", {})),
        skipped_by_reason=dict(manifest.get("skipped_by_reason", {})),
        failed_by_stage=dict(manifest.get("failed_by_stage", {})),
        failures=tuple(failures) if failures is not None else (),
        errors_file=errors_file if failures is not None else None,
        created=manifest.get("created"), beam_prep_version=manifest.get("beam_prep_version"),
        duplicates=manifest.get("duplicates"), originals=manifest.get("originals"))


def _shard_sizes(files: Sequence[str]) -> dict[str, int | None]:
    """Each file's size in bytes, None for one that does not exist."""
    import tensorflow as tf

    def size(path: str) -> int | None:
        try:
            return int(tf.io.gfile.stat(path).length)
        except tf.errors.NotFoundError:
            return None
        except tf.errors.OpError as e:
            raise StorageError(f"cannot stat {path}: {e.message}") from e

    if not files:
        return {}
    with concurrent.futures.ThreadPoolExecutor(min(STAT_THREADS, len(files))) as pool:
        return dict(zip(files, pool.map(size, files)))


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
    import tensorflow as tf

    groups: dict[tuple[str, str], list[Any]] = {}
    try:
        with tf.io.gfile.GFile(errors_file, "r") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    failure = json.loads(line)
                    key = (str(failure["stage"]), str(failure.get("error_type", "unknown")))
                except (ValueError, KeyError, TypeError) as e:
                    raise DatasetError(f"{errors_file} line {number} is not a failure report: {e}") from e
                if key in groups:
                    groups[key][0] += 1
                else:
                    groups[key] = [1, str(failure.get("path", "")), str(failure.get("message", ""))]
    except tf.errors.NotFoundError:
        _LOG.warning("%s does not exist: failures are counted by stage only", errors_file)
        return None
    except tf.errors.OpError as e:
        raise StorageError(f"cannot read {errors_file}: {e.message}") from e
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return [FailureGroup(stage, reason, n, example_path, message)
            for (stage, reason), (n, example_path, message) in ordered]


# --- JSON --------------------------------------------------------------------


def to_json(summary: Summary) -> dict[str, Any]:
    """The summary as plain JSON types, for ``beam-prep inspect --json``."""
    def spread(s: Spread | None) -> dict[str, float] | None:
        return dataclasses.asdict(s) if s is not None else None

    def imbalance(i: Imbalance | None) -> dict[str, Any] | None:
        if i is None:
            return None
        return {"ratio": i.ratio, "largest": {"name": i.largest[0], "count": i.largest[1]},
                "smallest": {"name": i.smallest[0], "count": i.smallest[1]}}

    info = summary.info
    return {
        "path": summary.root,
        "created": summary.created,
        "beam_prep_version": summary.beam_prep_version,
        "image": {**info.image.to_json(), "compression": info.compression,
                  "label_offset": info.label_offset},
        "num_classes": info.num_classes,
        "splits": {s.name: {
            "num_examples": s.num_examples,
            "shards": {"count": s.shards.count, "total_bytes": s.shards.total_bytes,
                       "bytes": spread(s.shards.bytes), "records": spread(s.shards.records),
                       "missing": list(s.shards.missing)},
            "imbalance": imbalance(s.imbalance),
        } for s in summary.splits},
        "classes": [{"id": c.id, "name": c.name, "total": c.total, "counts": dict(c.counts)}
                    for c in summary.classes],
        "imbalance": imbalance(summary.imbalance),
        "counts": dict(summary.counts),
        "skipped_by_reason": dict(summary.skipped_by_reason),
        "failed_by_stage": dict(summary.failed_by_stage),
        "failures": [dataclasses.asdict(g) for g in summary.failures],
        "errors_file": summary.errors_file,
        "duplicates": dict(summary.duplicates) if summary.duplicates is not None else None,
        "originals": dict(summary.originals) if summary.originals is not None else None,
    }


# --- the table -----------------------------------------------------------------


def render_text(summary: Summary, max_classes: int | None = None) -> str:
    """The table ``beam-prep inspect`` prints.

    ``max_classes`` shortens the class table to that many of the largest and as
    many of the smallest classes (a thousand rows help nobody at a glance);
    None shows every class.
    """
    info = summary.info
    out = [f"{summary.root}: {count(info.num_classes, 'class', 'classes')}, "
           f"{count(sum(s.num_examples for s in summary.splits), 'example')}"
           + (f" (beam-prep {summary.beam_prep_version}, {summary.created})"
              if summary.created else "")]
    out += ["", "image: " + _image_line(info.image, info.compression, info.label_offset)]
    out += ["", *_table(
        ["split", "examples", "shards", "size total", "size min", "median", "max",
         "records min", "median", "max", "imbalance"],
        [_split_row(s) for s in summary.splits], right=range(1, 11))]
    for s in summary.splits:
        if s.shards.missing:
            more = f" and {len(s.shards.missing) - 1} more" if len(s.shards.missing) > 1 else ""
            out.append(f"  MISSING in {s.name}: {s.shards.missing[0]}{more} "
                       f"({len(s.shards.missing)} of {s.shards.count} shards)")
    out += ["", *_class_section(summary, max_classes)]
    out += ["", *_counts_section(summary)]
    if summary.duplicates is not None:
        out += ["", *_duplicates_section(summary)]
    return "\n".join(out) + "\n"


def describe_image(image: ImageInfo) -> str:
    """How images are stored, in a few words: ``224x224, 3 channels, jpeg``."""
    size = f"{image.height}x{image.width}" if image.fixed_size else "sizes vary"
    return f"{size}, {image.channels} channel{'s' if image.channels != 1 else ''}, {image.format}"


def _image_line(image: ImageInfo, compression: str, label_offset: int) -> str:
    parts = [describe_image(image), f"resize_mode {image.resize_mode or 'unknown'}",
             f"compression {compression}"]
    if label_offset:
        parts.append(f"label ids start at {label_offset}")
    return ", ".join(parts)


def _split_row(s: SplitSummary) -> list[str]:
    b, r = s.shards.bytes, s.shards.records
    sizes = [format_bytes(b.min), format_bytes(b.median), format_bytes(b.max)] if b else ["-"] * 3
    records = ([format_number(r.min), format_number(r.median), format_number(r.max)] if r
               else ["unknown", "", ""])
    return [s.name, str(s.num_examples), str(s.shards.count), format_bytes(s.shards.total_bytes),
            *sizes, *records, _ratio(s.imbalance)]


def _class_section(summary: Summary, max_classes: int | None) -> list[str]:
    if not summary.classes:
        return [f"classes: {summary.info.num_classes} (the manifest has no per-class counts)"]
    split_names = [s.name for s in summary.splits]
    rows = [[str(c.id), c.name, *(str(c.counts[n]) for n in split_names), str(c.total)]
            for c in summary.classes]
    shown: list[list[str]] = rows
    if max_classes is not None and len(rows) > 2 * max_classes:
        hidden = len(rows) - 2 * max_classes
        shown = rows[:max_classes] + [[ELIDED, f"({hidden} more)"] + [""] * (len(split_names) + 1)] \
            + rows[-max_classes:]
    i = summary.imbalance
    head = (f"classes: {summary.info.num_classes}, largest first; imbalance (largest class / "
            f"smallest): {_ratio(i)}")
    if i is not None and i.largest[1] == i.smallest[1]:
        head += f" (every class {i.largest[1]})"
    elif i is not None:
        head += f" ({i.largest[0]} {i.largest[1]} / {i.smallest[0]} {i.smallest[1]})"
    if any(s.imbalance is not None and s.imbalance.ratio is None for s in summary.splits):
        head += "; inf: a class has no examples"
    header = ["id", "class", *split_names, "total"]
    return [head, *_table(header, shown, right=[0, *range(2, len(header))])]


def _counts_section(summary: Summary) -> list[str]:
    c = summary.counts
    out = [f"files: {_number(c.get('listed'))} listed, {_number(c.get('written'))} written, "
           f"{_number(c.get('failed'))} failed, {_number(c.get('skipped'))} skipped"]
    out += [f"  skipped, {reason}: {n:,}" for reason, n in summary.skipped_by_reason.items()]
    out += originals_lines(summary.originals)
    if summary.failures:
        out += ["", f"failures by stage and reason (every one in {summary.errors_file}):"]
        out += _table(["stage", "reason", "count", "example"],
                      [[g.stage, g.reason, str(g.count), f"{g.example_path}: {g.example_message}"]
                       for g in summary.failures], right=[2])
    elif summary.failed_by_stage:
        out += ["", "failures by stage (no errors.jsonl to give reasons):"]
        out += [f"  {stage}: {n}" for stage, n in summary.failed_by_stage.items()]
    return out


def originals_lines(originals: Mapping[str, Any] | None) -> list[str]:
    """A manifest's ``originals`` (``--image_format original``): the sources kept byte for byte,
    and those re-encoded by reason; none without it. The run's summary shows the same lines."""
    if originals is None:
        return []
    return [f"  originals kept byte for byte: {originals['kept']:,}"] + [
        f"  re-encoded, {REENCODE_REASONS.get(reason, reason)}: {n:,}"
        for reason, n in originals["reencoded_by_reason"].items()]


def _duplicates_section(summary: Summary) -> list[str]:
    """Files with the same bytes, counted, and the manifest's examples: across splits first."""
    d = summary.duplicates
    if not d.get("extra_copies"):
        return ["duplicates: none (no two written files have the same bytes)"]
    out = [f"duplicates: {count(d['extra_copies'], 'extra copy', 'extra copies')} of {count(d['images'], 'image')} "
           f"({d['within_split']:,} within a split, {d['across_splits']:,} across splits; every one in "
           f"{join(summary.root, DUPLICATES)})"]
    for group in d.get("examples", []):
        files = ", ".join(f"{f['split']} {f['path']}" for f in group["files"])
        more = f" and {group['copies'] - len(group['files']):,} more" if group["copies"] > len(group["files"]) else ""
        out.append(f"  {group['sha256'][:12]} ({group['copies']:,} files): {files}{more}")
    return out


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], right: Iterable[int] = ()) -> list[str]:
    """Columns padded to their widest cell, numbers (the ``right`` columns) right-aligned."""
    rows = [list(header), *(list(r) for r in rows)]
    right = set(right)
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(len(header))]
    lines = []
    for r in rows:
        cells = [(cell.rjust(w) if i in right else cell.ljust(w)) for i, (cell, w) in enumerate(zip(r, widths))]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines


def format_bytes(n: float) -> str:
    """A size as the table shows it: bytes below 1 KiB, else KiB, MiB or GiB to one decimal."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_number(x: float) -> str:
    """A count as the table shows it: whole when it is (a median of two may not be)."""
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"


def _number(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def _ratio(i: Imbalance | None) -> str:
    if i is None:
        return "unknown"
    return f"{i.ratio:.2f}" if i.ratio is not None else "inf"
