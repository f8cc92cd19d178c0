"""What the report shows, gathered from an output folder: the summary ``inspect`` makes, a gallery
of records decoded from the shards, duplicates.jsonl's groups and leaks, errors.jsonl's failures
with their files, skipped.jsonl's files, and the manifest's record of the source images.

Counts come from the manifest and from whole passes over the side files, so they are exact at any
size; what is shown (pictures, names, pairs) is capped by ``Limits``. A section that cannot be
completed (a damaged shard, the size limit reached) says so in ``ReportData.notes``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Mapping
from typing import Any

from beam_prep.errors import BeamPrepError, DatasetError, UnsafeName
from beam_prep.io.storage import is_local, join, open_to_read
from beam_prep.model import features
from beam_prep.model.dataset import MANIFEST, DatasetInfo
from beam_prep.model.names import path_under
from beam_prep.tools import contact_sheet
from beam_prep.tools.report.checks import check_manifest
from beam_prep.tools.report.leaks import Leaks, read_leaks
from beam_prep.tools.report.thumbs import Budget, Thumbnail, from_pixels, from_source
from beam_prep.tools.summary import Summary, _lines, _skipped_examples, failures, open_output, summarize
from beam_prep.write.shared.layout import DUPLICATES, ERRORS, SKIPPED

__all__ = ["FailureFiles", "Gallery", "GalleryImage", "Limits", "ReportData", "gather"]

_LOG = logging.getLogger(__name__)

GALLERY, LEAKS, FAILURES = "gallery", "duplicates and leaks", "failures"


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the report shows at most; every count stays exact.

    Attributes:
      per_class: gallery images a class.
      max_gallery: gallery images in all (a dataset of many classes gets fewer a class, one at least,
        and its classes past this many none).
      max_scan: records read at most to find the gallery's images.
      max_groups: duplicate groups listed (those across splits first).
      max_pairs: leak pairs across splits shown (the closest first).
      max_files: file names listed per failure reason and per skip reason.
      max_failure_pictures: source thumbnails per failure reason.
      cell: a thumbnail's largest side, in pixels.
      max_bytes: the pictures' bytes in the page, base64 (the page's text adds little beside them).
    """

    per_class: int = 6
    max_gallery: int = 600
    max_scan: int = 200_000
    max_groups: int = 100
    max_pairs: int = 200
    max_files: int = 20
    max_failure_pictures: int = 4
    cell: int = 128
    max_bytes: int = 20 << 20


@dataclasses.dataclass(frozen=True)
class GalleryImage:
    """One record in the gallery: its file name, stored size and thumbnail."""

    filename: str
    height: int
    width: int
    thumbnail: Thumbnail


@dataclasses.dataclass(frozen=True)
class Gallery:
    """Records of one split decoded as training decodes them, per row (a label, or one row without labels).

    ``wanted[i]``: the images row ``i`` should show (its class's records, up to the per-class cap).
    """

    split: str | None
    per_class: int
    rows: tuple[str, ...]
    images: tuple[tuple[GalleryImage, ...], ...]
    wanted: tuple[int, ...]
    scanned: int


@dataclasses.dataclass(frozen=True)
class FailureFiles:
    """The failures of one stage and reason: every one counted, the first named (path, message, and the
    sha256 of the bytes that failed, where the run read them)."""

    stage: str
    reason: str
    count: int
    files: tuple[tuple[str, str, str | None], ...]


@dataclasses.dataclass(frozen=True)
class ReportData:
    """Everything the page shows.

    ``pictures``: source thumbnails (or why there is none) by path, for leaks and failures.
    ``notes``: (section, why it is incomplete).
    """

    summary: Summary
    manifest: Mapping[str, Any]
    limits: Limits
    gallery: Gallery
    leaks: Leaks
    failures: tuple[FailureFiles, ...] | None
    skipped: Mapping[str, tuple[str, ...]] | None
    pictures: Mapping[str, Thumbnail | str]
    notes: tuple[tuple[str, str], ...]


