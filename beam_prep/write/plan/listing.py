"""Listing an image tree: which files, which label, which split, in which order.

Runs in the launching process, before the pipeline: the label map, the split
layout, the shard count and every fail-fast check need the whole listing:
folders listed concurrently on GCS, ``os.scandir`` on local disk. Every
decision here is a pure function of a file's path relative to the root (and,
with ``--metadata``, of its row in the table: ``metadata``), so reruns and
workers agree without coordination; ``--stratify`` and ``--max_per_class`` rank
each label's files by such a hash (``selection``), a pure function of the tree.

The launcher holds counts and labels, never the files: they stream to a
temporary folder (``spill``) and come back in order-key order, so a tree of
millions of files lists in flat memory.
"""
from __future__ import annotations

import collections
import logging
import os
from collections.abc import Iterable, Iterator, Sequence

from apache_beam.io.filesystems import FileSystems

from beam_prep import wording
from beam_prep.errors import OptionsError
from beam_prep.io.storage import is_local, join, storage_error
from beam_prep.model.features import NO_LABEL
from beam_prep.write.images.imaging import is_image_name
from beam_prep.write.plan.metadata import (
    PARQUET_TABLE_NAME,
    SPLIT_TABLE_NAMES,
    Table,
    combine_tables,
    read_table,
)
from beam_prep.write.plan.selection import ListedRow, Selection
from beam_prep.write.plan.spill import RowFile, SortedRows, SpillFolder
from beam_prep.write.plan.walk import walk_tree
from beam_prep.write.shared.entry import UNKNOWN_LABEL, FileEntry, printable
from beam_prep.write.shared.hashing import order_key, split_for, stable_hash  # noqa: F401 - imported from here

_LOG = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "validation", "val", "test")
# Folders and files that operating systems, archivers and notebooks leave in a tree;
# skipped wherever they are, as are names starting with a dot.
JUNK_NAMES = frozenset({"__MACOSX", "@eaDir", "Thumbs.db", "desktop.ini", "$RECYCLE.BIN",
                        "System Volume Information", "lost+found"})

# Why a file was skipped: the manifest counts each reason (walk.py has the walk's own two).
SKIP_HIDDEN = "hidden or system file"
SKIP_NOT_IMAGE = "not an image file"
SKIP_DEPTH = "image outside the label folders"
SKIP_NO_ROW = "image no --metadata row names"
_WALKED_ALL = (None, 0, None)  # the walk's (relpath, size, reason) once every file is merged with the table


class Listing:
    """A listed tree: its labels, splits and counts in memory, its files on disk.

    ``entries()`` reads the files back in order-key order, the order the
    streaming sink deals them to shards in. Close it (or use it in a ``with``)
    to remove its temporary folder at once; it goes when collected otherwise.
    With ``--metadata``, ``table`` is the table read, and its rows' labels and
    extra columns ride with the files.
    """

    def __init__(self, root: str, labels: list[str], splits: list[str], split_counts: dict[str, int],
                 unknown_labels: int, total_bytes: int, skips: _Skips, folder: SpillFolder, files: Iterable[ListedRow],
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
        for _, relpath, split, label, size, labels, extra in self._files:
            if extra is None:  # a file listed from the tree alone
                yield FileEntry(f"{root}/{relpath}", relpath, split, label, ids.get(label, UNKNOWN_LABEL), size)
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
                            table.features(extra))

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


class _Skips:
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


def _is_junk(part: str) -> bool:
    return part.startswith(".") or part in JUNK_NAMES


def check_label_name(name: str, where: str, what: str = "label folder") -> None:
    """Refuses a label name that labels.txt (one label a line, the line number its id) cannot hold.

    ``what`` and ``where`` name it in the message: a label folder and its path, or
    (``WriteImageDataset``) a label given in ``labels`` and the label itself.

    Raises:
      OptionsError: naming the label and what to change.
    """
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise OptionsError(f"{what} {printable(where)} has a name that is not UTF-8: "
                           "labels.txt and the records hold label names as UTF-8; rename it") from None
    if name.splitlines() != [name] or name.strip() != name:
        raise OptionsError(f"{what} {where!r} has a line break or edge spaces in its name: "
                           "labels.txt holds one label a line, its line number the id; rename it")


