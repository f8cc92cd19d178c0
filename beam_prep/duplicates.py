"""Exact duplicates among the written records: files with the same bytes, found by their sha256.

Scraped and merged datasets hold copies, and a copy across train and
validation silently inflates validation accuracy. The writers already hash
every source file for ``image/key/sha256``; each also writes one line per
record it writes to a *hash file* in the run's folder (``hash_line``: the
sha256, the split, the source's path): the streaming sink one beside each
shard (kept with the shard when a run resumes), the shuffle sink through
Beam's ``WriteToText``. The manifest step reads them back (``find``): no
second pass over the images.

The step that reads them holds every record's hash in no object of its own,
so its memory is bounded by the records, not their paths: at most 9 bytes per
record while reading (a uint64 prefix of each sha256, sorted in place, and a
mask), then 56 bytes per *candidate* (a prefix seen twice or more; at most
half the records), which is at most 28 bytes per record when every record has
a copy, and nothing when none has. Candidates are checked against the full
sha256 (the first file of each prefix gives it; a file with the same prefix
and another hash is kept apart, a 2^-64 event per pair), and the files that
have copies come back in hash order through an external sort (``spill``)
keyed by each file's place in its group, so a group of a million copies is
never held at once. See the README's *Duplicates* for what is reported.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import shutil
from typing import IO, Any, Iterable, Iterator

import numpy as np

from beam_prep.errors import DatasetError
from beam_prep.listing import printable
from beam_prep.spill import SortedSpill, SpillFolder

__all__ = ["EXAMPLES", "Duplicates", "copy_lines", "find", "hash_line"]

EXAMPLES = 5  # groups of copies the manifest shows, and files shown of each
_PREFIX_HEX = 16  # a sha256's first 8 bytes, as hex: the key held per record
_SHA256_HEX = 64
_READ_BYTES = 1 << 22


def hash_line(sha256_hex: str, split: str, path: str) -> str:
    """A hash file's line for one written record: ``<sha256 hex>\\t<split>\\t<path as JSON>``."""
    return f"{sha256_hex}\t{split}\t{json.dumps(path)}"


@dataclasses.dataclass
class Duplicates:
    """What ``find`` found: counts for the manifest and the summary; ``lines_file`` (local,
    temporary) holds duplicates.jsonl until the caller copies it into the dataset.

    ``extra_copies`` is ``within_split + across_splits``: of ``n`` files with one
    content, ``n - 1`` are extra; those in a split that already has the content
    are ``within_split``, and each further split it appears in adds one to
    ``across_splits`` (a validation image that is also in train: 1).
    """

    images: int = 0  # contents held by two files or more
    extra_copies: int = 0
    within_split: int = 0
    across_splits: int = 0
    examples: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    lines_file: str | None = None
    _folder: SpillFolder | None = None

    def to_json(self) -> dict[str, Any]:
        return {"images": self.images, "extra_copies": self.extra_copies, "within_split": self.within_split,
                "across_splits": self.across_splits, "examples": self.examples}

    def close(self) -> None:
        if self._folder is not None:
            self._folder.close()


def find(hash_files: Iterable[str], capacity: int) -> Duplicates:
    """Reads the hash files (in the order given: pass them sorted, and reruns agree) twice,
    and returns the duplicates among their lines.

    ``capacity``: at most this many lines in all (the records written cannot exceed
    the files listed). Close the result when its ``lines_file`` is copied.

    Raises:
      DatasetError: the files hold more lines than ``capacity``, or a line that is
        not a hash line.
      StorageError: a file cannot be read.
    """
    files = list(hash_files)
    candidates, sizes = _candidates(files, capacity)
    folder = SpillFolder(prefix="beam-prep-duplicates-")
    found = Duplicates(lines_file=folder.file("duplicates.jsonl"), _folder=folder)
    try:
        with open(found.lines_file, "w", encoding="utf-8") as out:
            if len(candidates):
                _report(files, candidates, sizes, folder, found, out)
    except BaseException:
        found.close()
        raise
    return found


