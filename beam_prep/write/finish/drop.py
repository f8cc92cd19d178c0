"""``--cross_split_duplicates drop``: a file is left out of the dataset, and named in skipped.jsonl,
when it is a copy, or a near copy within the threshold, of a file kept in a split before its own
(``split_order``: train, validation, val, the others, test).

A group of near copies is a connected component, and a chain A-B-C of one holds files far apart:
with A kept, B within the threshold of A is left out, and C, within it of B but not of A, is
kept. So each group is decided split by split, in their order: its files in the first split are
kept, and each file of a later split is left out only when it is within the threshold of a file
kept so far, and kept otherwise (a file the next splits are then compared with). No two files
kept in different splits are within the threshold, and each file left out names a file kept.

Near duplicates are known only once every image is decoded (the perceptual hashes come from the
workers), so the shards are written by then: ``choose`` reads the groups ``duplicates.find``
wrote (duplicates.jsonl), and ``rewrite`` writes again, under a staged name in the run's folder
(published in the shard's place, which stays as written), only the shards that hold a record to
leave out, through the format's own reader and writer (``ShardFormat.read``, ``records``). A record is known by its split and source
sha256, which both its hash line and the record itself carry: every record of a content in a
split lies in the same groups (the same bytes, the same perceptual hash), so leaving out a
(split, sha256) leaves out exactly the files named. An append's ``WriteImageDataset`` leaves out its
copies of the dataset's records the same way (``copies``: not counted as dropped). See
docs/design/duplicates.md.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from apache_beam.io.filesystems import FileSystems

from beam_prep.errors import DatasetError
from beam_prep.io.storage import join, open_to_read, storage_error
from beam_prep.io.tfrecord import Checksum
from beam_prep.write.finish.near_earlier import Copy
from beam_prep.write.grow.append import COPY_REASON
from beam_prep.write.images.phash import distance as hamming
from beam_prep.write.plan import skipped
from beam_prep.write.shared import hash_lines, layout, split_order
from beam_prep.write.shared.shard_formats import shard_format
from beam_prep.write.shared.spill import SortedRows, SpillFolder
from beam_prep.write.shared.split_order import kept_split

__all__ = ["Dropping", "Rewritten", "choose", "exact_reason", "kept_split", "near_reason", "rewrite"]

_LOG = logging.getLogger(__name__)
_STAGED = ".without-dropped"  # a rewritten shard's name in the run's folder until it replaces the shard
_DIGEST = "S32"
_CELLS = 1 << 22  # distances computed at once when a group's files are compared with its kept ones
# A row's kind: a file in a near and an exact group is named by the near one's row; an append's copy of
# a record of the dataset (``copies``) is in no group, and named by a row of its own, each copy once.
_COPY, _NEAR, _EXACT = -1, 0, 1


def exact_reason(split: str) -> str:
    """skipped.jsonl's reason for a file with the same bytes as a file of ``split``."""
    return f"copy of an image in {split}"


def near_reason(split: str) -> str:
    """skipped.jsonl's reason for a file whose perceptual hash is near a file's of ``split``."""
    return f"near copy of an image in {split}"


