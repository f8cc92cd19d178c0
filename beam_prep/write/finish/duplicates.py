"""Exact duplicates among the written records: files with the same bytes, found by their sha256.

A copy across train and validation silently inflates validation accuracy. The
writers already hash every source file, and each writes a line per record to a
*hash file* in the run's folder (``hash_line``); the manifest step reads them
back (``find``), with no second pass over the images and no object per record:
a sorted array of sha256 prefixes, then the candidates checked against the full
hash and grouped through an external sort (``spill``), so memory stays bounded
however many records or copies. See docs/design/duplicates.md for what is reported and
what it costs.
"""
from __future__ import annotations

import array
import collections
import dataclasses
import itertools
import json
import shutil
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any

import numpy as np
from apache_beam.io.filesystems import FileSystems

from beam_prep import wording
from beam_prep.errors import DatasetError
from beam_prep.io.storage import is_local, join, open_to_read, storage_error
from beam_prep.write.finish import near
from beam_prep.write.shared import hash_lines, layout, sorted_sets, split_order
from beam_prep.write.shared.hash_lines import hash_line
from beam_prep.write.shared.spill import SortedSpill, SpillFolder

__all__ = ["EXAMPLES", "Duplicates", "copy_lines", "describe_conflicts", "find", "hash_line", "label_conflicts", "leakage",
           "leakage_error", "read_chunks", "split_pairs"]

EXAMPLES = 5  # groups of copies the manifest shows, and files shown of each
_PREFIX_HEX = 16  # a sha256's first 8 bytes, as hex: the key held per record
_REST_BYTES = 24  # a sha256 after its prefix
_READ_BYTES = 1 << 22
_UNKNOWN_LABEL = b"null"  # a hash line without a label (an older run's)


@dataclasses.dataclass
class Duplicates:
    """What ``find`` found: counts for the manifest and the summary; ``lines_file`` (local,
    temporary) holds duplicates.jsonl until the caller copies it into the dataset.

    ``extra_copies`` is ``within_split + across_splits``: of ``n`` files with one
    content, ``n - 1`` are extra; those in a split that already has the content
    are ``within_split``, and each further split it appears in adds one to
    ``across_splits`` (a validation image that is also in train: 1). ``split_pairs``: per pair of
    splits (``split_order.pair_name``), the contents with a file in both. ``label_conflicts``: the
    same bytes under two labels or more, a contradiction no copy elsewhere is (``conflicts_json``).
    """

    images: int = 0  # contents held by two files or more
    extra_copies: int = 0
    within_split: int = 0
    across_splits: int = 0
    split_pairs: dict[str, int] = dataclasses.field(default_factory=dict)
    examples: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    near: dict[str, Any] | None = None  # near.NearFound.to_json(); None: no near search
    with_earlier: int | None = None  # an append's: groups holding a record of an earlier version
    label_conflicts: int = 0  # contents whose files are under two labels or more
    conflicting_files: int = 0  # the files of those contents
    conflict_examples: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    lines_file: str | None = None
    _folder: SpillFolder | None = None

    def to_json(self) -> dict[str, Any]:
        found = {"images": self.images, "extra_copies": self.extra_copies, "within_split": self.within_split,
                 "across_splits": self.across_splits, "split_pairs": self.split_pairs, "examples": self.examples,
                 "label_conflicts": {"images": self.label_conflicts, "files": self.conflicting_files,
                                     "examples": self.conflict_examples},
                 "near": self.near}
        if self.with_earlier is not None:
            found["with_earlier"] = self.with_earlier
        return found

    def close(self) -> None:
        if self._folder is not None:
            self._folder.close()


