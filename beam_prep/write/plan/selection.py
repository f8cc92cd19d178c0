"""Choices the listing makes per label once it has seen every file: ``--max_per_class`` and ``--stratify``.

By ``--validation_percent`` alone a file's split is a pure function of its path
(``hashing.split_for``), so a label of 12 images gets 0 or 3 validation images by
chance. Stratified, each label gets ``validation_count(n, percent)``: its files of
lowest split hash (the hash ``split_for`` compares with the percent, so turning
``--stratify`` on moves few files). Capped, each label keeps the ``max_per_class``
files of lowest cap hash (less the records it holds already, in an append) (the next 64 bits of the split hash's SHA-256, independent
of them: the kept files' splits stay a fair draw).

With both, the cap comes first and each label's share is of the files it keeps.

Both need a label's count before any of its files is placed. The listing's rows go
to its spill as ever, as ``RankedRow``s: their hashes beside their split; a small row per file
goes to a second spill, read back in hash order, where each label's first files set
its threshold: the split hash of its last validation file (a tie in a 64-bit hash, one
chance in billions, puts both files in validation, and is counted), or the (cap hash,
path) of its last kept file (the others are skipped by name). Reading the listing
back (``Placed``) compares each row with its label's thresholds. Memory holds a few
values per label however many files, and no row is written twice. The same tree
gives the same choice on every run, and a resumed run reuses the listing its first
run made.
"""
from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from beam_prep.errors import OptionsError
from beam_prep.write.shared.entry import DEFAULT_SPLIT, VALIDATION_SPLIT
from beam_prep.write.shared.hashing import hashed_split, split_and_cap_hashes, split_for
from beam_prep.write.shared.spill import SortedSpill, SpillFolder

__all__ = ["SKIP_OVER_CAP", "Chosen", "ListedRow", "Placed", "RankedRow", "Selection", "thresholds",
           "validation_count"]

SKIP_OVER_CAP = "over --max_per_class"  # skipped.jsonl's reason for a file past its label's cap

Threshold = tuple[int, str]  # a label's last kept (cap hash, relpath): its rows up to it are kept
_NONE_KEPT: Threshold = (-1, "")  # below every cap hash (64 bits, unsigned): a label that keeps none


# The listing's rows are plain tuples, unpacked by the names below wherever they are read: a
# tree of millions of files makes millions of them, and a NamedTuple takes Python's slow paths
# (made and pickled by a Python call, unpacked and sorted without CPython's tuple fast paths):
# a listing of 30,000 files took a quarter to a third longer with one.
ListedRow = tuple[int, str, str | None, str, int, tuple[str, ...] | None, tuple[Any, ...] | None, str | None]
"""One listed file: ``(order_key, relpath, split, label, size, labels, extra, stamp)``.

``split`` is None only on its way into ``Selection.add``, where ranking hashes it.
``labels`` and ``extra`` are a table's (``--metadata``, ``MetadataRow``): ``extra`` is
None for a file listed from the tree alone, a tuple (empty perhaps) for a table's row;
``labels`` is None but for a multi-label table's row. ``stamp``: the walk's (``walk.Stamp``).
"""
RankedRow = tuple[int, str, int | None, str | int, str, int, tuple[str, ...] | None, tuple[Any, ...] | None,
                  str | None]
"""A ``ListedRow`` while ``Selection`` ranks its label, placed by ``Placed``:
``(order_key, relpath, cap_hash, split, label, size, labels, extra, stamp)``.

``cap_hash`` is None without ``--max_per_class``; ``split`` is the row's split, or,
stratified, its split hash (an int), compared with its label's threshold.
"""


def validation_count(files: int, percent: float) -> int:
    """A stratified label's validation images: ``round(percent of files)``, halves rounded up, and at
    least one image left for training (a label of one file gives none)."""
    return max(0, min(math.floor(files * percent / 100 + 0.5), files - 1))


