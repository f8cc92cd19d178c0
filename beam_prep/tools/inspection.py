"""What an output folder holds (``summary.summarize``), as ``beam-prep inspect`` shows it:
:func:`render_text`, the table it prints, and :func:`to_json`, what ``--json`` prints.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from beam_prep.io.storage import join
from beam_prep.model.dataset import FILE_FORMATS, TFRECORD, DatasetInfo, ImageInfo
from beam_prep.tools.summary import Imbalance, SplitSummary, Spread, Summary
from beam_prep.wording import count, for_terminal
from beam_prep.write.images.imaging import REENCODE_REASONS
from beam_prep.write.shared.layout import DUPLICATES, FLAT

__all__ = ["describe_image", "flat_lines", "format_bytes", "format_number", "originals_lines", "render_text",
           "to_json", "versions_section"]

# The class table's row standing for the classes it leaves out.
ELIDED = "..."


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
        "file_format": info.file_format,
        "image": {**info.image.to_json(), "compression": info.compression,
                  "label_offset": info.label_offset},
        "num_classes": info.num_classes,
        "multi_label": info.multi_label,
        "label_cardinality": label_cardinality(summary),
        "extra_features": dict(info.extra_features),
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
        "skipped_examples": {reason: list(paths) for reason, paths in summary.skipped_examples.items()},
        "skipped_file": summary.skipped_file,
        "duplicates": dict(summary.duplicates) if summary.duplicates is not None else None,
        "originals": dict(summary.originals) if summary.originals is not None else None,
        "flat_images": dict(summary.flat_images) if summary.flat_images is not None else None,
        "versions": [v.to_json() for v in info.history],
    }


# --- the table -----------------------------------------------------------------


def render_text(summary: Summary, max_classes: int | None = None) -> str:
    """The table ``beam-prep inspect`` prints.

    ``max_classes`` shortens the class table to that many of the largest and as
    many of the smallest classes (a thousand rows help nobody at a glance);
    None shows every class.
    """
    info = summary.info
    classes = count(info.num_classes, 'class', 'classes') if info.labels else "no labels"
    out = [f"{summary.root}: {classes}, "
           f"{count(sum(s.num_examples for s in summary.splits), 'example')}"
           + (f" (beam-prep {summary.beam_prep_version}, {summary.created})"
              if summary.created else "")]
    out += ["", "image: " + _image_line(info.image, info.compression, info.label_offset, info.file_format)]
    out += _record_lines(summary)
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
    out += ["", *versions_section(summary.info)]
    out += ["", *_counts_section(summary)]
    if summary.duplicates is not None:
        out += ["", *_duplicates_section(summary)]
    # Each line with every control character of the values in it escaped (a path in errors.jsonl
    # holding a line break would end its line, and forge the next).
    return "".join(f"{for_terminal(line, one_line=True)}\n" for line in out)


def versions_section(info: DatasetInfo) -> list[str]:
    """The dataset's versions, oldest first: when, from what, what each added (its records per split,
    the classes it brought); a reader pins one with ``version=``."""
    history = info.history
    rows = []
    for v in history:
        new = info.labels[history[v.version - 2].num_labels if v.version > 1 else 0:v.num_labels]
        added = ", ".join(f"{split} {n:,}" for split, (_, n, _) in v.added.items()) or "nothing"
        classes = (f"{len(new)} new: {', '.join(new[:5])}{' ...' if len(new) > 5 else ''}" if v.version > 1
                   else str(len(new)))
        rows.append([str(v.version), v.created or "unknown", v.input or "unknown", added, classes])
    head = (f"versions: {len(history)}, the latest read unless a reader is given version= "
            f"(1-{len(history)})" if len(history) > 1 else "versions: 1")
    return [head, *_table(["version", "created", "input", "records added", "classes"], rows, right=[0])]


def describe_image(image: ImageInfo) -> str:
    """How images are stored, in a few words: ``224x224, 3 channels, jpeg``."""
    size = f"{image.height}x{image.width}" if image.fixed_size else "sizes vary"
    return f"{size}, {image.channels} channel{'s' if image.channels != 1 else ''}, {image.format}"


def label_cardinality(summary: Summary) -> float | None:
    """Labels per record on average: 1 for single-label data; None where no record is counted."""
    records = sum(s.num_examples for s in summary.splits)
    if not summary.info.labels:
        return 0.0 if records else None
    if not summary.info.multi_label:
        return 1.0 if records else None
    return sum(c.total for c in summary.classes) / records if records else None


def _record_lines(summary: Summary) -> list[str]:
    """A multi-label dataset's label cardinality and the records' extra features (--metadata's
    columns); nothing for a dataset of one label a record and no extra features."""
    info = summary.info
    lines = []
    if not info.labels:
        lines.append("labels: none, each record an image and its extra features (a table without labels)")
    elif info.multi_label:
        cardinality = label_cardinality(summary)
        lines.append("labels: multi-label, a list of ids a record"
                     + (f", {format_number(cardinality)} labels a record on average" if cardinality else ""))
    if info.extra_features:
        lines.append("extra features: " + ", ".join(f"{key} ({kind})" for key, kind in info.extra_features.items()))
    return lines


def _image_line(image: ImageInfo, compression: str, label_offset: int, file_format: str) -> str:
    parts = [describe_image(image), f"resize_mode {image.resize_mode or 'unknown'}",
             f"compression {compression}"]
    if file_format != TFRECORD:  # the reader a user needs, beside the shards' format
        parts.append(f"{file_format} shards (read with {FILE_FORMATS[file_format].reader})")
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
    if not summary.info.labels:
        return ["classes: none (a dataset without labels)"]
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
    dropped = f", {c['dropped']:,} dropped" if "dropped" in c else ""
    out = [f"files: {_number(c.get('listed'))} listed, {_number(c.get('written'))} written, "
           f"{_number(c.get('failed'))} failed{dropped}, {_number(c.get('skipped'))} skipped"]
    out += _skipped_lines(summary)
    out += originals_lines(summary.originals)
    out += flat_lines(summary.flat_images)
    if summary.failures:
        out += ["", f"failures by stage and reason (every one in {summary.errors_file}):"]
        out += _table(["stage", "reason", "count", "example"],
                      [[g.stage, g.reason, str(g.count), f"{g.example_path}: {g.example_message}"]
                       for g in summary.failures], right=[2])
    elif summary.failed_by_stage:
        out += ["", "failures by stage (no errors.jsonl to give reasons):"]
        out += [f"  {stage}: {n}" for stage, n in summary.failed_by_stage.items()]
    return out


def flat_lines(flat: Mapping[str, Any] | None) -> list[str]:
    """A manifest's ``flat_images``: records of one flat colour, with the first names; none, no line."""
    if not flat or not flat.get("count"):
        return []
    every = "" if flat.get("transparent") is None else f"; every one in {FLAT}"  # older manifests: no flat.jsonl
    return [f"  one flat colour: {flat['count']:,} (written all the same; e.g. {', '.join(flat['examples'])}{every})"]


