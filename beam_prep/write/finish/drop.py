"""``--cross_split_duplicates drop``: the members of each group of copies or near copies across
splits that are not in the group's kept split are left out of the dataset, and named in
skipped.jsonl.

Near duplicates are known only once every image is decoded (the perceptual hashes come from the
workers), so the shards are written by then: ``choose`` reads the groups ``duplicates.find``
wrote (duplicates.jsonl), and ``rewrite`` writes again, in the run's folder and before anything
is published, only the shards that hold a record to leave out, through the format's own reader
and writer (``ShardFormat.read``, ``records``). A record is known by its split and source
sha256, which both its hash line and the record itself carry: every record of a content in a
split lies in the same groups (the same bytes, the same perceptual hash), so leaving out a
(split, sha256) leaves out exactly the files named. See docs/design/duplicates.md.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from apache_beam.io.filesystems import FileSystems

from beam_prep.errors import DatasetError
from beam_prep.io.storage import join, open_to_read, storage_error
from beam_prep.io.tfrecord import Checksum
from beam_prep.write.finish import duplicates
from beam_prep.write.plan import skipped
from beam_prep.write.plan.spill import SortedRows, SpillFolder
from beam_prep.write.shared import layout
from beam_prep.write.shared.entry import DEFAULT_SPLIT, VALIDATION_SPLIT
from beam_prep.write.shared.shard_formats import shard_format

__all__ = ["Dropping", "Rewritten", "choose", "exact_reason", "kept_split", "near_reason", "rewrite"]

_STAGED = ".without-dropped"  # a rewritten shard's name in the run's folder until it replaces the shard
_DIGEST = "S32"


def kept_split(splits: Iterable[str]) -> str:
    """The split whose members of a group are kept: train, else validation, else the first by name
    (a copy in validation and test leaves test, the last to be looked at, clean of both)."""
    return min(splits, key=lambda s: (s != DEFAULT_SPLIT, s != VALIDATION_SPLIT, s))


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
      by_reason: files left out per reason (``exact_reason``, ``near_reason``).
    """

    keys: dict[str, np.ndarray]
    by_reason: dict[str, int]
    _rows: SortedRows
    _folder: SpillFolder

    @property
    def count(self) -> int:
        return sum(self.by_reason.values())

    def to_json(self) -> dict[str, Any]:
        """The manifest's ``duplicates.dropped`` and ``duplicates.dropped_by_reason``."""
        return {"dropped": self.count, "dropped_by_reason": dict(sorted(self.by_reason.items()))}

    def lines(self) -> Iterator[tuple[str, str]]:
        """``(path, skipped.jsonl line)`` of each file left out, sorted by path, each once (a file
        in an exact and a near group is named for its exact copy)."""
        last = None
        for path, _, _, _, line in self._rows:
            if path != last:
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


def choose(lines_file: str, root: str) -> Dropping:
    """The records to leave out: in each group of duplicates.jsonl (``lines_file``, local) that
    lies in two splits or more, every file outside the group's ``kept_split``.

    Each is named with the kept file it copies (``duplicate_of``: for an exact copy the first by
    path, for a near one the closest, then the first by path) and, for a near copy, its
    ``distance`` in bits. Memory: one group at a time, then 32 bytes a file left out; the lines
    go through an external sort by path.

    Args:
      lines_file: duplicates.jsonl as ``duplicates.find`` wrote it: each group's lines together.
      root: the run's ``--input``, which the paths are under (skipped.jsonl's ``relpath``).
    """
    folder = SpillFolder(prefix="beam-prep-drop-")
    rows = SortedRows(folder, "dropped")
    try:
        with open(lines_file, "rb") as f:
            records = (json.loads(line) for line in f)
            for _, members in itertools.groupby(records, key=lambda r: (r["kind"], r.get("group"), r["sha256"]
                                                                        if r["kind"] == "exact" else None)):
                _choose_in(list(members), root, rows)
        digests: dict[str, bytearray] = collections.defaultdict(bytearray)
        by_reason: collections.Counter[str] = collections.Counter()
        last = None
        for path, _, (split, sha256), reason, _ in rows:
            if path != last:
                last = path
                digests[split] += bytes.fromhex(sha256)
                by_reason[reason] += 1
        keys = {split: np.unique(np.frombuffer(found, dtype=_DIGEST)) for split, found in digests.items()}
    except BaseException:
        folder.close()
        raise
    return Dropping(keys, dict(by_reason), rows, folder)