@dataclasses.dataclass
class Dropping:
    """What ``choose`` chose: the records to leave out, by split, and their skipped.jsonl lines.

    Attributes:
      keys: split -> the sorted source sha256 digests (32 bytes each) of the records left out.
      by_reason: files left out per reason (``exact_reason``, ``near_reason``), not counting ``copied``
        nor ``unchanged``.
      by_split: split -> files left out of it.
      by_class: split -> label -> files left out (a multi-label file under each of its labels; a
        file of an older run's hash lines, whose label is unknown, under none).
      copied: an append's records left out as copies of the dataset's (``COPY_REASON``; ``copies``):
        skipped, as ``prepare --append`` counts them, not dropped.
      unchanged: an append's records left out as the dataset's own, unchanged (no line).
    """

    keys: dict[str, np.ndarray]
    by_reason: dict[str, int]
    _rows: SortedRows
    _folder: SpillFolder
    by_split: dict[str, int] = dataclasses.field(default_factory=dict)
    by_class: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    copied: int = 0
    unchanged: int = 0

    @property
    def count(self) -> int:
        """The records dropped (the manifest's ``duplicates.dropped``)."""
        return sum(self.by_reason.values())

    @property
    def left_out(self) -> int:
        """Every record left out of the shards: dropped, copied or unchanged."""
        return self.count + self.copied + self.unchanged

    def to_json(self) -> dict[str, Any]:
        """The manifest's ``duplicates.dropped``, ``duplicates.dropped_by_reason``,
        ``duplicates.dropped_by_split`` and ``duplicates.dropped_by_class`` (per split, per label)."""
        return {"dropped": self.count, "dropped_by_reason": dict(sorted(self.by_reason.items())),
                "dropped_by_split": {split: self.by_split[split] for split in split_order.ordered(self.by_split)},
                "dropped_by_class": {split: dict(sorted(self.by_class[split].items()))
                                     for split in split_order.ordered(self.by_class)}}

    def lines(self) -> Iterator[tuple[str, str]]:
        """``(path, skipped.jsonl line)`` of each file left out, sorted by path, each once (a file
        in an exact and a near group as its near group decided: a copy of a file kept there), and
        of each copy of the dataset's records (``copied``)."""
        last = None
        for path, kind, _, _, line, _ in self._rows:
            if path != last or kind == _COPY:
                last = path
                yield path, line

    def holds(self, split: str, sha256_hex: str) -> bool:
        keys = self.keys.get(split)
        if keys is None or not len(keys):
            return False
        digest = np.array(bytes.fromhex(sha256_hex), dtype=_DIGEST)
        at = int(np.searchsorted(keys, digest))
        return at < len(keys) and keys[at] == digest

    def close(self) -> None:
        self._folder.close()


def choose(lines_file: str | None, root: str, distance: int | None, copies: Iterable[Copy] = ()) -> Dropping:
    """The records to leave out: in each group of duplicates.jsonl (``lines_file``, local; None: no
    group) that lies in two splits or more, each file that is a copy, or within ``distance`` bits, of
    a file kept in a split before its own (the module's docstring says why split by split); and an
    append's ``copies`` of the dataset's records (``near_earlier.split_off``), each named with the record it
    copies (``COPY_REASON``, ``duplicate_of``), or left out unnamed where it is that record, unchanged.

    Each is named with the kept file it copies (``duplicate_of``: a file with the same bytes
    first, else the closest, then the first by path) and, for a near copy, its ``distance`` in
    bits. A file in an exact and a near group is decided by its near group, which holds its
    copies too (the same bytes, the same hash), and every file kept there. Memory: one group
    at a time, then 32 bytes a file left out; the lines go through an external sort by path.

    Args:
      lines_file: duplicates.jsonl as ``duplicates.find`` wrote it: each group's lines together.
      root: the run's ``--input``, which the paths are under (skipped.jsonl's ``relpath``).
      distance: the near-duplicate threshold the groups were found with; None: no near group.
    """
    folder = SpillFolder(prefix="beam-prep-drop-")
    rows = SortedRows(folder, "dropped")
    try:
        digests: dict[str, bytearray] = collections.defaultdict(bytearray)
        unchanged = 0
        for copy in copies:
            if copy.unchanged:
                digests[copy.split] += bytes.fromhex(copy.sha256)
                unchanged += 1
            else:
                rows.append((copy.path, _COPY, (copy.split, copy.sha256), COPY_REASON,
                             skipped.line(root, _relpath(copy.path, root), COPY_REASON, duplicate_of=copy.of),
                             copy.labels))
        if lines_file is not None:
            with open(lines_file, "rb") as f:
                records = (json.loads(line) for line in f)
                for _, members in itertools.groupby(records, key=lambda r: (r["kind"], r.get("group"), r["sha256"]
                                                                            if r["kind"] == "exact" else None)):
                    _choose_in(list(members), root, distance, rows)
        by_reason: collections.Counter[str] = collections.Counter()
        by_split: collections.Counter[str] = collections.Counter()
        by_class: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        last, copied = None, 0
        for path, kind, (split, sha256), reason, _, labels in rows:
            if kind == _COPY:
                digests[split] += bytes.fromhex(sha256)
                copied += 1
                last = path
            elif path != last:
                last = path
                digests[split] += bytes.fromhex(sha256)
                by_reason[reason] += 1
                by_split[split] += 1
                by_class[split].update(labels)
        keys = {split: np.unique(np.frombuffer(found, dtype=_DIGEST)) for split, found in digests.items()}
    except BaseException:
        folder.close()
        raise
    return Dropping(keys, dict(by_reason), rows, folder, dict(by_split),
                    {split: dict(n) for split, n in by_class.items() if n}, copied, unchanged)


