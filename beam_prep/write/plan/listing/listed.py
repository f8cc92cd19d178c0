"""A listed tree as the launcher holds it: labels, splits and counts in memory, its files and
skipped files on disk (``spill``), read back in order.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Collection, Iterable, Iterator, Mapping

from beam_prep import wording
from beam_prep.io.storage import join
from beam_prep.model.features import NO_LABEL
from beam_prep.write.plan.listing.names import split_rank
from beam_prep.write.plan.metadata import Table
from beam_prep.write.plan.selection import ListedRow, Selection
from beam_prep.write.shared.entry import UNKNOWN_LABEL, FileEntry, printable
from beam_prep.write.shared.spill import SortedRows, SpillFolder

__all__ = ["Choice", "Listing", "Skips", "make_listing"]

_LOG = logging.getLogger(__name__)


class Listing:
    """A listed tree: its labels, splits and counts in memory, its files on disk.

    ``entries()`` reads the files back in order-key order, the order the
    streaming sink deals them to shards in. Close it (or use it in a ``with``)
    to remove its temporary folder at once; it goes when collected otherwise.
    With ``--metadata``, ``table`` is the table read, and its rows' labels and
    extra columns ride with the files.
    """

    def __init__(self, root: str, labels: list[str], splits: list[str], split_counts: dict[str, int],
                 unknown_labels: int, total_bytes: int, skips: Skips, folder: SpillFolder, files: Iterable[ListedRow],
                 label_offset: int, table: Table | None = None, unlabelled: bool = False) -> None:
        self.root = root
        self.labels = labels
        self.unlabelled = unlabelled
        """A dataset without labels (a table without a label column over images in no label
        folder): ``labels`` is empty, and each image is written with ``NO_LABEL``."""
        self.splits = splits
        self.total_bytes = total_bytes  # of every listed image, unknown labels included
        self.unknown_labels = unknown_labels
        """Images under a label missing from ``labels`` (``--labels_file``), or with none: each is
        reported, never written."""
        self._split_counts = split_counts  # split -> images with known labels
        self._skips = skips
        self._folder = folder
        self._files = files
        self._table = table
        self._ids = {name: i + label_offset for i, name in enumerate(labels)}
        self.carried: dict[str, str] = {}
        """Files the run's folder gets beside its listings, by name -> local path in ``folder`` (an
        append's kept hash files of the versions read from their shards: ``grow.existing``)."""

    @property
    def folder(self) -> SpillFolder:
        """The listing's temporary folder, removed with it."""
        return self._folder

    @property
    def multi_label(self) -> bool:
        """Whether each image has a list of labels (a ``labels`` column in ``--metadata``)."""
        return self._table is not None and self._table.multi_label

    @property
    def extra_features(self) -> dict[str, str]:
        """The table's extra columns: feature key -> kind (bytes, int64 or float)."""
        return self._table.feature_kinds() if self._table is not None else {}

    @property
    def listed(self) -> int:
        """Images listed, those with a label missing from ``labels`` included."""
        return sum(self._split_counts.values()) + self.unknown_labels

    @property
    def skipped_count(self) -> int:
        return sum(self._skips.by_reason.values())

    def entries(self) -> Iterator[FileEntry]:
        """Every listed image, in order-key order, read back from disk."""
        root, ids, table = self.root, self._ids, self._table
        for _, relpath, split, label, size, labels, extra, stamp in self._files:
            if extra is None:  # a file listed from the tree alone
                yield FileEntry(f"{root}/{relpath}", relpath, split, label, ids.get(label, UNKNOWN_LABEL), size,
                                stamp=stamp)
                continue
            label_ids = None
            if self.unlabelled:
                label_id = NO_LABEL
            elif labels is None:
                label_id = ids.get(label, UNKNOWN_LABEL)
            else:
                label_ids = tuple(ids.get(name, UNKNOWN_LABEL) for name in labels)
                label_id = label_ids[0] if label_ids and UNKNOWN_LABEL not in label_ids else UNKNOWN_LABEL
            # A table's row always carries its features, none perhaps: reports then say "label", not "label folder".
            yield FileEntry(f"{root}/{relpath}", relpath, split, label, label_id, size, labels, label_ids,
                            table.features(extra), stamp)

    def rows(self) -> Iterator[ListedRow]:
        """Every listed image as the listing holds it (``ListedRow``: its full path is ``root`` and its
        relative path), in order-key order: a pass over millions that needs no ``FileEntry`` of most
        (an append's, whose files the dataset mostly holds already)."""
        return iter(self._files)

    def add_skip(self, relpath: str, reason: str) -> None:
        """Passes over a listed file after all (an append's copy of a record already in the dataset):
        named in the skipped files with ``reason``. Call it before ``narrowed`` leaves the file out."""
        self._skips.add(relpath, reason)

    def leave_out_skips(self, paths: Collection[str]) -> int:
        """Passes over the skipped files whose full path, as skipped.jsonl names it, is in ``paths`` (an
        append's files skipped in an earlier version, which the dataset's report names already): they are
        no longer this listing's skipped files. Returns how many were left out."""
        if not paths:
            return 0
        kept, left_out = Skips(SortedRows(self._folder, "skipped-anew")), 0
        for relpath, reason in self._skips.rows:
            if printable(join(self.root, relpath)) in paths:
                left_out += 1
            else:
                kept.add(relpath, reason)
        self._skips = kept
        return left_out

    def narrowed(self, keep: Iterable[ListedRow], labels: list[str], label_offset: int,
                 choice: Choice | None = None) -> Listing:
        """The listing of the files of ``keep`` alone (rows of this listing, ``rows``), with ``labels`` for its
        label order (every label of this listing among them), its skipped files those of this one.
        Held in memory (an append's new files); this listing's folder stays this one's to close.

        With ``choice``, ``--stratify`` and ``--max_per_class`` choose among those files alone
        (``selection``): each label's validation share is of its files here, and its cap counts the
        records it holds already (``Choice.held``); the files past it are skipped.
        """
        rows = list(keep)
        ids = {name: i for i, name in enumerate(labels)}
        if choice is not None and (choice.stratify or choice.max_per_class is not None):
            rows = self._chosen(rows, ids, choice)
        known = collections.Counter(row[2] for row in rows if self.unlabelled or _known(row, ids))
        sizes = sum(row[4] for row in rows)
        return Listing(self.root, labels, [s for s in self.splits if known[s]], dict(known),
                       len(rows) - sum(known.values()), sizes, self._skips, self._folder, rows, label_offset,
                       self._table, self.unlabelled)

    def _chosen(self, rows: list[ListedRow], ids: dict[str, int], choice: Choice) -> list[ListedRow]:
        """``rows`` as ``Selection`` keeps and places them (a stratified row's split hashed again)."""
        folder = SpillFolder()
        try:
            selection = Selection(folder, len(rows), choice.validation_percent, choice.stratify,
                                  choice.max_per_class, choice.held)
            for row in rows:
                split = None if choice.stratify else row[2]
                selection.add((*row[:2], split, *row[3:]), self.unlabelled or _known(row, ids))
            return list(selection.finish(self._skips.add).files)
        finally:
            folder.close()

    def skipped_rows(self) -> Iterator[tuple[str, str]]:
        """Every skipped file as (printable relative path, why), sorted by path, read back from disk."""
        return iter(self._skips.rows)

    @property
    def skipped(self) -> dict[str, str]:
        """``skipped_rows`` as a dict, in memory: for small trees."""
        return dict(self.skipped_rows())

    def skipped_by_reason(self) -> dict[str, int]:
        return dict(sorted(self._skips.by_reason.items()))

    def split_counts(self) -> dict[str, int]:
        """Images per split, those with a known label alone."""
        return dict(self._split_counts)

    def close(self) -> None:
        self._folder.close()

    def __enter__(self) -> Listing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _known(row: ListedRow, ids: dict[str, int]) -> bool:
    """Whether every label of a listed row is one of ``ids`` (a row of a table without one is not)."""
    _, _, _, label, _, labels, _, _ = row
    return all(name in ids for name in labels) if labels is not None else label in ids


