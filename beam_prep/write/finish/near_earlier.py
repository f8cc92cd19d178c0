"""The dataset's records an append's new ones copy, or are near: all its duplicate search needs of them.

The groups an append reports each hold a new record (``earlier``), so they are made of the new
records and of the dataset's records that share a new one's bytes or whose perceptual hash is
within the threshold of a new one's. Those are found here without holding the dataset's records:
their hashes go to a file on disk as they are read, then, for each band key of the pigeonhole
search (``near``: two hashes within ``t`` bits of ``m`` bands agree on ``k = m - t`` of them), are
read back a chunk at a time and their keys looked up among the new records' (sorted), each
candidate checked on all 64 bits. Memory: a chunk's arrays and a few of the new records'.

``WriteImageDataset``'s append learns an element's sha256 only once a worker has read it, so its
copies of the dataset's records reach the shards (``prepare --append`` hashes each new file first
and writes none): its manifest step sets them apart (``split_off``) before the duplicate search, which
then sees the records the command's would, and ``drop`` leaves them out of the shards. A record at
the path of a record of the dataset with its bytes is that record, unchanged; any other is a copy
(skipped.jsonl, ``append.COPY_REASON``), each counted as the command counts it.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from beam_prep.write.finish import duplicates, near
from beam_prep.write.images.phash import distance as hamming
from beam_prep.write.shared import hash_lines, kept_hashes, sorted_sets
from beam_prep.write.shared.spill import SpillFolder

__all__ = ["Copy", "matching", "split_off"]

_CHUNK = 1 << 18  # the dataset's hashes read back at a time
_HELD = 1 << 16  # the most lines of the dataset's kept files the first pass holds for the second, rather than read again
_BITS = 64
_KEY_NS, _PAIR_NS = 15.0, 3.0  # a hash keyed and looked up; a candidate pair checked


def matching(kept: Iterable[tuple[str, str | None, int]], new_lines: Iterator[tuple[str, list[bytes]]],
             distance: int | None, folder: SpillFolder) -> list[tuple[str, int, int]]:
    """Writes the lines of the dataset's records that copy, or are within ``distance`` of, a new record
    as hash lines (full paths), a local file a version in ``folder``.

    Args:
      kept: each earlier version's kept hash file, its version's input, and the version.
      new_lines: the run's hash lines, as ``(file, lines)`` chunks.
      distance: the near-duplicate threshold; None: exact copies only.
      folder: where the files go.

    Returns:
      ``(file, version, lines)`` of each version's file.

    Raises:
      DatasetError: a line is not a hash line. StorageError: a file cannot be read.
    """
    kept = list(kept)
    pictures, prefixes = _new(new_lines)
    held: list[tuple[int, str, list[bytes]]] = []  # the lines of a dataset of few, for the second pass
    found, count = _by_bytes(kept, prefixes, folder, held)
    if distance is not None and len(pictures) and count:
        found.append(_by_picture(folder.file("pictures"), folder.file("valid"), count, pictures, distance))
    chosen = sorted_sets.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)
    return _write(kept, chosen, folder, held if count <= _HELD else None)


def _new(chunks: Iterator[tuple[str, list[bytes]]]) -> tuple[np.ndarray, np.ndarray]:
    """The new records' distinct perceptual hashes and sha256 prefixes (8 bytes), sorted."""
    pictures, prefixes = [], []
    for file, lines in chunks:
        for line in lines:
            parsed = hash_lines.parse(file, line)
            prefixes.append(int(parsed.sha256[:16], 16))
            if parsed.phash is not None:
                pictures.append(parsed.phash)
    return sorted_sets.unique(np.array(pictures, dtype=np.uint64)), sorted_sets.unique(np.array(prefixes, dtype=np.uint64))


def _lines(kept: list[tuple[str, str | None, int]]) -> Iterator[tuple[int, str, list[bytes]]]:
    """Each kept file's lines, a chunk at a time, as ``(index in kept, file, lines)``."""
    for i, (path, _, _) in enumerate(kept):
        for lines in kept_hashes.read_lines(path):
            yield i, path, lines