def list_tree(
    root: str,
    *,
    validation_percent: float = 0.0,
    labels: Sequence[str] | None = None,
    label_offset: int = 0,
    recursive: bool = False,
    metadata: str | None = None,
    stratify: bool = False,
    max_per_class: int | None = None,
) -> Listing:
    """Lists ``root/<label>/<file>`` or ``root/<split>/<label>/<file>``, or the files a table names.

    Every file found ends in the listing or in ``skipped`` with its reason (hidden
    and system files, not images, outside a label folder, special files).

    Args:
      root: local path or gs:// prefix.
      validation_percent: share of files put in "validation" when the tree has no splits.
      labels: the label order (from --labels_file); by default the sorted folder names.
        Files under a folder not in it are kept with ``label_id == UNKNOWN_LABEL`` so the
        pipeline reports them instead of dropping them.
      label_offset: added to each label's index to give its ``label_id``, the id stored in
        the records (``--label_offset``).
      recursive: images at any depth under a label folder take that folder's label
        (``--recursive``), as Keras's ``image_dataset_from_directory`` reads them.
      metadata: a table (``--metadata``, see ``metadata``) that names each image and
        says its label(s), split and other fields; files under ``root`` that no row
        names are skipped, and a row whose file is missing is listed, to fail its read.
      stratify: each label gets its own ``validation_percent`` share of the files whose
        split is hashed (``selection``).
      max_per_class: the most files each label keeps (``selection``); the rest are skipped.
        Without ``metadata``, a ``metadata.jsonl`` or ``metadata.csv`` in each split folder
        (Hugging Face's imagefolder layout, ``find_split_tables``) is read the same way.

    Raises:
      OptionsError: an empty tree, a split tree with ``validation_percent``, a
        label folder name that labels.txt cannot hold, a table ``metadata`` refuses,
        ``stratify`` or ``max_per_class`` with a multi-label table or one without labels,
        or tables that would mix splits silently (a split folder without its table
        beside one with, a table naming split folders' images without a split column).
      StorageError: the root or a folder under it cannot be listed.
    """
    root = root.rstrip("/")
    split_tables = find_split_tables(root)
    if split_tables and metadata is not None:
        raise OptionsError(f"--metadata {metadata} given, but {', '.join(path for _, path in split_tables)} "
                           "also found: drop --metadata to read the table in each split folder, or remove those")
    if split_tables and recursive:
        raise OptionsError(f"{root} has a table in each split folder, which names each image wherever it is: "
                           "drop --recursive")
    folder = SpillFolder()
    try:
        if metadata is not None or split_tables:
            return _list_table(root, folder, validation_percent, labels, label_offset, metadata, split_tables,
                               stratify, max_per_class)
        return _list(root, folder, validation_percent, labels, label_offset, recursive, stratify, max_per_class)
    except BaseException:
        folder.close()
        raise


def _list(root: str, folder: SpillFolder, validation_percent: float, labels: Sequence[str] | None,
          label_offset: int, recursive: bool, stratify: bool = False, max_per_class: int | None = None) -> Listing:
    """``list_tree`` in two passes over disk, since the split layout is known only once every file is seen."""
    skips = _Skips(SortedRows(folder, "skipped"))
    images, split_layout = _first_pass(root, folder, validation_percent, skips, recursive)

    depth = 3 if split_layout else 2
    choice = Selection(folder, images.count, validation_percent, stratify, max_per_class)
    known = set(labels) if labels is not None else None
    label_folders: dict[str, str] = {}
    for relpath, size in images:
        parts = relpath.split("/")
        if (len(parts) < depth if recursive else len(parts) != depth) or (
                split_layout and parts[0] not in SPLIT_NAMES):
            skips.add(relpath, SKIP_DEPTH)
            continue
        split = parts[0] if split_layout else choice.split(relpath)
        label = parts[depth - 2]  # the top label folder, however deep the image (--recursive)
        if label not in label_folders:
            label_folders[label] = "/".join(parts[:depth - 1])
            check_label_name(label, join(root, label_folders[label]))
        choice.add((order_key(relpath), relpath, split, label, size, None, None), known is None or label in known)

    if not choice.added:
        layout = "ROOT/<label>/<image> or ROOT/<split>/<label>/<image>"
        raise OptionsError(
            f"no images under {root}: expected {layout} with image files "
            f"({sum(skips.by_reason.values())} other files skipped)")

    names = list(labels) if labels is not None else sorted(label_folders)
    chosen = choice.finish(skips.add)
    return _listing(root, names, chosen.split_counts, chosen.unknown, chosen.total_bytes, skips, folder,
                    chosen.files, label_offset)