def find(hash_files: Iterable[str], capacity: int, distance: int | None = near.DEFAULT_DISTANCE,
         pairs: Iterable[tuple[int, int]] | None = None, earlier: Mapping[str, int] | None = None,
         version: int | None = None) -> Duplicates:
    """Reads the hash files (in the order given: pass them sorted, and reruns agree) twice,
    and returns the duplicates among their lines: exact copies, then near duplicates.

    An append (``version``, the one it makes) passes the dataset's records too, as hash files
    (``earlier``: each such file -> its version, among ``hash_files``): then only the groups that hold
    a record of the run's own files are reported, each line naming its record's ``version``, and
    ``with_earlier`` counts the groups that hold an earlier version's record (exact ones, then
    ``near``'s).

    ``capacity``: at most this many lines in all (the records written cannot exceed
    the files listed). ``distance``: the near-duplicate threshold in bits of the
    perceptual hash (``near.report``); None finds exact copies only. ``pairs``: the
    pairs of hashes within it, found already (``near_beam.NearPairs``); None searches
    here. Close the
    result when its ``lines_file`` is copied.

    Raises:
      DatasetError: the files hold more lines than ``capacity``, or a line that is
        not a hash line.
      StorageError: a file cannot be read.
    """
    files = list(hash_files)
    origin = _Origin(earlier or {}, version)
    candidates, sizes = _candidates(files, capacity, origin)
    folder = SpillFolder(prefix="beam-prep-duplicates-")
    found = Duplicates(lines_file=folder.file("duplicates.jsonl"), _folder=folder,
                       with_earlier=None if version is None else 0)
    try:
        with open(found.lines_file, "wb") as out:
            if len(candidates):
                _report(files, candidates, sizes, folder, found, out, origin)
            if distance is not None:
                found.near = near.report(lambda: read_chunks(files), distance, out, folder, pairs,
                                         origin.of if version is not None else None, version).to_json()
    except BaseException:
        found.close()
        raise
    return found


class _Origin:
    """Which version a hash file's lines are of: an earlier one's (``earlier``), or the run's (``version``)."""

    def __init__(self, earlier: Mapping[str, int], version: int | None) -> None:
        self.earlier, self.version = earlier, version

    def of(self, file: str) -> int:
        return self.earlier.get(file, self.version or 1)

    def is_earlier(self, file: str) -> bool:
        return file in self.earlier


def _candidates(files: list[str], capacity: int, origin: _Origin) -> tuple[np.ndarray, np.ndarray]:
    """Pass 1: the sha256 prefixes held by two lines or more, sorted, and how many lines hold each;
    with earlier versions' files, only those the run's own files hold."""
    prefixes = np.empty(capacity, dtype=np.uint64)
    ours = np.empty(capacity, dtype=bool)
    n = 0
    for path, lines in read_chunks(files):
        keys = _prefixes(path, lines)
        if n + len(keys) > capacity:
            raise DatasetError(f"the hash files hold more than {capacity:,} records, the most this run "
                               f"can have written (at {path}): no manifest written")
        prefixes[n:n + len(keys)] = keys
        ours[n:n + len(keys)] = not origin.is_earlier(path)
        n += len(keys)
    fresh = sorted_sets.unique(prefixes[:n][ours[:n]]) if origin.earlier else None
    del ours
    prefixes = prefixes[:n]
    prefixes.sort()
    repeated = prefixes[1:][prefixes[1:] == prefixes[:-1]]  # each line equal to the one before it
    del prefixes
    candidates, repeats = np.unique(repeated, return_counts=True)
    if fresh is not None:
        mine = sorted_sets.isin(candidates, fresh, among_sorted=True)
        candidates, repeats = candidates[mine], repeats[mine]
    return candidates, (repeats + 1).astype(np.uint32)