def gather(output: str, limits: Limits | None = None) -> ReportData:
    """Reads what the report of the dataset at ``output`` shows, in one pass over each file it needs.

    Raises:
      DatasetError: not a dataset (no usable manifest), a manifest whose counts or names are not the
        writer's (``checks.check_manifest``), or a side file that is not the writer's (naming the file
        and line).
      StorageError: something cannot be read.
    """
    limits = limits or Limits()
    info, manifest = open_output(output)
    check_manifest(manifest, join(info.root, MANIFEST))  # before anything reads its counts
    summary = summarize(output, (info, manifest), side_files=False)  # errors.jsonl and skipped.jsonl: below
    notes: list[tuple[str, str]] = []
    budget = Budget(limits.max_bytes)
    gallery = _gallery(summary.info, limits, budget, notes)
    root = summary.root
    with _lines(join(root, DUPLICATES)) as lines:
        leaks = read_leaks(lines, join(root, DUPLICATES), limits.max_groups, limits.max_pairs)
    failures = _failures(join(root, ERRORS), limits.max_files)
    counts = {**manifest.get("skipped_by_reason", {}),
              **(manifest.get("duplicates") or {}).get("dropped_by_reason", {})}
    skipped = _skipped_examples(join(root, SKIPPED), counts, limits.max_files)
    input_root = str((manifest.get("options") or {}).get("input") or "")
    wanted: dict[str, tuple[str | None, str]] = {}  # path -> (sha256, section)
    for pair in leaks.pairs:
        for f in (pair.a, pair.b):
            wanted.setdefault(f.path, (f.sha256, LEAKS))
    for group in leaks.groups:
        for f in group.files[:contact_sheet_files()]:
            wanted.setdefault(f.path, (f.sha256, LEAKS))
    for failure in failures or ():
        for path, _, sha256 in failure.files[:limits.max_failure_pictures]:
            wanted.setdefault(path, (sha256, FAILURES))
    pictures = _pictures(wanted, input_root, limits.cell, budget)
    if budget.refused:
        notes.append(("pictures", f"{budget.refused:,} pictures left out: the report's limit of "
                                  f"{limits.max_bytes / (1 << 20):.0f} MiB of pictures was reached"))
    return ReportData(summary, manifest, limits, gallery, leaks, tuple(failures) if failures is not None else None,
                      skipped, pictures, tuple(notes))


def contact_sheet_files() -> int:
    """Files shown of a duplicate group, as the leakage sheet shows them."""
    from beam_prep.tools.leakage_sheet import MAX_FILES

    return MAX_FILES


def gallery_split(info: DatasetInfo) -> str | None:
    """The split the gallery shows: train, or the first (as ``inspect --grid``)."""
    return "train" if "train" in info.splits else next(iter(info.splits), None)