def _choose_in(members: list[dict[str, Any]], root: str, rows: SortedRows) -> None:
    """One group's files outside its kept split, as rows ``(path, 0 exact or 1 near, (split, sha256),
    reason, line)``: a file in an exact and a near group sorts first for its exact copy."""
    splits = {m["split"] for m in members}
    if len(splits) < 2:
        return
    keep = kept_split(splits)
    kept = sorted((m for m in members if m["split"] == keep), key=lambda m: m["path"])
    near = members[0]["kind"] == "near"
    for m in members:
        if m["split"] == keep:
            continue
        if near:
            picture = int(m["phash"], 16)
            gap, closest = min(((int(k["phash"], 16) ^ picture).bit_count(), k["path"]) for k in kept)
            about: dict[str, Any] = {"duplicate_of": closest, "distance": gap}
            reason = near_reason(keep)
        else:
            about = {"duplicate_of": kept[0]["path"]}
            reason = exact_reason(keep)
        path = m["path"]
        base = root.rstrip("/")  # no root (WriteImageDataset's elements): each path as given
        relpath = path[len(base) + 1:] if base and path.startswith(base + "/") else path
        rows.append((path, int(near), (m["split"], m["sha256"]), reason, skipped.line(root, relpath, reason, **about)))


class Rewritten:
    """What ``rewrite`` did: the shards' reports as they will be published, and the shards
    written again (under a staged name, until ``replace``)."""

    def __init__(self, shards: list[tuple], class_counts: list[tuple[tuple[str, str], int]],
                 staged: list[tuple[str, str]]) -> None:
        self.shards = shards
        self.class_counts = class_counts
        self._staged = staged

    def replace(self) -> None:
        """Moves each rewritten shard over the one it replaces, in the run's folder: the last step
        before publishing (a run killed after it is resumed by writing those shards again, since
        they no longer match their records).

        Raises:
          StorageError: a shard cannot be moved.
        """
        if not self._staged:
            return
        sources, targets = zip(*self._staged)
        try:
            FileSystems.rename(list(sources), list(targets))
        except Exception as e:  # each filesystem raises its own types.
            raise storage_error("replace", targets[0], e) from e

    def discard(self) -> None:
        """Removes the rewritten shards (the counts did not add up: nothing is published)."""
        if self._staged:
            layout.delete([source for source, _ in self._staged], "rewritten shards")


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
    for row in shards:
        split, name = row[0], row[1]
        hashes = join(work, layout.hashes_name(name))
        if split not in dropping.keys or (hashes in own and not _names_any(hashes, dropping)):
            rows.append(row)
            continue
        source, target = join(work, name + _STAGED), join(work, name)
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
            rows.append(row)
            continue
        # Its companions (a DALI index: ShardFormat.companions) written again with it, moved with it.
        staged.extend(zip(fmt.shard_files(source, compression), fmt.shard_files(target, compression)))
        total += left_out
        rows.append((split, name, kept, checksum.size, checksum.hexdigest()))
    result = Rewritten(rows, [*class_counts, *(((s, label), -n) for (s, label), n in removed.items())], staged)
    if total != dropping.count:
        result.discard()
        raise DatasetError(f"--cross_split_duplicates drop names {dropping.count} files to leave out but "
                           f"{total} records of theirs were found in the shards: no manifest written")
    return result


def _names_any(hashes: str, dropping: Dropping) -> bool:
    """Whether a shard's hash file names a record ``dropping`` leaves out."""
    try:
        with open_to_read(hashes) as f:
            lines = f.read().splitlines()  # a shard's: a line a record
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("read", hashes, e) from e
    return any(dropping.holds(split.decode(), digest.hex())
               for digest, split, _ in (duplicates.parse_hash_line(hashes, line) for line in lines if line))