def _listing(root: str, names: list[str], split_counts: collections.Counter[str], unknown: int, total_bytes: int,
             skips: _Skips, folder: SpillFolder, files: Iterable[ListedRow], label_offset: int,
             table: Table | None = None, unlabelled: bool = False) -> Listing:
    """The ``Listing``, its skipped files logged by reason."""
    splits = sorted(split_counts, key=_split_rank)
    for reason, n in sorted(skips.by_reason.items()):  # the summary and the manifest count them too
        _LOG.info("skipped %s: %s (e.g. %s)", wording.count(n, "file"), reason, skips.example[reason])
    return Listing(root, names, splits, dict(split_counts), unknown, total_bytes, skips, folder, files,
                   label_offset, table, unlabelled)


def find_split_tables(root: str) -> list[tuple[str, str]]:
    """The table in each split folder, as Hugging Face's imagefolder finds them: (split, path),
    in the folders' name order (the order ``metadata.combine_tables`` needs).

    Raises:
      OptionsError: a split folder with two tables, or only a ``metadata.parquet``.
    """
    found = []
    for split in sorted(SPLIT_NAMES):
        paths = [join(root, split, name) for name in (*SPLIT_TABLE_NAMES, PARQUET_TABLE_NAME)]
        present = [path for path in paths if _is_file(path)]
        if len(present) > 1:
            raise OptionsError(f"{join(root, split)} holds {' and '.join(p.rsplit('/', 1)[1] for p in present)}: "
                               "keep one table a split folder")
        if present and present[0].endswith(PARQUET_TABLE_NAME):
            raise OptionsError(f"{present[0]}: beam-prep reads CSV, TSV and JSON Lines tables: save it as "
                               f"{' or '.join(SPLIT_TABLE_NAMES)}")
        found += [(split, path) for path in present]
    return found


def _is_file(path: str) -> bool:
    """Whether ``path`` is a file (an object, on gs://).

    Raises:
      StorageError: the filesystem cannot say (a missing bucket, no permission).
    """
    if is_local(path):
        return os.path.isfile(path)
    try:
        return FileSystems.exists(path)
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("stat", path, e) from e


def _read_tables(root: str, folder: SpillFolder, validation_percent: float, metadata: str | None,
                 split_tables: list[tuple[str, str]]) -> Table:
    """``--metadata``'s table, or the tables of each split folder as one; refused with
    ``--validation_percent`` where each image's split is given."""
    if metadata is not None:
        table = read_table(metadata, folder, SPLIT_NAMES)
        if table.has_split and validation_percent:
            raise OptionsError(f"--metadata {metadata} has a split column, which puts each image in its split: "
                               "drop --validation_percent")
        if not table.count:
            raise OptionsError(f"--metadata {metadata} has no rows: it needs one row per image")
        return table
    if validation_percent:
        raise OptionsError(f"{root} already has split folders ({', '.join(split for split, _ in split_tables)}), "
                           "each with its table; drop --validation_percent")
    tables = [read_table(path, folder, SPLIT_NAMES, split_folder=split) for split, path in split_tables]
    if not sum(table.count for table in tables):
        raise OptionsError(f"--metadata {', '.join(path for _, path in split_tables)} have no rows: "
                           "they need one row per image")
    return combine_tables(tables)


