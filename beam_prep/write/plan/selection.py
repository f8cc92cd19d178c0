"""Choices the listing makes per label once it has seen every file: ``--max_per_class`` and ``--stratify``.

By ``--validation_percent`` alone a file's split is a pure function of its path
(``hashing.split_for``), so a label of 12 images gets 0 or 3 validation images by
chance. Stratified, each label gets ``validation_count(n, percent)``: its files of
lowest split hash (the hash ``split_for`` compares with the percent, so turning
``--stratify`` on moves few files). Capped, each label keeps the ``max_per_class``
files of lowest cap hash (another salt: the kept files' splits stay a fair draw).

Both need a label's count before any of its files is placed, so the listing's rows
go to a spill keyed by the hash (ties broken by path) and come back in hash order,
where each label's first files take its places: memory holds a few counters per
label however many files. The same tree gives the same choice on every run, and a
resumed run reuses the listing its first run made.
"""
from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from beam_prep.errors import OptionsError
from beam_prep.write.plan.hashing import split_for, stable_hash
from beam_prep.write.plan.spill import SortedSpill, SpillFolder
from beam_prep.write.shared.entry import DEFAULT_SPLIT, VALIDATION_SPLIT

__all__ = ["SKIP_OVER_CAP", "Chosen", "Selection", "capped", "stratified", "validation_count"]

SKIP_OVER_CAP = "over --max_per_class"  # skipped.jsonl's reason for a file past its label's cap
CAP_SALT = "cap"
SPLIT_SALT = "split"  # split_for's: a stratified label's validation files are those of lowest split hash
# A ranked row is (hash, relpath, row, known): sorted as a tuple, ties in the hash broken by path.
_BY_RANK = None

Row = tuple  # a listing row: (order key, relpath, split, label, size, *table fields)
Ranked = tuple[int, str, Row, bool]


def validation_count(files: int, percent: float) -> int:
    """A stratified label's validation images: ``round(percent of files)``, halves rounded up, and at
    least one image left for training (a label of one file gives none)."""
    return max(0, min(math.floor(files * percent / 100 + 0.5), files - 1))


def capped(ranked: Iterable[Ranked], cap: int, skip: Callable[[str, str], None]) -> Iterator[tuple[Row, bool]]:
    """Each label's first ``cap`` rows in rank order; the others are ``skip``-ped (``SKIP_OVER_CAP``)."""
    taken: collections.Counter[str] = collections.Counter()
    for _, relpath, row, known in ranked:
        label = row[3]
        if taken[label] >= cap:
            skip(relpath, SKIP_OVER_CAP)
            continue
        taken[label] += 1
        yield row, known


def stratified(ranked: Iterable[Ranked], files: collections.Counter[str],
               percent: float) -> Iterator[tuple[Row, bool]]:
    """Every row, each label's first ``validation_count(files[label], percent)`` in rank order in
    validation and the rest in train."""
    quota = {label: validation_count(n, percent) for label, n in files.items()}
    taken: collections.Counter[str] = collections.Counter()
    for _, _, row, known in ranked:
        label = row[3]
        place = taken[label]
        taken[label] = place + 1
        yield (*row[:2], VALIDATION_SPLIT if place < quota[label] else DEFAULT_SPLIT, *row[3:]), known


class Chosen(NamedTuple):
    """What the listing keeps: its rows, in order-key order on disk, and their counts."""

    files: SortedSpill
    split_counts: collections.Counter[str]  # split -> rows whose labels are all known
    unknown: int  # rows with a label missing from --labels_file, or none
    total_bytes: int  # of every row kept, unknown labels included


class Selection:
    """The listing's rows on their way to its spill: passed straight through, or ranked per label.

    The listing asks ``split`` for a file's hashed split and ``add``s each row; ``finish``
    gives what is kept. Without ``stratify`` or ``max_per_class`` nothing is ranked and no
    row is held back.

    Args:
      folder: where the rows spill.
      expected_rows: about how many rows will be added (sizes the spills' buckets).
      validation_percent: ``--validation_percent``.
      stratify: ``--stratify``: each label's validation share is dealt in ``finish``.
      max_per_class: ``--max_per_class``, or None.
    """

    def __init__(self, folder: SpillFolder, expected_rows: int, validation_percent: float = 0.0,
                 stratify: bool = False, max_per_class: int | None = None) -> None:
        self._folder = folder
        self._percent = validation_percent
        self._stratify = stratify
        self._cap = max_per_class
        self.active = stratify or max_per_class is not None
        self.added = 0
        self._files_per_label: collections.Counter[str] = collections.Counter()
        self._ranked = SortedSpill(folder, "ranked", expected_rows, _BY_RANK) if self.active else None
        self._salt = CAP_SALT if max_per_class is not None else SPLIT_SALT
        self._kept = SortedSpill(folder, "files", expected_rows)
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

    def split(self, relpath: str) -> str:
        """A file's split where the tree and table give none; stratified, a stand-in ``finish`` replaces."""
        return DEFAULT_SPLIT if self._stratify else split_for(relpath, self._percent)

    def add(self, row: Row, known: bool) -> None:
        """One listed file; ``known``: its labels are all in the label list (else it is reported)."""
        self.added += 1
        if self._ranked is None:
            self._keep(row, known)
            return
        self._files_per_label[row[3]] += 1
        self._ranked.add((stable_hash(row[1], self._salt), row[1], row, known))

    def finish(self, skip: Callable[[str, str], None]) -> Chosen:
        """The rows kept, each in its split; ``skip(relpath, reason)`` is called for each one left out."""
        if self._ranked is not None:
            for row, known in self._chosen(skip):
                self._keep(row, known)
            self._ranked = None
        return Chosen(self._kept, self._split_counts, self._unknown, self._bytes)

    def _chosen(self, skip: Callable[[str, str], None]) -> Iterator[tuple[Row, bool]]:
        assert self._ranked is not None
        if self._cap is None:
            yield from stratified(self._ranked, self._files_per_label, self._percent)
            return
        rows = capped(self._ranked, self._cap, skip)
        if not self._stratify:
            yield from rows
            return
        # Capped, then stratified among the files kept, by their split hash.
        kept = SortedSpill(self._folder, "stratified", sum(min(n, self._cap) for n in self._files_per_label.values()),
                           _BY_RANK)
        kept_per_label: collections.Counter[str] = collections.Counter()
        for row, known in rows:
            kept_per_label[row[3]] += 1
            kept.add((stable_hash(row[1], SPLIT_SALT), row[1], row, known))
        yield from stratified(kept, kept_per_label, self._percent)

    def _keep(self, row: Row, known: bool) -> None:
        if known:
            self._split_counts[row[2]] += 1
        else:
            self._unknown += 1
        self._bytes += row[4]
        self._kept.add(row)