def _candidates(files: list[str], capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Pass 1: the sha256 prefixes held by two lines or more, sorted, and how many lines hold each."""
    prefixes = np.empty(capacity, dtype=np.uint64)
    n = 0
    for path, lines in _chunks(files):
        keys = _prefixes(path, lines)
        if n + len(keys) > capacity:
            raise DatasetError(f"the hash files hold more than {capacity:,} records, the most this run "
                               f"can have written (at {path}): no manifest written")
        prefixes[n:n + len(keys)] = keys
        n += len(keys)
    prefixes = prefixes[:n]
    prefixes.sort()
    repeated = prefixes[1:][prefixes[1:] == prefixes[:-1]]  # each line equal to the one before it
    del prefixes
    candidates, repeats = np.unique(repeated, return_counts=True)
    return candidates, (repeats + 1).astype(np.uint32)


def _report(files: list[str], candidates: np.ndarray, sizes: np.ndarray, folder: SpillFolder,
            found: Duplicates, out: IO[str]) -> None:
    """Pass 2: each candidate line checked against its group's full hash and put in its group's
    place; then the groups read back in order and written, counted and sampled."""
    starts = np.zeros(len(candidates), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    total = int(starts[-1] + sizes[-1])
    seen = np.zeros(len(candidates), dtype=np.uint32)
    first = np.zeros(len(candidates), dtype="V32")  # each group's full sha256, from its first line
    places = SortedSpill(folder, "groups", total)
    apart: dict[bytes, list[tuple[str, str]]] = collections.defaultdict(list)  # same prefix, other hash
    mismatched: collections.Counter[int] = collections.Counter()
    for path, lines in _chunks(files):
        keys = _prefixes(path, lines)
        at = np.minimum(np.searchsorted(candidates, keys), len(candidates) - 1)
        for i in np.flatnonzero(candidates[at] == keys).tolist():
            group = int(at[i])
            digest, split, name = _parse(path, lines[i])
            if seen[group] == 0:
                first[group] = np.void(digest)
            elif first[group].tobytes() != digest:
                apart[digest].append((split, name))
                mismatched[group] += 1
                continue
            place = int(starts[group]) + int(seen[group])
            seen[group] += 1
            places.add(((place << 64) // total, group, split, name))
    tally = _Tally(found, out)
    current = -1
    for _, group, split, name in places:
        if group != current:
            tally.group_done()
            current = group
            copies = int(sizes[group]) - mismatched[group]
            tally.start(first[group].tobytes().hex(), copies)
        tally.add(split, name)
    tally.group_done()
    for digest, files_apart in sorted(apart.items()):
        tally.start(digest.hex(), len(files_apart))
        for split, name in files_apart:
            tally.add(split, name)
        tally.group_done()
    found.examples = tally.examples()


class _Tally:
    """One group of files with the same bytes at a time, streamed: written to duplicates.jsonl,
    counted, and the first few groups kept as the manifest's examples (across splits first)."""

    def __init__(self, found: Duplicates, out: IO[str]) -> None:
        self._found, self._out = found, out
        self._sha256, self._copies = "", 0
        self._per_split: collections.Counter[str] = collections.Counter()
        self._shown: list[dict[str, str]] = []
        self._across: list[dict[str, Any]] = []
        self._within: list[dict[str, Any]] = []

    def start(self, sha256: str, copies: int) -> None:
        self._sha256, self._copies = sha256, copies
        self._per_split.clear()
        self._shown = []

    def add(self, split: str, path: str) -> None:
        if self._copies < 2:  # a prefix shared by different contents: no copy at all
            return
        self._out.write(json.dumps({"sha256": self._sha256, "copies": self._copies, "split": split,
                                    "path": path}, ensure_ascii=False) + "\n")
        self._per_split[split] += 1
        if len(self._shown) < EXAMPLES:
            self._shown.append({"split": split, "path": path})

    def group_done(self) -> None:
        if not self._per_split:
            return
        f = self._found
        f.images += 1
        f.extra_copies += self._copies - 1
        f.within_split += sum(n - 1 for n in self._per_split.values())
        f.across_splits += len(self._per_split) - 1
        kept = self._across if len(self._per_split) > 1 else self._within
        if len(kept) < EXAMPLES:
            kept.append({"sha256": self._sha256, "copies": self._copies, "files": self._shown})
        self._per_split.clear()

    def examples(self) -> list[dict[str, Any]]:
        return (self._across + self._within)[:EXAMPLES]


def _chunks(files: list[str]) -> Iterator[tuple[str, list[bytes]]]:
    """Each file's lines, a few MB at a time, as (file, lines)."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    from beam_prep.storage import storage_error

    for path in files:
        try:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                rest = b""
                while block := f.read(_READ_BYTES):
                    lines = (rest + block).split(b"\n")
                    rest = lines.pop()
                    yield path, lines
                if rest:
                    yield path, [rest]
        except DatasetError:
            raise
        except Exception as e:  # noqa: BLE001 - each filesystem raises its own types.
            raise storage_error("read", path, e) from e


def _prefixes(path: str, lines: list[bytes]) -> np.ndarray:
    try:
        return np.fromiter((int(line[:_PREFIX_HEX], 16) for line in lines), dtype=np.uint64, count=len(lines))
    except ValueError as e:
        raise DatasetError(f"{path} holds a line that is not a record's hash: {e}") from e


def _parse(path: str, line: bytes) -> tuple[bytes, str, str]:
    """A hash line's sha256 (32 bytes), split and source path."""
    try:
        digest, split, name = line.decode("utf-8").split("\t", 2)
        return bytes.fromhex(digest[:_SHA256_HEX]), split, json.loads(name)
    except ValueError as e:
        raise DatasetError(f"{path} holds a line that is not a record's hash: {line[:200]!r}") from e


def copy_lines(found: Duplicates, target: str) -> None:
    """Writes ``found``'s duplicates.jsonl to ``target`` (local or gs://)."""
    from apache_beam.io.filesystems import FileSystems

    from beam_prep.storage import is_local, storage_error

    try:
        if is_local(target):
            shutil.copyfile(found.lines_file, target)
            return
        with open(found.lines_file, "rb") as src, FileSystems.create(target, mime_type="text/plain") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except Exception as e:  # noqa: BLE001 - each filesystem raises its own types.
        raise storage_error("write", target, e) from e
