"""duplicates.jsonl read once for the report: its groups of copies and near copies, and every pair of
files of a group that lie in two splits (a leak), counted exactly and kept up to a cap.

A group is held only while it is read (the file lists each group's lines together), so memory
grows with the groups kept, not with the file: a million-line file costs one pass.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterable, Iterator
from typing import Any

from beam_prep.errors import DatasetError

__all__ = ["DuplicateFile", "Group", "Leaks", "Pair", "read_leaks"]


@dataclasses.dataclass(frozen=True)
class DuplicateFile:
    """One line of duplicates.jsonl: a record's source, its split, and its hashes."""

    path: str
    split: str
    sha256: str
    phash: int | None = None
    distance: int = 0  # from its near group's first record, in bits (exact copies: 0)


@dataclasses.dataclass(frozen=True)
class Group:
    """A group of exact copies (``kind`` ``exact``, keyed by content) or near copies (``near``, by number)."""

    kind: str
    key: str
    distance: int  # the largest distance in the group, in bits
    files: tuple[DuplicateFile, ...]

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f.split for f in self.files))

    def pairs(self) -> Iterator[Pair]:
        """Every two of its files that lie in different splits, in the file's order."""
        for a, b in itertools.combinations(self.files, 2):
            if a.split != b.split:
                yield Pair(self, a, b, _distance(a, b) if self.kind == "near" else 0)

    def pair_count(self) -> int:
        """How many ``pairs`` it has, without listing them: a group of a thousand copies has ~250,000."""
        per_split: dict[str, int] = {}
        for f in self.files:
            per_split[f.split] = per_split.get(f.split, 0) + 1
        n = len(self.files)
        return (n * n - sum(k * k for k in per_split.values())) // 2


@dataclasses.dataclass(frozen=True)
class Pair:
    """Two files of one group in two splits, and their distance in bits (0: the same bytes)."""

    group: Group
    a: DuplicateFile
    b: DuplicateFile
    distance: int


@dataclasses.dataclass(frozen=True)
class Leaks:
    """What duplicates.jsonl says, counted exactly, with the first groups and pairs kept.

    ``groups``: up to the cap, the groups across splits first (closest first), then the others.
    ``pairs``: up to the cap, closest first. ``exists``: False where the folder has no such file.
    """

    exists: bool
    exact_groups: int = 0
    near_groups: int = 0
    groups_across: int = 0
    pair_count: int = 0
    groups: tuple[Group, ...] = ()
    pairs: tuple[Pair, ...] = ()

    @property
    def group_count(self) -> int:
        return self.exact_groups + self.near_groups


def _distance(a: DuplicateFile, b: DuplicateFile) -> int:
    if a.sha256 == b.sha256 or a.phash is None or b.phash is None:
        return 0 if a.sha256 == b.sha256 else max(a.distance, b.distance)
    return (a.phash ^ b.phash).bit_count()


def read_leaks(lines: Iterable[str] | None, where: str, max_groups: int, max_pairs: int) -> Leaks:
    """duplicates.jsonl's groups and cross-split pairs: every one counted, ``max_groups`` and
    ``max_pairs`` of them kept (the closest first).

    Args:
      lines: the file's lines; None where there is no such file.
      where: the file, as messages name it.
      max_groups: groups kept (those across splits first).
      max_pairs: pairs across splits kept.

    Raises:
      DatasetError: a line that is not one of the file's JSON objects, naming the file and the line.
    """
    if lines is None:
        return Leaks(exists=False)
    counts = {"exact": 0, "near": 0}
    across = pair_count = 0
    kept_groups = _Closest(max_groups)
    kept_pairs = _Closest(max_pairs)
    for group in _groups(lines, where):
        counts[group.kind] += 1
        if len(group.splits) > 1:
            across += 1
            pair_count += group.pair_count()
            for pair in itertools.islice(group.pairs(), max_pairs):
                kept_pairs.add(pair.distance, pair)
        kept_groups.add((len(group.splits) < 2, group.distance), group)
    return Leaks(True, counts["exact"], counts["near"], across, pair_count, kept_groups.items(), kept_pairs.items())


class _Closest:
    """The ``cap`` items of smallest key seen, first seen first among equals; trimmed now and then,
    so that adding n items costs O(n log cap)."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._items: list[tuple[Any, int, Any]] = []
        self._seen = 0

    def add(self, key: Any, item: Any) -> None:
        self._items.append((key, self._seen, item))
        self._seen += 1
        if len(self._items) > 2 * self._cap + 64:
            self._trim()

    def _trim(self) -> None:
        self._items = sorted(self._items, key=lambda t: t[:2])[:self._cap]

    def items(self) -> tuple[Any, ...]:
        self._trim()
        return tuple(item for _, _, item in self._items)


def _groups(lines: Iterable[str], where: str) -> Iterator[Group]:
    """The file's groups in its order, each once its last line is read."""
    current: tuple[str, str] | None = None
    files: list[DuplicateFile] = []
    distance = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row: dict[str, Any] = json.loads(line)
            kind = str(row.get("kind", "exact"))
            key = (kind, str(row["group"] if kind == "near" else row["sha256"]))
            phash = row.get("phash")
            f = DuplicateFile(str(row["path"]), str(row["split"]), str(row["sha256"]),
                              int(phash, 16) if isinstance(phash, str) else None, int(row.get("distance", 0)))
            group_distance = int(row.get("group_distance", 0))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise DatasetError(f"{where} line {number} is not a duplicate's line ({e}): {line[:200]!r}") from e
        if key != current and files:
            yield Group(current[0], current[1], distance, tuple(files))
            files = []
        current = key
        files.append(f)
        distance = group_distance
    if files:
        yield Group(current[0], current[1], distance, tuple(files))