def _by_bytes(kept: list[tuple[str, str | None, int]], prefixes: np.ndarray, folder: SpillFolder,
              held: list[tuple[int, str, list[bytes]]]) -> tuple[list[np.ndarray], int]:
    """One pass over the dataset's lines: those whose sha256 prefix a new record's has (their
    positions, in the order read), and each line's perceptual hash and whether it has one, to files;
    the chunks read to ``held`` while they number ``_HELD`` lines at most (cleared past it)."""
    found, count = [], 0
    with open(folder.file("pictures"), "wb") as pictures, open(folder.file("valid"), "wb") as valid:
        for chunk in _lines(kept):
            _, path, lines = chunk
            if count + len(lines) <= _HELD:
                held.append(chunk)
            else:
                held.clear()
            mine, phashes, has = hash_lines.columns(path, lines)
            found.append(count + np.flatnonzero(sorted_sets.isin(mine, prefixes, among_sorted=True)))
            phashes.tofile(pictures)
            has.tofile(valid)
            count += len(lines)
    return found, count


def _plan(old: int, new: int, distance: int) -> list[tuple[tuple[int, int], ...]]:
    """The band keys: the cheapest choice by a cost model of every old hash keyed and looked up per key,
    and the candidate pairs equal keys give among uniform hashes."""
    best: tuple[float, int, int] | None = None
    for m in range(distance + 1, _BITS + 1):
        k = m - distance
        keys = math.comb(m, k)
        if keys > 20_000:
            break
        cost = keys * (old + new) * _KEY_NS + keys * old * new / 2 ** (_BITS * k / m) * _PAIR_NS
        if best is None or cost < best[0]:
            best = (cost, m, k)
    assert best is not None
    return near.band_keys(best[1], best[2])


def _keyed(hashes: np.ndarray, bands: tuple[tuple[int, int], ...]) -> np.ndarray:
    key = np.zeros(len(hashes), dtype=np.uint64)
    shift = 0
    for first, width in bands:
        key |= ((hashes >> np.uint64(first)) & np.uint64((1 << width) - 1)) << np.uint64(shift)
        shift += width
    return key


def _by_picture(pictures: str, valid: str, count: int, new: np.ndarray, distance: int) -> np.ndarray:
    """The positions of the dataset's hashes within ``distance`` of a new one (``new``: distinct)."""
    found = []
    for bands in _plan(count, len(new), distance):
        new_keys = _keyed(new, bands)
        order = np.argsort(new_keys, kind="stable")
        new_keys, by_key = new_keys[order], new[order]
        for start in range(0, count, _CHUNK):
            old = np.fromfile(pictures, dtype=np.uint64, count=min(_CHUNK, count - start), offset=8 * start)
            has = np.fromfile(valid, dtype=np.bool_, count=len(old), offset=start)
            keys = _keyed(old, bands)
            low, high = np.searchsorted(new_keys, keys, "left"), np.searchsorted(new_keys, keys, "right")
            candidates = np.flatnonzero((high > low) & has)
            if not len(candidates):
                continue
            spans = (high - low)[candidates]
            at = np.repeat(candidates, spans)  # each candidate once for each new hash with its key
            first = np.repeat(low[candidates] - np.cumsum(spans) + spans, spans) + np.arange(len(at))
            close = hamming(old[at], by_key[first]) <= distance
            found.append(start + sorted_sets.unique(at[close]))
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _write(kept: list[tuple[str, str | None, int]], chosen: np.ndarray, folder: SpillFolder,
           held: list[tuple[int, str, list[bytes]]] | None) -> list[tuple[str, int, int]]:
    """A second pass: the chosen lines, as hash lines with full paths, a file a version; over ``held`` (the
    first pass's chunks, every line of the dataset) where given, else over the kept files read again."""
    written: list[tuple[str, int, int]] = []
    targets = [folder.file(f"earlier-v{version}.txt") for _, _, version in kept]
    counts = [0] * len(kept)
    files = [open(target, "wb") for target in targets]  # closed below: one a version
    try:
        position = 0
        for i, _, lines in held if held is not None else _lines(kept):
            picked = chosen[(chosen >= position) & (chosen < position + len(lines))] - position
            root = kept[i][1]
            if len(picked):
                files[i].write(b"".join(line + b"\n" for line in kept_hashes.full_path_lines(
                    (lines[at] for at in picked.tolist()), root)))
            counts[i] += len(picked)
            position += len(lines)
    finally:
        for f in files:
            f.close()
    for target, (_, _, version), lines in zip(targets, kept, counts):
        if lines:
            written.append((target, version, lines))
        else:
            os.remove(target)
    return written