def thresholds(ranked: Iterable[tuple[int, int]], quota: Sequence[int]) -> tuple[dict[int, int], dict[int, int]]:
    """Each label's ``quota``-th hash in ``ranked``'s order (for the labels with a quota), and how many
    of its rows hash no higher: the quota, or more where hashes tie at the threshold.

    Args:
      ranked: ``(hash, label id)`` rows, sorted.
      quota: how many rows each label takes, by label id.
    """
    taken = [0] * len(quota)
    found: dict[int, int] = {}
    chosen: dict[int, int] = {}
    for h, label in ranked:
        place = taken[label] + 1
        taken[label] = place
        if place == quota[label]:
            found[label] = h
            chosen[label] = place
        elif place > quota[label] and found.get(label) == h:
            chosen[label] += 1
    return found, chosen


class Placed:
    """The listing's rows read back in order-key order, each placed by its label's thresholds.

    Each ``RankedRow`` is dropped past its label's cap threshold, and, stratified, put in
    validation up to its split threshold: what comes out is ``ListedRow``s.
    """

    def __init__(self, rows: Iterable[RankedRow], kept: Mapping[str, Threshold] | None,
                 validation: Mapping[str, int] | None) -> None:
        self._rows = rows
        self._kept = kept
        self._validation = validation

    def __iter__(self) -> Iterator[ListedRow]:
        kept, validation = self._kept, self._validation
        for order_key, relpath, cap_hash, split, label, size, labels, extra, stamp in self._rows:
            if kept is not None:
                last = kept.get(label)
                if last is not None and (cap_hash, relpath) > last:
                    continue
            if validation is not None:
                top = validation.get(label)
                split = VALIDATION_SPLIT if top is not None and split <= top else DEFAULT_SPLIT
            yield order_key, relpath, split, label, size, labels, extra, stamp


class Chosen(NamedTuple):
    """What the listing keeps: its rows, in order-key order, and their counts."""

    files: Iterable[ListedRow]
    split_counts: collections.Counter[str]  # split -> rows whose labels are all known
    unknown: int  # rows with a label missing from --labels_file, or none
    total_bytes: int  # of every row kept, unknown labels included