def _list_table(root: str, folder: SpillFolder, validation_percent: float, labels: Sequence[str] | None,
                label_offset: int, path: str | None, split_tables: list[tuple[str, str]], stratify: bool = False,
                max_per_class: int | None = None) -> Listing:
    """``list_tree`` with ``--metadata`` or split folders' tables: the table and the walk, each
    sorted by path on disk, merged.

    A file no row names is skipped (for its own reason, or ``SKIP_NO_ROW``); a row
    whose file the walk did not find is listed all the same, so its read fails and
    errors.jsonl names it; a row naming what the walk passes over (a pipe, a device)
    leaves it skipped, for its reason. Without a label column, an image's label is
    its folder below the split folder (below ``--input`` without split folders); where
    no image is in such a folder, the dataset has no labels (``Listing.unlabelled``).
    """
    table = _read_tables(root, folder, validation_percent, path, split_tables)
    walked = SortedRows(folder, "walked")  # (relpath, size, reason) of each file, by path
    prefix = len(root) + 1
    for file_path, size, reason in walk_tree(root):
        if file_path.startswith(root + "/"):
            walked.append((file_path[prefix:], size, reason))

    skips = _Skips(SortedRows(folder, "skipped"))
    choice = Selection(folder, table.count, validation_percent, stratify, max_per_class)
    if table.multi_label:
        choice.check_single_label(table.path)
    known = set(labels) if labels is not None else None
    with_tables = {split for split, _ in split_tables}
    untabled: dict[str, str] = {}  # split folder without a table -> an image in it
    seen: set[str] = set()
    listed: collections.Counter[str] = collections.Counter()  # every row, by split: a dataset without labels
    found = iter(walked)
    walked_path, walked_size, walked_reason = next(found, _WALKED_ALL)

    def skip(relpath: str, reason: str | None) -> None:
        why = _unnamed_reason(relpath, reason)
        top = relpath.split("/", 1)[0]
        if why == SKIP_NO_ROW and with_tables and top in SPLIT_NAMES and top not in with_tables:
            untabled.setdefault(top, relpath)
        skips.add(relpath, why)

    for file_name, line, label, row_labels, split, extra in table.rows():  # a MetadataRow's fields
        while walked_path is not None and walked_path < file_name:
            skip(walked_path, walked_reason)
            walked_path, walked_size, walked_reason = next(found, _WALKED_ALL)
        size = 0  # a file the walk did not find: listed, and its read fails
        if walked_path == file_name:
            size, reason = walked_size, walked_reason
            walked_path, walked_size, walked_reason = next(found, _WALKED_ALL)
            if reason is not None:  # a pipe or device (reading it could block forever): skipped all the same
                skips.add(file_name, reason)
                continue
        if split is None:
            _check_no_split_folder(table, file_name, line)
        if not table.has_label:
            label = _label_folder(root, file_name, split is not None)
        names = row_labels if row_labels is not None else ((label,) if label else ())
        seen.update(names)
        split = split or choice.split(file_name)
        if split is not None:
            listed[split] += 1
        choice.add((order_key(file_name), file_name, split, label, size, row_labels, extra),
                   bool(names) and (known is None or known.issuperset(names)))
    while walked_path is not None:
        skip(walked_path, walked_reason)
        walked_path, walked_size, walked_reason = next(found, _WALKED_ALL)
    if untabled:
        split, example = min(untabled.items())
        raise OptionsError(f"{join(root, split)} holds images ({example}, ...) but no {' or '.join(SPLIT_TABLE_NAMES)}, "
                           f"where {', '.join(sorted(with_tables))} has one: put a table in each split folder")
    unlabelled = not table.has_label and not seen and labels is None  # images and their columns, no labels
    if unlabelled and choice.active:
        flag = "--stratify" if stratify else "--max_per_class"
        raise OptionsError(f"{flag} works per label, and {table.path} gives no label: drop {flag}")
    chosen = choice.finish(skips.add)
    if unlabelled:
        return _listing(root, [], listed, 0, chosen.total_bytes, skips, folder, chosen.files, label_offset, table,
                        unlabelled=True)
    if not chosen.split_counts:
        raise OptionsError(_no_labels_message(table, chosen.unknown, labels is not None))
    names = list(labels) if labels is not None else sorted(seen)
    return _listing(root, names, chosen.split_counts, chosen.unknown, chosen.total_bytes, skips, folder,
                    chosen.files, label_offset, table)