def _skipped_lines(summary: Summary) -> list[str]:
    """Skipped files by reason, then those --cross_split_duplicates drop left out, each with its
    first few (skipped.jsonl), and where the rest are."""
    out = []
    dropped = (summary.duplicates or {}).get("dropped_by_reason", {})
    for kind, reasons in (("skipped", summary.skipped_by_reason), ("dropped", dropped)):
        for reason, n in reasons.items():
            shown = summary.skipped_examples.get(reason, ())
            more = f" and {n - len(shown):,} more" if shown and n > len(shown) else ""
            out.append(f"  {kind}, {reason}: {n:,}" + (f", e.g. {', '.join(shown)}{more}" if shown else ""))
    if (summary.skipped_by_reason or dropped) and summary.skipped_file is not None:
        out.append(f"  every skipped file, with its reason: {summary.skipped_file}")
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
    near = _near_lines(d.get("near"), join(summary.root, DUPLICATES))
    if not d.get("extra_copies"):
        return ["duplicates: none (no two written files have the same bytes)", *near, *_dropped_lines(d)]
    out = [f"duplicates: {count(d['extra_copies'], 'extra copy', 'extra copies')} of {count(d['images'], 'image')} "
           f"({d['within_split']:,} within a split, {d['across_splits']:,} across splits{_pairs(d)}; every one in "
           f"{join(summary.root, DUPLICATES)})"]
    for group in d.get("examples", []):
        files = ", ".join(f"{f['split']} {f['path']}" for f in group["files"])
        more = f" and {group['copies'] - len(group['files']):,} more" if group["copies"] > len(group["files"]) else ""
        out.append(f"  {group['sha256'][:12]} ({group['copies']:,} files): {files}{more}")
    return out + _conflict_lines(d) + near + _dropped_lines(d)


def _conflict_lines(d: Mapping[str, Any]) -> list[str]:
    """The same bytes under two labels or more: counted apart from harmless copies, with the examples."""
    conflicts = d.get("label_conflicts") or {}
    if not conflicts.get("images"):
        return []
    out = [f"same image under different labels: {count(conflicts['images'], 'image')} "
           f"({count(conflicts['files'], 'file')}; \"labels_differ\": true in {DUPLICATES}): contradictory labels"]
    for group in conflicts.get("examples", []):
        files = ", ".join(f"{f['path']} ({_label(f.get('label'))})" for f in group["files"])
        out.append(f"  {group['sha256'][:12]} ({group['copies']:,} files): {files}")
    return out


def _label(label: Any) -> str:
    return ", ".join(label) if isinstance(label, list) else str(label)


def _dropped_lines(d: Mapping[str, Any]) -> list[str]:
    """With --cross_split_duplicates drop: the groups across splits no longer leak."""
    if "dropped" not in d:
        return []
    return [f"dropped (--cross_split_duplicates drop): {count(d['dropped'], 'file')} of the groups across "
            "splits left out of the dataset, each named in skipped.jsonl"]


def _pairs(counts: Mapping[str, Any]) -> str:
    """The groups across splits per pair of splits (every pair, ``split_pairs``), as a clause; none
    in a manifest written before they were counted."""
    pairs = counts.get("split_pairs") or {}
    return ": " + ", ".join(f"{pair} {n:,}" for pair, n in pairs.items()) if pairs else ""


def _near_lines(near: Mapping[str, Any] | None, where: str) -> list[str]:
    """The near-duplicate groups, counted, and the manifest's examples: across splits first."""
    if near is None:
        return []
    if not near["groups"]:
        return [f"near duplicates: none within {near['distance']} bits"]
    differ = f", {near['label_conflicts']:,} under different labels" if near.get("label_conflicts") else ""
    out = [f"near duplicates: {count(near['groups'], 'group')} of {count(near['files'], 'file')} within "
           f"{near['distance']} bits ({near['within_split']:,} within a split, {near['across_splits']:,} across "
           f"splits{_pairs(near)}{differ}; every one in {where})"]
    for group in near.get("examples", []):
        files = ", ".join(f"{f['split']} {f['path']} ({f['distance']} bits)" for f in group["files"])
        out.append(f"  group {group['group']} (up to {group['distance']} bits): {files}")
    return out


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], right: Iterable[int] = ()) -> list[str]:
    """Columns padded to their widest cell, numbers (the ``right`` columns) right-aligned."""
    rows = [[for_terminal(cell, one_line=True) for cell in r] for r in (header, *rows)]  # as shown: escaped
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