class Selection:
    """The listing's rows on their way to its spill: passed straight through, or ranked per label.

    The listing asks ``split`` for a file's hashed split and ``add``s each row; ``finish``
    gives what is kept. Without ``stratify`` or ``max_per_class`` nothing is ranked.

    Args:
      folder: where the rows spill.
      expected_rows: about how many rows will be added (sizes the spills' buckets).
      validation_percent: ``--validation_percent``.
      stratify: ``--stratify``: each label's validation share is dealt in ``finish``.
      max_per_class: ``--max_per_class``, or None.
      held: records each label holds already (an append's dataset), counted against ``max_per_class``.
    """

    def __init__(self, folder: SpillFolder, expected_rows: int, validation_percent: float = 0.0,
                 stratify: bool = False, max_per_class: int | None = None,
                 held: Mapping[str, int] | None = None) -> None:
        self._folder = folder
        self._percent = validation_percent
        self._stratify = stratify
        self._cap = max_per_class
        self._held = dict(held or {})
        self.active = stratify or max_per_class is not None
        self.added = 0
        self._files = SortedSpill(folder, "files", expected_rows)
        # Sorted as tuples: ties in the hash broken by path.
        self._ranked = SortedSpill(folder, "ranked", expected_rows, None) if self.active else None
        self._ids: dict[str, int] = {}  # label -> its index in the lists below
        self._labels: list[str] = []
        self._files_per_label: list[int] = []
        self._known: list[bool] = []  # rows are single-label here: a label's rows are all known or not
        self._split_counts: collections.Counter[str] = collections.Counter()
        self._unknown = self._bytes = 0

    def check_single_label(self, where: str) -> None:
        """Refuses ranking multi-label rows: which label would a capped or stratified file count under?

        Raises:
          OptionsError: naming the flag and the table.
        """
        if self.active:
            flag = "--stratify" if self._stratify else "--max_per_class"
            raise OptionsError(f"{flag} works per label, and --metadata {where} gives images several "
                               f"(a labels column): drop {flag}")

    def split(self, relpath: str) -> str | None:
        """A file's split where the tree and table give none; None where ``add`` hashes it (ranked)."""
        return None if self.active else split_for(relpath, self._percent)

    def add(self, row: ListedRow, known: bool) -> None:
        """One listed file; ``known``: its labels are all in the label list (else it is reported)."""
        self.added += 1
        order_key, relpath, split, name, size, labels, extra, stamp = row
        if self._ranked is None:
            self._count(split, known, size)
            self._files.add(row)
            return
        label = self._ids.get(name)
        if label is None:
            label = self._ids[name] = len(self._labels)
            self._labels.append(name)
            self._files_per_label.append(0)
            self._known.append(known)
        self._files_per_label[label] += 1
        cap_hash = None
        if split is None:  # hashed here: one SHA-256 for the split hash and the cap hash
            split, cap_hash = split_and_cap_hashes(relpath)
            if not self._stratify:
                split = hashed_split(split, self._percent)
        elif self._stratify:
            raise ValueError(f"{relpath} has its split ({split}): stratified splits are hashed")
        if self._cap is None:
            self._ranked.add((split, label))
            self._bytes += size
        else:
            if cap_hash is None:  # a split the tree or table gives
                cap_hash = split_and_cap_hashes(relpath)[1]
            self._ranked.add((cap_hash, relpath, label, size, split))
        self._files.add((order_key, relpath, cap_hash, split, name, size, labels, extra, stamp))

    def finish(self, skip: Callable[[str, str], None]) -> Chosen:
        """The rows kept, each in its split; ``skip(relpath, reason)`` is called for each one left out."""
        if self._ranked is None:
            return Chosen(self._files, self._split_counts, self._unknown, self._bytes)
        kept, ranked, files = None, self._ranked, self._files_per_label
        if self._cap is not None:
            kept, ranked, files = self._capped(skip)
        validation = self._stratified(ranked, files) if self._stratify else None
        self._ranked = None
        return Chosen(Placed(self._files, kept, validation), self._split_counts, self._unknown, self._bytes)

    def _capped(self, skip: Callable[[str, str], None]) -> tuple[dict[str, Threshold], Iterable[tuple], list[int]]:
        """Each label's first files by cap hash kept and counted, up to ``max_per_class`` less the
        records it holds already; the rest skipped.

        Returns each capped label's threshold, and, stratified, the kept files ranked by split
        hash with their count per label.
        """
        assert self._ranked is not None and self._cap is not None
        caps = [max(0, self._cap - self._held.get(name, 0)) for name in self._labels]
        ranked = SortedSpill(self._folder, "stratified", sum(map(min, self._files_per_label, caps)),
                             None) if self._stratify else None
        taken = [0] * len(self._labels)
        # A label full already keeps none: a threshold below every (cap hash, path).
        kept: dict[str, Threshold] = {name: _NONE_KEPT for name, cap in zip(self._labels, caps) if not cap}
        for h, relpath, label, size, split in self._ranked:
            place = taken[label]
            if place == caps[label]:
                skip(relpath, SKIP_OVER_CAP)
                continue
            taken[label] = place + 1
            if place + 1 == caps[label]:
                kept[self._labels[label]] = (h, relpath)
            self._bytes += size
            if ranked is not None:
                ranked.add((split, label))
            else:
                self._count(split, self._known[label], 0)
        return kept, ranked if ranked is not None else (), taken

    def _stratified(self, ranked: Iterable[tuple[int, int]], files: Sequence[int]) -> dict[str, int]:
        """Each label's validation threshold, by label name; the splits counted."""
        found, chosen = thresholds(ranked, [validation_count(n, self._percent) for n in files])
        for label, n in enumerate(files):
            known, validation = self._known[label], chosen.get(label, 0)
            if validation:
                self._count(VALIDATION_SPLIT, known, 0, validation)
            if n > validation:
                self._count(DEFAULT_SPLIT, known, 0, n - validation)
        return {self._labels[label]: h for label, h in found.items()}

    def _count(self, split: str, known: bool, size: int, n: int = 1) -> None:
        if known:
            self._split_counts[split] += n
        else:
            self._unknown += n
        self._bytes += size