@dataclasses.dataclass(frozen=True)
class Copy:
    """A new record whose bytes an earlier version's record has.

    Attributes:
      path: its source, as its hash line names it (``printable``).
      split: the split it was written to.
      sha256: its source's sha256 (hex).
      labels: its label, or a multi-label record's labels.
      of: the earlier record's source (the first version's with those bytes, then the first by path).
      of_split: that record's split.
      unchanged: the earlier record is at ``path``: the same file, not a copy of it.
    """

    path: str
    split: str
    sha256: str
    labels: tuple[str, ...]
    of: str
    of_split: str
    unchanged: bool

    def appended_row(self) -> dict[str, Any]:
        """The row ``append.Additions.copies`` holds for it, as ``append.narrow`` makes one."""
        return {"path": self.path, "sha256": self.sha256, "split": self.split, "of": self.of,
                "of_split": self.of_split}


def split_off(kept: list[tuple[str, str | None, int]], run_files: list[str],
              folder: SpillFolder) -> tuple[list[str], list[Copy]]:
    """The run's hash files without the lines of records whose bytes an earlier version's record has,
    and those records.

    Args:
      kept: each earlier version's kept hash file, its version's input, and the version
        (``near_earlier.matching``'s).
      run_files: the run's hash files, sorted.
      folder: where a hash file that loses lines is written again (local); the others are returned as
        they are.

    Returns:
      The hash files to search for duplicates, in the order of ``run_files``, and the records set apart,
      in the order their lines were read.

    Raises:
      DatasetError: a line is not a hash line. StorageError: a file cannot be read.
    """
    earlier = _earlier_records(kept, run_files)
    if not earlier:
        return run_files, []
    files: list[str] = []
    found: list[Copy] = []
    for i, path in enumerate(run_files):
        target, before = folder.file(f"without-copies-{i:05d}.txt"), len(found)
        with open(target, "wb") as out:
            for _, lines in duplicates.read_chunks([path]):
                for line in lines:
                    if not line:
                        continue
                    parsed = hash_lines.parse(path, line)
                    records = earlier.get(parsed.sha256)
                    if records is None:
                        out.write(line + b"\n")
                        continue
                    _, of, of_split = min(records)
                    found.append(Copy(json.loads(parsed.path), parsed.split.decode(), parsed.sha256.decode(),
                                      _labels(parsed.label), json.loads(of), of_split.decode(),
                                      any(quoted == parsed.path for _, quoted, _ in records)))
        if len(found) == before:
            os.remove(target)
            files.append(path)
        else:
            files.append(target)
    return files, found


def _earlier_records(kept: list[tuple[str, str | None, int]],
                     run_files: list[str]) -> dict[bytes, list[tuple[int, bytes, bytes]]]:
    """The sha256 of each earlier version's record whose sha256 begins as a new one's (``near_earlier.matching``:
    a copy, but for the rare prefix two contents share) -> its records' ``(version, path as JSON, split)``."""
    folder = SpillFolder(prefix="beam-prep-copies-")
    try:
        earlier: dict[bytes, list[tuple[int, bytes, bytes]]] = {}
        for file, version, _ in matching(kept, duplicates.read_chunks(run_files), None, folder):
            for _, lines in duplicates.read_chunks([file]):
                for line in lines:
                    if line:
                        parsed = hash_lines.parse(file, line)
                        earlier.setdefault(parsed.sha256, []).append((version, parsed.path, parsed.split))
        return earlier
    finally:
        folder.close()


def _labels(label: bytes) -> tuple[str, ...]:
    """A hash line's label as a tuple of names (none where it is unknown)."""
    named = json.loads(label)
    return tuple(named) if isinstance(named, list) else (named,) if named is not None else ()