def per_class(info: DatasetInfo, limits: Limits) -> int:
    """Images a class within ``max_gallery`` in all: ``per_class``, fewer for many classes, one at least."""
    return max(1, min(limits.per_class, limits.max_gallery // max(1, info.num_classes)))


def _gallery(info: DatasetInfo, limits: Limits, budget: Budget, notes: list[tuple[str, str]]) -> Gallery:
    """The first records of each class of the gallery's split, read in shard order (the contact
    sheet's rule), decoded by the reader's own decoding; the first ``max_gallery`` images in all."""
    import tensorflow as tf

    split = gallery_split(info)
    each = per_class(info, limits)
    labelled = bool(info.labels)
    rows = info.labels if labelled else ("all records",)
    if split is None:
        return Gallery(None, each, tuple(rows), tuple(() for _ in rows), tuple(0 for _ in rows), 0)
    s = info.splits[split]
    if labelled:
        shown = min(info.num_classes, limits.max_gallery)
        wanted = [0 if i >= shown else min(each, int(s.class_counts.get(name, 0))) if s.class_counts is not None
                  else each for i, name in enumerate(info.labels)]
        if shown < info.num_classes:
            notes.append((GALLERY, f"the first {shown:,} of {info.num_classes:,} classes shown (at most "
                                   f"{limits.max_gallery:,} images)"))
    else:
        wanted = [min(limits.max_gallery, limits.per_class * 4, s.num_examples)]
    kept: list[list[GalleryImage]] = [[] for _ in rows]
    missing = sum(wanted)
    scanned = 0
    counts = s.shard_num_examples or (None,) * len(s.files)
    sums = s.shard_sha256 or (None,) * len(s.files)
    try:
        for path, n, sha256 in zip(s.files, counts, sums):
            if missing == 0 or scanned >= limits.max_scan:
                break
            _check_sha256(path, sha256)
            for serialized in contact_sheet._serialized(info, path, n):
                scanned += 1
                record, rows_of_record = _parsed(info, serialized, path)
                thumb = None
                for index in rows_of_record:
                    if len(kept[index]) >= wanted[index]:
                        continue
                    thumb = thumb or from_pixels(contact_sheet._decode(info, record), limits.cell)
                    if not budget.take(thumb):  # the page's size limit: this row ends here (said in notes)
                        missing -= wanted[index] - len(kept[index])
                        wanted[index] = len(kept[index])
                    else:
                        kept[index].append(GalleryImage(
                            record[features.FILENAME].decode("utf-8", "replace"),
                            int(record[features.HEIGHT]), int(record[features.WIDTH]), thumb))
                        missing -= 1
                if missing == 0 or scanned >= limits.max_scan:
                    break
    except BeamPrepError as e:
        notes.append((GALLERY, f"incomplete: {e}"))
    except tf.errors.OpError as e:  # a TFRecord shard cut short or damaged (its CRC)
        notes.append((GALLERY, f"incomplete: cannot read a shard of {split}: {e.message}"))
    else:
        short = sum(w - len(k) for w, k in zip(wanted, kept))
        if short:
            why = (f"only the first {scanned:,} records were read (the limit)" if scanned >= limits.max_scan
                   else "the shards hold fewer records than the manifest's class counts")
            notes.append((GALLERY, f"{short:,} images fewer than the classes' counts allow: {why}"))
    return Gallery(split, each, tuple(rows), tuple(tuple(k) for k in kept), tuple(wanted), scanned)


def _parsed(info: DatasetInfo, serialized: bytes, path: str) -> tuple[dict[str, Any], tuple[int, ...]]:
    """A record's features and its gallery rows (``_rows_of``).

    Raises:
      DatasetError: it is not a record beam-prep writes (a shard whose checksum the manifest vouches
        for may still be someone else's), naming the shard.
    """
    from google.protobuf.message import DecodeError

    try:
        return (record := features.decode_example(serialized)), _rows_of(info, serialized, record, path)
    except (DecodeError, IndexError, KeyError, ValueError) as e:
        raise DatasetError(f"a record of {path} is not one beam-prep writes ({type(e).__name__}: {e})") from e


def _rows_of(info: DatasetInfo, serialized: bytes, record: Mapping[str, Any], path: str) -> tuple[int, ...]:
    """The gallery rows a record belongs in: its label's, each of a multi-label record's labels', or the
    one row of a dataset without labels."""
    if not info.labels:
        return (0,)
    if not info.multi_label:
        return (contact_sheet._label_index(info, record, path),)
    ids = features.Example.FromString(serialized).features.feature[features.LABEL].int64_list.value
    return tuple(dict.fromkeys(contact_sheet._label_index(info, {features.LABEL: i}, path) for i in ids))


def _check_sha256(path: str, sha256: str | None) -> None:
    """Raises DatasetError, naming the shard, where its bytes do not have the manifest's sha256."""
    if sha256 is None:
        return
    digest = hashlib.sha256()
    try:
        with (open(path, "rb") if is_local(path) else open_to_read(path)) as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except FileNotFoundError as e:
        raise DatasetError(f"shard {path} does not exist: the dataset is incomplete") from e
    except Exception as e:  # each filesystem raises its own types
        raise DatasetError(f"cannot read shard {path}: {e}") from e
    if digest.hexdigest() != sha256:
        raise DatasetError(f"shard {path} fails its checksum: its sha256 is {digest.hexdigest()}, the manifest "
                           f"records {sha256} (damaged or replaced since the run; beam-prep verify checks them all)")


def _failures(errors_file: str, max_files: int) -> list[FailureFiles] | None:
    """errors.jsonl grouped by stage and reason, most frequent first, with the first files of each;
    None where there is no such file."""
    groups: dict[tuple[str, str], list[Any]] = {}
    with _lines(errors_file) as lines:
        if lines is None:
            return None
        for key, failure in failures(lines, errors_file):
            group = groups.setdefault(key, [0, []])
            group[0] += 1
            if len(group[1]) < max_files:
                sha256 = failure.get("sha256")
                group[1].append((str(failure.get("path", "")), str(failure.get("message", "")),
                                 sha256 if isinstance(sha256, str) else None))
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return [FailureFiles(stage, reason, n, tuple(files)) for (stage, reason), (n, files) in ordered]


def _pictures(wanted: Mapping[str, tuple[str | None, str]], input_root: str, cell: int,
              budget: Budget) -> dict[str, Thumbnail | str]:
    """A thumbnail (or why none) of each source file ``wanted`` names, opened only under the run's input
    and shown only while its bytes have the sha256 the run recorded of them: a manifest or side file
    written by someone else (its input ``/``) cannot bring any other readable file into the page."""
    out: dict[str, Thumbnail | str] = {}
    for path, (sha256, section) in wanted.items():
        try:
            full = path_under(input_root, path, section, "a path")
        except UnsafeName:
            out[path] = "not under the run's input: not opened"
            continue
        if sha256 is None:
            out[path] = "not shown: the run recorded no sha256 of it (its bytes were not read)"
            continue
        thumb = from_source(full, sha256, cell)
        out[path] = thumb if isinstance(thumb, str) or budget.take(thumb) else "left out: the size limit"
    return out


def sources(manifest: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The manifest's record of the source images (sizes, aspect ratios, what was done to them), or None."""
    value = manifest.get("sources")
    return value if isinstance(value, Mapping) else None