def _report(files: list[str], candidates: np.ndarray, sizes: np.ndarray, folder: SpillFolder,
            found: Duplicates, out: IO[bytes], origin: _Origin) -> None:
    """Pass 2: each candidate line checked against its group's full hash and put in its group's
    place; then the groups read back in order and written, counted and sampled.

    Per candidate, beside ``candidates`` and ``sizes``: where its group starts among the places
    (8 bytes), how many of its lines have been placed (4) and its hash after the prefix (24),
    in flat arrays: Python objects would cost ten times that.
    """
    count = len(candidates)
    starts = array.array("q")
    starts.frombytes(np.concatenate(([0], np.cumsum(sizes[:-1], dtype=np.int64))).tobytes())
    total = starts[-1] + int(sizes[-1])
    seen = array.array("I", bytes(4 * count))
    first = bytearray(_REST_BYTES * count)
    # Its first known label's code (-1: none yet), and whether another label came: 9 bytes more.
    label_of = np.full(count, -1, dtype=np.int64)
    mixed = np.zeros(count, dtype=bool)
    codes: dict[bytes, int] = {}  # a label (as JSON) -> its code: as many as the run has labels
    places = SortedSpill(folder, "groups", total)
    apart: dict[bytes, list[tuple[bytes, bytes, bytes]]] = collections.defaultdict(list)  # same prefix, other hash
    mismatched: collections.Counter[int] = collections.Counter()
    for path, lines in read_chunks(files):
        keys = _prefixes(path, lines)
        version = origin.of(path)
        at = np.minimum(np.searchsorted(candidates, keys), count - 1)
        for i in np.flatnonzero(candidates[at] == keys).tolist():
            group = int(at[i])
            parsed = hash_lines.parse(path, lines[i])
            digest, split, quoted, label = bytes.fromhex(parsed.sha256.decode()), parsed.split, parsed.path, parsed.label
            rest = digest[8:]
            if seen[group] == 0:
                first[group * _REST_BYTES:(group + 1) * _REST_BYTES] = rest
            elif first[group * _REST_BYTES:(group + 1) * _REST_BYTES] != rest:
                apart[digest].append((split, quoted, version, label))
                mismatched[group] += 1
                continue
            if label != _UNKNOWN_LABEL:  # a line of an older run contradicts nothing
                code = codes.setdefault(label, len(codes))
                if label_of[group] < 0:
                    label_of[group] = code
                elif label_of[group] != code:
                    mixed[group] = True
            places.add((((starts[group] + seen[group]) << 64) // total, group, split, quoted, version, label))
            seen[group] += 1
    del seen, starts, label_of
    tally = _Tally(found, out, origin.version)
    current = -1
    for _, group, split, quoted, version, label in places:
        if group != current:
            tally.group_done()
            current = group
            rest = bytes(first[group * _REST_BYTES:(group + 1) * _REST_BYTES])
            tally.start(int(candidates[group]).to_bytes(8, "big") + rest, int(sizes[group]) - mismatched[group],
                        bool(mixed[group]))
        tally.add(split, quoted, version, label)
    tally.group_done()
    for digest, files_apart in sorted(apart.items()):
        tally.start(digest, len(files_apart), len({label for *_, label in files_apart} - {_UNKNOWN_LABEL}) > 1)
        for split, quoted, version, label in files_apart:
            tally.add(split, quoted, version, label)
        tally.group_done()
    tally.done()


class _Tally:
    """One group of files with the same bytes at a time, streamed: written to duplicates.jsonl
    (bytes, as the hash files hold them), counted, and the first few groups kept as the
    manifest's examples (across splits first)."""

    def __init__(self, found: Duplicates, out: IO[bytes], version: int | None) -> None:
        self._found, self._out, self._version = found, out, version
        self._earlier = False
        self._head, self._sha256, self._copies, self._mixed = b"", "", 0, False
        self._per_split: collections.Counter[bytes] = collections.Counter()
        self._shown: list[tuple[bytes, bytes, bytes]] = []
        self._by_label: dict[bytes, tuple[bytes, bytes]] = {}  # a group's first file of each label (a few)
        self._across: list[dict[str, Any]] = []
        self._within: list[dict[str, Any]] = []

    def start(self, digest: bytes, copies: int, mixed: bool = False) -> None:
        """A group begins: its content, its files' count, and whether they are under two labels or more."""
        self._sha256, self._copies, self._mixed = digest.hex(), copies, mixed
        self._head = b'{"kind": "exact", "sha256": "%s", "copies": %d, "labels_differ": %s, "split": "' % (
            self._sha256.encode(), copies, b"true" if mixed else b"false")
        self._per_split.clear()
        self._shown = []
        self._by_label = {}
        self._earlier = False

    def add(self, split: bytes, quoted: bytes, version: int, label: bytes = _UNKNOWN_LABEL) -> None:
        if self._copies < 2:  # a prefix shared by different contents: no copy at all
            return
        tail = b"}\n" if self._version is None else b', "version": %d}\n' % version
        self._earlier |= self._version is not None and version != self._version
        self._out.write(self._head + split + b'", "label": ' + label + b', "path": ' + quoted + tail)
        self._per_split[split] += 1
        if len(self._shown) < EXAMPLES:
            self._shown.append((split, quoted, label))
        if self._mixed and label not in self._by_label and len(self._by_label) < EXAMPLES:
            self._by_label[label] = (split, quoted)

    def group_done(self) -> None:
        if not self._per_split:
            return
        f = self._found
        if self._earlier and f.with_earlier is not None:
            f.with_earlier += 1
        f.images += 1
        f.extra_copies += self._copies - 1
        f.within_split += sum(n - 1 for n in self._per_split.values())
        f.across_splits += len(self._per_split) - 1
        for a, b in itertools.combinations(sorted(self._per_split), 2):
            pair = split_order.pair_name(a.decode(), b.decode())
            f.split_pairs[pair] = f.split_pairs.get(pair, 0) + 1
        kept = self._across if len(self._per_split) > 1 else self._within
        if len(kept) < EXAMPLES:
            kept.append({"sha256": self._sha256, "copies": self._copies,
                         "files": [_file(split, quoted, label) for split, quoted, label in self._shown]})
        if self._mixed:
            f.label_conflicts += 1
            f.conflicting_files += self._copies
            if len(f.conflict_examples) < EXAMPLES:
                f.conflict_examples.append({"sha256": self._sha256, "copies": self._copies, "files": [
                    _file(split, quoted, label) for label, (split, quoted) in self._by_label.items()]})
        self._per_split.clear()

    def done(self) -> None:
        """The counts final: the examples chosen, the pairs of splits in the splits' order."""
        self._found.examples = (self._across + self._within)[:EXAMPLES]
        self._found.split_pairs = split_order.sorted_pairs(self._found.split_pairs)


def _file(split: bytes, quoted: bytes, label: bytes) -> dict[str, Any]:
    """A file of a group, as the manifest's examples show it."""
    return {"split": split.decode(), "label": json.loads(label), "path": json.loads(quoted)}


def read_chunks(files: list[str]) -> Iterator[tuple[str, list[bytes]]]:
    """Each file's lines, a few MB at a time, as (file, lines)."""
    for path in files:
        try:
            with open_to_read(path) as f:
                rest = b""
                while block := f.read(_READ_BYTES):
                    lines = (rest + block).split(b"\n")
                    rest = lines.pop()
                    yield path, lines
                if rest:
                    yield path, [rest]
        except DatasetError:
            raise
        except Exception as e:  # each filesystem raises its own types.
            raise storage_error("read", path, e) from e


def _prefixes(path: str, lines: list[bytes]) -> np.ndarray:
    """Each hash line's sha256 prefix, read without parsing the line (``hash_lines.parse`` checks
    the lines kept as candidates): pass 1 reads every record's line."""
    try:
        return np.fromiter((int(line[:_PREFIX_HEX], 16) for line in lines), dtype=np.uint64, count=len(lines))
    except ValueError as e:
        raise DatasetError(f"{path} holds a line that is not a record's hash: {e}") from e


def copy_lines(found: Duplicates, target: str) -> None:
    """Writes ``found``'s duplicates.jsonl to ``target`` (local or gs://)."""
    try:
        if is_local(target):
            shutil.copyfile(found.lines_file, target)
            return
        with open(found.lines_file, "rb") as src, FileSystems.create(target, mime_type="text/plain") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("write", target, e) from e


def leakage(manifest: Mapping[str, Any]) -> int:
    """Groups of exact or near copies that lie in two splits or more, from a manifest's ``duplicates``."""
    copies = manifest.get("duplicates") or {}
    return int(copies.get("across_splits", 0)) + int((copies.get("near") or {}).get("across_splits", 0))


def split_pairs(manifest: Mapping[str, Any]) -> dict[str, int]:
    """Per pair of splits, the groups of exact or near copies with files in both (every pair, whatever
    the splits are named), from a manifest's ``duplicates``, in the splits' order."""
    copies = manifest.get("duplicates") or {}
    total: collections.Counter[str] = collections.Counter()
    for counts in (copies.get("split_pairs") or {}, (copies.get("near") or {}).get("split_pairs") or {}):
        total.update(counts)
    return split_order.sorted_pairs(total)


def label_conflicts(manifest: Mapping[str, Any]) -> tuple[int, int]:
    """From a manifest's ``duplicates``: contents under two labels or more (exact copies), and near
    groups whose files are; (0, 0) for a manifest written before they were counted."""
    copies = manifest.get("duplicates") or {}
    exact = (copies.get("label_conflicts") or {}).get("images", 0)
    return int(exact), int((copies.get("near") or {}).get("label_conflicts", 0))


def describe_conflicts(manifest: Mapping[str, Any], shown: int = 3) -> str:
    """A few contents under two labels, each as its files with their labels: ``a.jpg (cat) = b.jpg (dog)``."""
    examples = ((manifest.get("duplicates") or {}).get("label_conflicts") or {}).get("examples") or []
    return "; ".join(" = ".join(f"{f['path']} ({_label_text(f.get('label'))})" for f in group["files"])
                     for group in examples[:shown])


def _label_text(label: Any) -> str:
    return ", ".join(label) if isinstance(label, list) else str(label)


def leakage_error(action: str, manifest: Mapping[str, Any], output: str) -> str | None:
    """With ``--cross_split_duplicates fail``, why a written dataset fails its run; None: it does not."""
    leaks = leakage(manifest)
    if action != "fail" or not leaks:
        return None
    return (f"--cross_split_duplicates fail: {wording.count(leaks, 'group')} of copies across splits "
            f"(the dataset is written; see {join(output, layout.DUPLICATES)})")