def _check_no_split_folder(table: Table, file_name: str, line: int) -> None:
    """A table without a split column must not name an image in a split folder: its split would
    come from the hash, not the folder, a silent mix (a test image trained on).

    Raises:
      OptionsError: saying to add a split column or put a table in each split folder.
    """
    top, _, rest = file_name.partition("/")
    if rest and top in SPLIT_NAMES:
        raise OptionsError(f"--metadata {table.path} line {line} names {file_name!r}, in split folder {top}, "
                           f"but has no split column: add a split column, or put a "
                           f"{' or '.join(SPLIT_TABLE_NAMES)} in each split folder")


def _no_labels_message(table: Table, unknown: int, labels_file: bool) -> str:
    """Why no image could be written: none has a (known) label."""
    if labels_file:
        return (f"none of the {wording.count(unknown, 'image')} --metadata {table.path} names has a label in "
                "--labels_file: check the file's names against the table's labels")
    return (f"--metadata {table.path} gives no label on any row: fill its "
            f"{'labels' if table.multi_label else 'label'} column, or drop it for a dataset without labels")


def _unnamed_reason(relpath: str, reason: str | None) -> str:
    """Why a file that no --metadata row names is skipped."""
    if reason is not None:
        return reason
    if any(_is_junk(part) for part in relpath.split("/")):
        return SKIP_HIDDEN
    return SKIP_NO_ROW if is_image_name(relpath) else SKIP_NOT_IMAGE


def _label_folder(root: str, relpath: str, in_split: bool) -> str:
    """A table without labels: an image's label is its top folder under --input, or under its
    split folder where the table gives splits and the image is in one ("" for none)."""
    parts = relpath.split("/")
    depth = 1 if in_split and parts[0] in SPLIT_NAMES else 0
    if len(parts) < depth + 2:
        return ""
    check_label_name(parts[depth], join(root, *parts[:depth + 1]))
    return parts[depth]


def _first_pass(root: str, folder: SpillFolder, validation_percent: float,
                skips: _Skips, recursive: bool = False) -> tuple[RowFile, bool]:
    """Every file under ``root``, skipped by name or kept as (relpath, size); and whether the tree is split."""
    images = RowFile(folder.file("images"))  # (relpath, size) of each file that passed the name checks
    split_layout = False
    top_folders: set[str] = set()
    prefix = len(root) + 1
    for path, size, reason in walk_tree(root):
        if not path.startswith(root + "/"):
            continue
        relpath = path[prefix:]
        parts = relpath.split("/")
        if reason is not None:
            skips.add(relpath, reason)
        elif any(_is_junk(part) for part in parts):
            skips.add(relpath, SKIP_HIDDEN)
        else:
            top_folders.add(parts[0])
            if not is_image_name(relpath):
                skips.add(relpath, SKIP_NOT_IMAGE)
                continue
            images.append((relpath, size))
            # A split-named top folder holding images at <split>/<label>/<image> makes a
            # split tree: decided by where the images are, so a stray folder or file beside
            # train/ and validation/ cannot switch the layout (it is skipped instead).
            split_layout = split_layout or (
                (len(parts) >= 3 if recursive else len(parts) == 3) and parts[0] in SPLIT_NAMES)

    if split_layout and validation_percent:
        raise OptionsError(
            f"{root} already has split folders ({', '.join(sorted(top_folders & set(SPLIT_NAMES)))}); "
            "drop --validation_percent")
    return images, split_layout


def _split_rank(name: str) -> tuple[int, str]:
    return (SPLIT_NAMES.index(name) if name in SPLIT_NAMES else len(SPLIT_NAMES), name)


def read_labels_file(path: str) -> list[str]:
    """One label a line; the line number is the id."""
    try:
        with FileSystems.open(path) as f:
            text = f.read().decode("utf-8")
    except Exception as e:
        raise OptionsError(f"cannot read --labels_file {path}: {e}") from e
    names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        raise OptionsError(f"--labels_file {path} lists no labels")
    duplicates = [n for n, c in collections.Counter(names).items() if c > 1]
    if duplicates:
        raise OptionsError(f"--labels_file {path} lists {duplicates[0]!r} more than once")
    return names