def _choose_in(members: list[dict[str, Any]], root: str, distance: int | None, rows: SortedRows) -> None:
    """One group's files to leave out, as rows ``(path, _NEAR or _EXACT, (split, sha256), reason,
    line)``: a file in an exact and a near group sorts first for its near group's decision.

    Split by split, in their order, each file is left out when it copies (or, in a near group, is
    within ``distance`` of) a file kept in another split, and kept otherwise. An earlier version's
    record (an append's group: a line's ``version`` below the run's, ``_is_earlier``) is kept from
    the start, whatever its split, and never left out.
    """
    splits = split_order.ordered(m["split"] for m in members)
    if len(splits) < 2:
        return
    near_group = members[0]["kind"] == "near"
    if near_group and distance is None:
        raise ValueError("near groups to drop from, but no threshold")
    latest = max(m.get("version", 0) for m in members)
    kept = [m for m in members if _is_earlier(m, latest)]
    for split in splits:
        later = [m for m in members if m["split"] == split and not _is_earlier(m, latest)]
        others = sorted((k for k in kept if k["split"] != split), key=lambda m: m["path"])  # ties: first by path
        if not others:
            kept.extend(later)
            continue
        if not near_group:
            for m in later:
                _left_out(m, others[0], None, root, rows)
            continue
        pictures = np.array([int(k["phash"], 16) for k in others], dtype=np.uint64)
        contents = np.array([k["sha256"] for k in others])
        step = max(1, _CELLS // len(others))
        for start in range(0, len(later), step):
            block = later[start:start + step]
            gaps = hamming(np.array([int(m["phash"], 16) for m in block], dtype=np.uint64)[:, None],
                           pictures[None, :]).astype(np.int64)
            other = np.array([m["sha256"] for m in block])[:, None] != contents[None, :]
            score = np.where(gaps <= distance, 2 * gaps + other, np.iinfo(np.int64).max)  # same bytes first
            closest = score.argmin(axis=1)
            for m, at, within in zip(block, closest.tolist(), (gaps[np.arange(len(block)), closest] <= distance)):
                if within:
                    copy = others[at]
                    _left_out(m, copy, None if copy["sha256"] == m["sha256"] else hamming(
                        int(m["phash"], 16), int(copy["phash"], 16)), root, rows)
                else:
                    kept.append(m)  # kept: the next splits are compared with it too


def _is_earlier(member: dict[str, Any], latest: int) -> bool:
    """Whether a group's line is an earlier version's record (an append's report names each line's
    version; the run's are the latest): never left out by an append."""
    return "version" in member and member["version"] < latest


def _left_out(member: dict[str, Any], copy: dict[str, Any], gap: int | None, root: str, rows: SortedRows) -> None:
    """A file left out as a copy (``gap`` None) or a near copy of the kept file ``copy``, as a row."""
    if gap is None:
        about: dict[str, Any] = {"duplicate_of": copy["path"]}
        reason, kind = exact_reason(copy["split"]), _EXACT if member["kind"] == "exact" else _NEAR
    else:
        about = {"duplicate_of": copy["path"], "distance": gap}
        reason, kind = near_reason(copy["split"]), _NEAR
    path = member["path"]
    relpath = _relpath(path, root)
    label = member.get("label")  # None: a line of an older run, its label unknown
    labels = tuple(label) if isinstance(label, list) else (label,) if label is not None else ()
    rows.append((path, kind, (member["split"], member["sha256"]), reason, skipped.line(root, relpath, reason, **about),
                 labels))


def _relpath(path: str, root: str) -> str:
    """A file's path relative to the run's input (skipped.jsonl's ``relpath``); no root (WriteImageDataset's
    elements): its path as given."""
    base = root.rstrip("/")
    return path[len(base) + 1:] if base and path.startswith(base + "/") else path


class Rewritten:
    """What ``rewrite`` did: the shards' reports as they will be published, and the shards
    written again, under a staged name in the run's folder, each published from there in place of
    the shard it replaces (which stays as it was, still matching its record)."""

    def __init__(self, shards: list[tuple], class_counts: list[tuple[tuple[str, str], int]],
                 staged: list[tuple[str, str]]) -> None:
        self.shards = shards
        self.class_counts = class_counts
        self._staged = staged

    def published_from(self) -> dict[str, str]:
        """Each rewritten shard's (and companion's) name -> the name of its staged file in the run's folder."""
        return {target.rsplit("/", 1)[-1]: source.rsplit("/", 1)[-1] for source, target in self._staged}

    def discard(self) -> None:
        """Removes the rewritten shards (the counts did not add up, or the dataset could not be
        staged: nothing is published)."""
        _remove_staged([source for source, _ in self._staged])


def rewrite(work: str, file_format: str, compression: str, multi_label: bool,
            shards: Sequence[tuple], class_counts: Iterable[tuple[tuple[str, str], int]],
            hash_files: Iterable[str], dropping: Dropping) -> Rewritten:
    """Writes again, without the records ``dropping`` holds, each shard in ``work`` that holds any.

    A shard with a hash file of its own (the streaming sink's) is read only when that file names a
    record to leave out; the shuffle sink's hash files are not a shard's, so each shard of a split
    with a record to leave out is read. The reports of the shards rewritten get their new record
    counts, sizes and sha256, and the class counts lose the records left out.

    Args:
      work: the run's folder, which holds the shards.
      file_format: the shards' format (``--file_format``).
      compression: their compression.
      multi_label: whether a record counts under several labels.
      shards: the shards' reports (``ShardReports.shards``).
      class_counts: the class counts' rows (``ShardReports.class_counts``).
      hash_files: the records' hash files (``ShardReports.hash_files``).
      dropping: what to leave out (``choose``).

    Raises:
      DatasetError: the shards hold another number of records to leave out than the files named
        (nothing is published).
      StorageError: a shard cannot be read or written.
    """
    fmt = shard_format(file_format)
    own = set(hash_files)
    rows, staged, total = [], [], 0
    removed: collections.Counter[tuple[str, str]] = collections.Counter()
    writing: list[str] = []  # the staged shard being written, until it is staged or removed
    try:
        for row in shards:
            split, name = row[0], row[1]
            hashes = join(work, layout.hashes_name(name))
            if split not in dropping.keys or (hashes in own and not _names_any(hashes, dropping)):
                rows.append(row)
                continue
            source, target = join(work, name + _STAGED), join(work, name)
            writing = fmt.shard_files(source, compression)
            checksum, kept, left_out = Checksum(), 0, 0
            with fmt.records(source, compression, checksum, shown_as=target) as write:
                for payload in fmt.read(target, compression):
                    sha256, labels = fmt.identity(payload, multi_label)
                    if dropping.holds(split, sha256):
                        left_out += 1
                        removed.update((split, label) for label in labels)
                    else:
                        write(payload)
                        kept += 1
            if not left_out:
                layout.delete(fmt.shard_files(source, compression), source)
                writing = []
                rows.append(row)
                continue
            # Its companions (a DALI index: ShardFormat.companions) written again with it, moved with it.
            staged.extend(zip(fmt.shard_files(source, compression), fmt.shard_files(target, compression)))
            writing = []
            total += left_out
            rows.append((split, name, kept, checksum.size, checksum.hexdigest()))
    except BaseException:
        _remove_staged([*(source for source, _ in staged), *writing])
        raise
    result = Rewritten(rows, [*class_counts, *(((s, label), -n) for (s, label), n in removed.items())], staged)
    if total != dropping.left_out:
        result.discard()
        raise DatasetError(f"{dropping.left_out} files are named to leave out of the dataset (copies, or "
                           f"--cross_split_duplicates drop) but {total} records of theirs were found in the "
                           "shards: no manifest written")
    return result


def _names_any(hashes: str, dropping: Dropping) -> bool:
    """Whether a shard's hash file names a record ``dropping`` leaves out."""
    try:
        with open_to_read(hashes) as f:
            lines = f.read().splitlines()  # a shard's: a line a record
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("read", hashes, e) from e
    return any(dropping.holds(parsed.split.decode(), parsed.sha256.decode())
               for parsed in (hash_lines.parse(hashes, line) for line in lines if line))


def _remove_staged(paths: list[str]) -> None:
    """Removes the staged shards of ``paths`` that exist, so a run that fails leaves none in its
    folder. A failure to remove one is logged, not raised: the error that stopped the run is
    the one to report."""
    try:
        present = [path for path in paths if FileSystems.exists(path)]
        if present:
            FileSystems.delete(present)
    except Exception as e:  # noqa: BLE001 - each filesystem raises its own types; the run's error is raised.
        _LOG.warning("could not remove the rewritten shards %s: %s", ", ".join(paths), e)
