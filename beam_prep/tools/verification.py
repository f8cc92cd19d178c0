"""Checks a prepared dataset against its manifest, record by record: :func:`verify`.

The reader stops training at the first damaged shard or bad record; ``verify``
reads every record of every shard and collects what it finds, a
:class:`VerifyReport` of :class:`Problem` s (files, records, counts), each
naming its file, split or class, capped per kind (``max_per_kind``).

Each shard is read by its own small ``tf.data`` pipeline, several at once on
threads, so one damaged file is named and the others are still checked. Each
batch is checked by one call of a function traced once
(:func:`beam_prep.reader.checks.batch_checker`), not a ``map`` in each shard's
pipeline, whose function would be instantiated anew for every shard. A batch
that fails is checked one record at a time to name the record; a read error
ends a batch early, and the shard's rest is then read one record at a time up
to it. See docs/guides/inspect-verify-bench.md for the checks, and
docs/performance/verify.md for the figures.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from beam_prep.errors import DatasetError, StorageError, UnsafeName
from beam_prep.io.dali_index import FRAMING, parse_index
from beam_prep.io.storage import join
from beam_prep.model.dataset import MANIFEST, TFRECORD, DatasetInfo, SplitInfo, labels_lines
from beam_prep.native_stderr import native_stderr_to_file
from beam_prep.tools.verify_report import (
    BAD_RECORD,
    CLASS_COUNT,
    DALI_INDEX,
    DAMAGED_SHARD,
    EXTRA_SHARD,
    HASH_FILES,
    IMAGE_SHAPE,
    LABEL_RANGE,
    LABEL_TEXT,
    LABELS_FILE,
    MANIFEST_PROBLEM,
    MAX_PER_KIND,
    MISSING_SHARD,
    RUN_COUNTS,
    SHARD_COUNT,
    SHARD_SHA256,
    SPLIT_COUNT,
    Problems,
    VerifyReport,
)

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

__all__ = ["verify"]

_LOG = logging.getLogger(__name__)

# Records per call of the check, as the reader's default batch: chosen in
# benchmarks/bench_verify.py (docs/performance/verify.md), small enough that a shard of a
# few thousand records still has batches to decode in parallel.
BATCH_RECORDS = 256
_HASH_CHUNK = 1 << 20  # bytes a read, to hash a shard


@dataclasses.dataclass
class _ShardTally:
    """What one shard held: records read, their count per label index, whether it was read whole."""

    records: int
    class_counts: np.ndarray
    error: str | None = None  # why it could not be read to its end; None: read whole
    classes_known: bool = True  # every record's label counted (none failed to parse or decode)
    lengths: list[int] | None = None  # each record's length, for a shard with a DALI index to check

    @property
    def whole(self) -> bool:
        return self.error is None


def verify(path: str, *, workers: int | None = None, max_per_kind: int = MAX_PER_KIND,
           progress: Callable[[int], None] | None = None) -> VerifyReport:
    """Reads every record of the dataset at ``path`` (local or ``gs://``) and checks it against the manifest.

    Args:
      path: the dataset folder, holding ``manifest.json``.
      workers: shards read at once; default: the core count (at least 2).
      max_per_kind: problems kept per kind; the report counts the rest.
      progress: called with the number of records just checked, from reading threads.

    Returns:
      The report: problems found (none: the dataset is as its manifest says) and counts.

    Raises:
      DatasetError: no dataset there (no ``manifest.json``; the message names the folder).
      UnsafeName: the manifest names a shard outside the folder (``../x``, an absolute path):
        refused, not reported, since nothing it names may be opened.
      StorageError: the folder cannot be read at all.
    """
    with native_stderr_to_file():  # TensorFlow's C++ log ("Type inference failed") stays off the caller's console
        return _verify(path, workers=workers, max_per_kind=max_per_kind, progress=progress)


def _verify(path: str, *, workers: int | None, max_per_kind: int,
            progress: Callable[[int], None] | None) -> VerifyReport:
    from beam_prep.reader.checks import batch_checker
    from beam_prep.reader.sources import load_info, read_manifest

    start = time.perf_counter()
    root = path.rstrip("/") or path
    problems = Problems(max_per_kind)
    names = _list_folder(root)
    if MANIFEST not in names:  # no dataset: the reader's own message says so (or not finished)
        load_info(root)
        raise DatasetError(f"no {MANIFEST} in {root}")  # only if it appeared meanwhile
    try:
        info, manifest = read_manifest(root)
    except UnsafeName:  # a name reaching outside the folder: refused, nothing of it read
        raise
    except DatasetError as e:  # there, but not a manifest this beam-prep can use
        problems.add(MANIFEST_PROBLEM, join(root, MANIFEST), str(e))
        kept, more = problems.result()
        return VerifyReport(root, kept, more, 0, 0, 0, time.perf_counter() - start)

    _check_run_counts(info, manifest, names, problems)
    _check_labels_file(info, names, problems)
    _check_hash_files(info, manifest, names, problems)
    present = _check_shard_files(info, names, problems)
    check = batch_checker(info)
    workers = workers or max(2, os.cpu_count() or 1)
    jobs = [(split, i) for split in info.splits.values() for i, shard in enumerate(split.shards)
            if shard in present]
    tallies: dict[tuple[str, int], _ShardTally] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers,
                                               thread_name_prefix="verify") as pool:
        futures = {pool.submit(_check_shard, info, split, i, check, problems, progress): (split.name, i)
                   for split, i in jobs}
        for future in concurrent.futures.as_completed(futures):
            tallies[futures[future]] = future.result()
    for split in info.splits.values():
        _check_split_counts(info, split, tallies, problems)
    for version in info.history[:-1]:  # each earlier version's records: the first shards of its splits
        for split in info.at_version(version.version).splits.values():
            _check_split_counts(info, split, tallies, problems, f"version {version.version}, ")
    kept, more = problems.result()
    expected = sum(s.num_examples for s in info.splits.values())
    return VerifyReport(root, kept, more, sum(t.records for t in tallies.values()), expected,
                        len(tallies), time.perf_counter() - start)


def _list_folder(root: str) -> set[str]:
    """The folder's file names, in one listing (a single request on GCS)."""
    import tensorflow as tf

    try:
        return {name.rstrip("/") for name in tf.io.gfile.listdir(root)}
    except tf.errors.NotFoundError as e:
        raise DatasetError(f"dataset folder {root} does not exist") from e
    except tf.errors.OpError as e:
        raise StorageError(f"cannot list {root}: {e.message}") from e


def _check_run_counts(info: DatasetInfo, manifest: Mapping[str, Any], names: set[str],
                      problems: Problems) -> None:
    """The writer's record of its run adds up: every file listed was written, failed or dropped
    (``--cross_split_duplicates drop``), the splits hold the written ones, and errors.jsonl has a
    line for each failure."""
    import tensorflow as tf

    from beam_prep.write.shared.layout import ERRORS

    counts = manifest.get("counts")
    if not isinstance(counts, Mapping):
        return  # not every writer records its run (bare datasets, older versions)
    where = join(info.root, MANIFEST)
    listed, written, failed = (counts.get(k) for k in ("listed", "written", "failed"))
    examples = sum(split.num_examples for split in info.splits.values())
    if written is not None and written != examples:
        problems.add(RUN_COUNTS, where, f"counts.written is {written} but the splits hold {examples} examples")
    dropped = counts.get("dropped")  # --cross_split_duplicates drop: listed, written, then left out
    if None not in (listed, written, failed) and listed != written + failed + (dropped or 0):
        sum_of, terms = (("written + failed + dropped", f"{written} + {failed} + {dropped}") if dropped is not None
                         else ("written + failed", f"{written} + {failed}"))
        problems.add(RUN_COUNTS, where, f"counts.listed is {listed}, not {sum_of} ({terms}): files were lost")
    if not failed:
        return
    path = join(info.root, ERRORS)
    if ERRORS not in names:
        problems.add(RUN_COUNTS, path, f"missing: the manifest counts {failed} failed files")
        return
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            reported = sum(1 for line in f.read().split(b"\n") if line.strip())
    except tf.errors.OpError as e:
        problems.add(RUN_COUNTS, path, f"cannot be read: {e.message}")
        return
    if reported != failed:
        problems.add(RUN_COUNTS, path, f"reports {reported} failed files; the manifest counts {failed}")


def _check_hash_files(info: DatasetInfo, manifest: Mapping[str, Any], names: set[str], problems: Problems) -> None:
    """Each kept hash file the manifest lists (``kept_hashes``; none in a dataset made before them) is there,
    with its sha256 and a line for each record of its version."""
    import zlib

    import tensorflow as tf

    from beam_prep.write.shared import kept_hashes

    try:
        kept = kept_hashes.listed(manifest)
    except DatasetError as e:
        problems.add(HASH_FILES, join(info.root, MANIFEST), str(e))
        return
    versions = {v.version: v.num_examples for v in info.history}
    for version, entry in kept.items():
        path = join(info.root, entry["file"])
        if entry["file"] not in names:
            problems.add(HASH_FILES, path, f"missing: the manifest lists it for version {version}")
            continue
        digest, lines, inflate = hashlib.sha256(), 0, zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip, streamed
        try:
            with tf.io.gfile.GFile(path, "rb") as f:
                while chunk := f.read(_HASH_CHUNK):
                    digest.update(chunk)
                    lines += inflate.decompress(chunk).count(b"\n")
            if not inflate.eof:
                raise EOFError("cut short")
        except (tf.errors.OpError, zlib.error, EOFError) as e:
            problems.add(HASH_FILES, path, f"cannot be read: {_first_line(str(e))}")
            continue
        if digest.hexdigest() != entry["sha256"]:
            problems.add(HASH_FILES, path, f"has sha256 {digest.hexdigest()}, not the manifest's {entry['sha256']}: "
                                           "replaced or edited since it was written")
        elif lines != entry["records"] or lines != versions.get(version, lines):
            problems.add(HASH_FILES, path, f"holds {lines} lines; the manifest counts {entry['records']} records of "
                                           f"version {version}, which holds {versions.get(version)}")


def _check_labels_file(info: DatasetInfo, names: set[str], problems: Problems) -> None:
    """labels.txt is what people read ids with: it must be the manifest's labels, in order."""
    import tensorflow as tf

    from beam_prep.write.shared.layout import LABELS

    path = join(info.root, LABELS)
    if LABELS not in names:
        problems.add(LABELS_FILE, path, "missing (the manifest lists the labels it should hold)")
        return
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").split("\n")
    except tf.errors.OpError as e:
        problems.add(LABELS_FILE, path, f"cannot be read: {e.message}")
        return
    if lines and lines[-1] == "":
        lines.pop()
    # Either form --labels_txt writes: one name a line, or TF-slim's "stored id:name" lines.
    forms = [labels_lines(info.labels, form, info.label_offset) for form in ("names", "slim")]
    if lines not in forms:
        expected = forms[1] if lines and ":" in lines[0] else forms[0]
        first = next((i for i, (a, b) in enumerate(zip(lines, expected)) if a != b),
                     min(len(lines), len(expected)))
        problems.add(LABELS_FILE, path,
                     f"holds {len(lines)} labels, the manifest {len(info.labels)}; they first differ "
                     f"at line {first + 1}")


def _check_shard_files(info: DatasetInfo, names: set[str], problems: Problems) -> set[str]:
    """Listed shards that are there; each missing one and each unlisted shard-named file is a problem."""
    from beam_prep.write.shared.layout import is_shard_name

    listed = {shard for split in info.splits.values() for shard in split.shards}
    for split in info.splits.values():
        for i, shard in enumerate(split.shards):
            if shard not in names:
                count = (f"{split.shard_num_examples[i]} records" if split.shard_num_examples
                         else "its records")
                problems.add(MISSING_SHARD, join(info.root, shard),
                             f"listed in split {split.name!r} (with {count}) but not in the folder")
    for name in sorted(names - listed):
        if is_shard_name(name):
            problems.add(EXTRA_SHARD, join(info.root, name),
                         "a shard file the manifest does not list (left by another run, or copied "
                         "in?): no reader reads it")
    return listed & names


def _check_shard(info: DatasetInfo, split: SplitInfo, index: int, check: Callable, problems: Problems,
                 progress: Callable[[int], None] | None) -> _ShardTally:
    """Reads one shard whole, a batch at a time, and checks every record; counts them against the manifest."""
    path = split.files[index]
    tally = _ShardTally(0, np.zeros(len(info.labels), np.int64), lengths=[] if split.dali_index else None)
    if info.file_format == TFRECORD:
        _check_tfrecords(info, path, check, tally, problems, progress)
    else:
        _check_other_format(info, path, check, tally, problems, progress)
    expected = split.shard_num_examples[index] if split.shard_num_examples is not None else None
    listed = f" of the {expected} the manifest lists" if expected is not None else ""
    if not tally.whole:
        problems.add(DAMAGED_SHARD, path, f"damaged or unreadable: {tally.records} records{listed} "
                                          f"were read before {tally.error}")
    elif expected is not None and tally.records != expected:
        why = " (cut short?)" if tally.records < expected else ""
        problems.add(SHARD_COUNT, path, f"holds {tally.records} records{why}; the manifest lists "
                                        f"{expected} for it (split {split.name!r})")
    if tally.whole and split.index_files is not None:
        _check_dali_index(split.index_files[index], tally.lengths, problems)
    if tally.whole and split.shard_sha256 is not None and split.shard_sha256[index]:
        _check_sha256(path, split.shard_sha256[index], split.name, problems)
    return tally


def _check_sha256(path: str, expected: str, split: str, problems: Problems) -> None:
    """A shard's bytes have the sha256 the writer recorded (``shard_sha256``), as the gs:// cache checks
    them: records that all check can still be other bytes (a shard replaced by another run's, or edited).
    Read once more, after its records: from the page cache, where it fits there."""
    import tensorflow as tf

    digest = hashlib.sha256()
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            while chunk := f.read(_HASH_CHUNK):
                digest.update(chunk)
    except tf.errors.OpError as e:
        problems.add(SHARD_SHA256, path, f"cannot be read to check its sha256: {_first_line(e.message)}")
        return
    if digest.hexdigest() != expected:
        problems.add(SHARD_SHA256, path, f"has sha256 {digest.hexdigest()}, but the manifest's shard_sha256 for it is "
                                         f"{expected} (split {split!r}): its bytes are not those written (replaced "
                                         "or edited since?); copy the dataset again, or prepare it again")


def _check_tfrecords(info: DatasetInfo, path: str, check: Callable, tally: _ShardTally, problems: Problems,
                     progress: Callable[[int], None] | None) -> None:
    """A TFRecord shard, a ``tf.data`` batch at a time."""
    import tensorflow as tf

    from beam_prep.reader.shards import read_shard
    from beam_prep.reader.sources import tf_compression

    compression = tf_compression(info.compression)
    batches = iter(read_shard(tf.constant(path), compression).batch(BATCH_RECORDS).prefetch(1))
    while True:
        try:
            serialized = next(batches)
        except StopIteration:
            break
        except tf.errors.OpError as e:
            # The batch ends at the error and its records before it are lost: read them one by one.
            _LOG.info("%s: %s; reading on record by record from record %d", path,
                      _first_line(e.message), tally.records)
            _check_rest_one_by_one(info, path, compression, check, tally, problems, progress)
            break
        _add_lengths(tally, serialized)
        _check_records(info, path, serialized, check, tally, problems, progress)


def _check_other_format(info: DatasetInfo, path: str, check: Callable, tally: _ShardTally, problems: Problems,
                        progress: Callable[[int], None] | None) -> None:
    """An ArrayRecord or WebDataset shard, its records turned into Examples (``format_records``)
    and checked a batch at a time as a TFRecord shard's; a sample that is no Example is a bad record."""
    import tensorflow as tf

    from beam_prep.tools.format_records import Bad, examples

    batch: list[bytes] = []

    def flush() -> None:
        if batch:
            _check_records(info, path, tf.constant(batch), check, tally, problems, progress)
            batch.clear()

    try:
        for record in examples(info.file_format, path):
            if isinstance(record, Bad):
                flush()
                tally.classes_known = False
                problems.add(BAD_RECORD, f"{path}, record {tally.records}", record.reason)
                tally.records += 1
                continue
            batch.append(record)
            if len(batch) == BATCH_RECORDS:
                flush()
    except DatasetError as e:
        tally.error = str(e)
    flush()


def _check_rest_one_by_one(info: DatasetInfo, path: str, compression: str, check: Callable,
                           tally: _ShardTally, problems: Problems,
                           progress: Callable[[int], None] | None) -> None:
    """The rest of a shard after a read error, up to that error (which ``tally`` keeps)."""
    import tensorflow as tf

    from beam_prep.reader.shards import read_shard

    records = iter(read_shard(tf.constant(path), compression).skip(tally.records))
    while True:
        try:
            serialized = next(records)
        except StopIteration:  # the error did not come back: read whole after all
            return
        except tf.errors.OpError as e:
            tally.error = f"{type(e).__name__}: {_first_line(e.message)}"
            return
        serialized = tf.reshape(serialized, [1])
        _add_lengths(tally, serialized)
        _check_records(info, path, serialized, check, tally, problems, progress)


def _add_lengths(tally: _ShardTally, serialized: tf.Tensor) -> None:
    """Notes the records' lengths where the shard's DALI index is to be checked against them."""
    import tensorflow as tf

    if tally.lengths is not None:
        tally.lengths.extend(int(n) for n in tf.strings.length(serialized).numpy())


def _check_dali_index(path: str, lengths: list[int], problems: Problems) -> None:
    """A shard's DALI index (``io.dali_index``) says where each of its records is, as read: a shard
    written again after its index (by hand, or copied over from another run) no longer matches it,
    and DALI would read garbage at the old offsets."""
    import tensorflow as tf

    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            found = parse_index(f.read())
    except tf.errors.NotFoundError:
        problems.add(DALI_INDEX, path, "missing: the manifest lists it as its shard's DALI index")
        return
    except tf.errors.OpError as e:
        problems.add(DALI_INDEX, path, f"cannot be read: {e.message}")
        return
    except ValueError as e:
        problems.add(DALI_INDEX, path, f"is not a DALI index: {e}")
        return
    expected, offset = [], 0
    for length in lengths:
        expected.append((offset, length + FRAMING))
        offset += length + FRAMING
    if found == expected:
        return
    first = next((i for i, (a, b) in enumerate(zip(found, expected)) if a != b), min(len(found), len(expected)))
    if first < min(len(found), len(expected)):
        detail = (f"its line {first + 1} says offset {found[first][0]} size {found[first][1]}, but the shard's "
                  f"record {first} is at {expected[first][0]} with size {expected[first][1]}")
    else:
        detail = f"it lists {len(found)} records, the shard holds {len(expected)}"
    problems.add(DALI_INDEX, path, f"does not match its shard ({detail}): the shard was written again after "
                                   "its index? DALI would misread it; prepare the dataset again")


def _check_records(info: DatasetInfo, path: str, serialized: tf.Tensor, check: Callable,
                   tally: _ShardTally, problems: Problems,
                   progress: Callable[[int], None] | None) -> None:
    """Checks the next records of a shard; when a record does not parse or decode, the batch's
    check fails as a whole, so each of its records is checked alone to name it."""
    import tensorflow as tf

    try:
        out = check(serialized)
    except tf.errors.OpError as e:
        if serialized.shape[0] > 1:
            for i in range(serialized.shape[0]):
                _check_records(info, path, serialized[i:i + 1], check, tally, problems, progress)
            return
        tally.classes_known = False
        problems.add(BAD_RECORD, f"{path}, record {tally.records}",
                     f"does not parse or decode: {_first_line(e.message)}")
        n = 1
    else:
        n = _tally_batch(info, path, tally.records, out, tally, problems)
    tally.records += n
    if progress is not None:
        progress(n)


def _tally_batch(info: DatasetInfo, path: str, first: int, out: Mapping[str, tf.Tensor],
                 tally: _ShardTally, problems: Problems) -> int:
    """Counts a checked batch's labels and adds a problem for each record that failed a check."""
    in_range = out["in_range"].numpy()
    text_ok = out["text_ok"].numpy()
    shape_ok = out["shape_ok"].numpy()
    tally.class_counts += out["counts"].numpy()[in_range].sum(axis=0, dtype=np.int64)
    bad = np.flatnonzero(~(text_ok & shape_ok))
    if bad.size:
        _record_problems(info, path, first, out, bad, problems)
    return int(in_range.shape[0])


def _record_problems(info: DatasetInfo, path: str, first: int, out: Mapping[str, Any],
                     bad: np.ndarray, problems: Problems) -> None:
    values = {key: tensor.numpy() for key, tensor in out.items()}
    for i in bad:
        name = values["filename"][i].decode("utf-8", "backslashreplace")
        where = f"{path}, record {first + i} ({name})"
        text = values["text"][i].decode("utf-8", "backslashreplace")
        if info.multi_label or not info.labels:  # ids and names, each joined by ";" (none without labels)
            ids = [int(n) for n in values["label"][i].decode().split(";") if n]
            label, names = ";".join(map(str, ids)), ";".join(_label_name(info, n) for n in ids)
        else:
            label = int(values["label"][i])
            names = _label_name(info, label)
        if not values["in_range"][i]:
            problems.add(LABEL_RANGE, where, f"label id {label} is outside the labels: ids run from "
                         f"{info.label_offset} to {info.label_offset + len(info.labels) - 1} "
                         f"(label_offset {info.label_offset}, {len(info.labels)} labels)")
        elif not values["text_ok"][i]:
            problems.add(LABEL_TEXT, where, f"label id {label} is {names!r} "
                                            f"in the labels, but the record's text is {text!r}")
        if not values["shape_ok"][i]:
            problems.add(IMAGE_SHAPE, where, f"decodes to {_shape(values['decoded'][i])}; the manifest "
                         f"says {_expected_shape(info)} and the record {_shape(values['stored'][i])}")


def _label_name(info: DatasetInfo, label_id: int) -> str:
    index = label_id - info.label_offset
    return info.labels[index] if 0 <= index < len(info.labels) else "?"


def _check_split_counts(info: DatasetInfo, split: SplitInfo, tallies: Mapping[tuple[str, int], _ShardTally],
                        problems: Problems, version: str = "") -> None:
    """A split's total and per-class counts, when every shard was read whole (else the shard is the problem).
    ``split``: the latest's, or an earlier version's (``DatasetInfo.at_version``: its first shards), then
    named by ``version`` (``"version 1, "``)."""
    shard_tallies = [tallies.get((split.name, i)) for i in range(len(split.shards))]
    if any(t is None or not t.whole for t in shard_tallies):
        return
    where = f"{version}split {split.name!r}"
    records = sum(t.records for t in shard_tallies)
    if records != split.num_examples:
        problems.add(SPLIT_COUNT, where, f"holds {records} records; the manifest's num_examples "
                                         f"is {split.num_examples}")
    if split.class_counts is None or not all(t.classes_known for t in shard_tallies):
        return
    counts = sum((t.class_counts for t in shard_tallies), np.zeros(len(info.labels), np.int64))
    found = {label: int(n) for label, n in zip(info.labels, counts)}
    for label in list(info.labels) + sorted(set(split.class_counts) - set(info.labels)):
        listed = int(split.class_counts.get(label, 0))
        if found.get(label, 0) != listed:
            problems.add(CLASS_COUNT, f"{where}, class {label!r}",
                         f"holds {found.get(label, 0)} records; the manifest's class_counts "
                         f"says {listed}")


def _shape(hwc: Any) -> str:
    return "x".join(str(int(v)) for v in hwc)


def _expected_shape(info: DatasetInfo) -> str:
    image = info.image
    if image.fixed_size:
        return f"{image.height}x{image.width}x{image.channels}"
    return f"any size with {image.channels} channels"


# What eager TensorFlow wraps an op's message in: the function it ran in, and the op.
_TF_NOISE = re.compile(r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:\w+\].*$")


def _first_line(message: str) -> str:
    """TensorFlow's message, first line, without the function and op names eager mode adds."""
    lines = _TF_NOISE.sub("", message).strip().splitlines()
    return lines[0] if lines else "(no message)"