@dataclasses.dataclass(frozen=True)
class Choice:
    """How ``Listing.narrowed`` chooses among its files: ``--stratify``, ``--max_per_class`` and the
    records each label holds already (``held``, counted against the cap)."""

    validation_percent: float = 0.0
    stratify: bool = False
    max_per_class: int | None = None
    held: Mapping[str, int] = dataclasses.field(default_factory=dict)


class Skips:
    """Skipped files: counted by reason in memory, their paths on disk, read back sorted."""

    def __init__(self, rows: SortedRows) -> None:
        self.rows = rows
        self.by_reason: collections.Counter[str] = collections.Counter()
        self.example: dict[str, str] = {}  # reason -> its first path by name

    def add(self, relpath: str, reason: str) -> None:
        shown = printable(relpath)
        self.rows.append((shown, reason))
        self.by_reason[reason] += 1
        if reason not in self.example or shown < self.example[reason]:
            self.example[reason] = shown


def make_listing(root: str, names: list[str], split_counts: collections.Counter[str], unknown: int,
                 total_bytes: int, skips: Skips, folder: SpillFolder, files: Iterable[ListedRow], label_offset: int,
                 table: Table | None = None, unlabelled: bool = False) -> Listing:
    """The ``Listing``, its skipped files logged by reason."""
    splits = sorted(split_counts, key=split_rank)
    for reason, n in sorted(skips.by_reason.items()):  # the summary and the manifest count them too
        _LOG.info("skipped %s: %s (e.g. %s)", wording.count(n, "file"), reason, skips.example[reason])
    return Listing(root, names, splits, dict(split_counts), unknown, total_bytes, skips, folder, files,
                   label_offset, table, unlabelled)
