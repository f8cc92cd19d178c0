"""A tree a table describes (``--metadata``, or a table in each split folder): the table's
rows and the walk of the tree, each sorted by path on disk, merged in one pass.
"""
from __future__ import annotations

import collections
from collections.abc import Sequence

from beam_prep import wording
from beam_prep.errors import OptionsError
from beam_prep.io.storage import join
from beam_prep.write.images.imaging import is_image_name
from beam_prep.write.plan.listing.listed import Listing, Skips, make_listing
from beam_prep.write.plan.listing.names import (
    SKIP_HIDDEN,
    SKIP_NO_ROW,
    SKIP_NOT_IMAGE,
    SPLIT_NAMES,
    check_label_name,
    is_junk,
)
from beam_prep.write.plan.listing.split_tables import read_tables
from beam_prep.write.plan.metadata import SPLIT_TABLE_NAMES, Table
from beam_prep.write.plan.selection import Selection
from beam_prep.write.plan.walk import walk_tree
from beam_prep.write.shared.hashing import order_key
from beam_prep.write.shared.spill import SortedRows, SpillFolder

__all__ = ["list_table"]

_WALKED_ALL = (None, 0, None, None)  # the walk's (relpath, size, stamp, reason) once every file is merged


def list_table(root: str, folder: SpillFolder, validation_percent: float, labels: Sequence[str] | None,
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
    table = read_tables(root, folder, validation_percent, path, split_tables)
    walked = SortedRows(folder, "walked")  # (relpath, size, stamp, reason) of each file, by path
    prefix = len(root) + 1
    for file_path, size, stamp, reason in walk_tree(root):
        if file_path.startswith(root + "/"):
            walked.append((file_path[prefix:], size, stamp, reason))

    skips = Skips(SortedRows(folder, "skipped"))
    choice = Selection(folder, table.count, validation_percent, stratify, max_per_class)
    if table.multi_label:
        choice.check_single_label(table.path)
    known = set(labels) if labels is not None else None
    with_tables = {split for split, _ in split_tables}
    untabled: dict[str, str] = {}  # split folder without a table -> an image in it
    seen: set[str] = set()
    listed: collections.Counter[str] = collections.Counter()  # every row, by split: a dataset without labels
    found = iter(walked)
    walked_path, walked_size, walked_stamp, walked_reason = next(found, _WALKED_ALL)

    def skip(relpath: str, reason: str | None) -> None:
        why = _unnamed_reason(relpath, reason)
        top = relpath.split("/", 1)[0]
        if why == SKIP_NO_ROW and with_tables and top in SPLIT_NAMES and top not in with_tables:
            untabled.setdefault(top, relpath)
        skips.add(relpath, why)

    for file_name, line, label, row_labels, split, extra in table.rows():  # a MetadataRow's fields
        while walked_path is not None and walked_path < file_name:
            skip(walked_path, walked_reason)
            walked_path, walked_size, walked_stamp, walked_reason = next(found, _WALKED_ALL)
        size, stamp = 0, None  # a file the walk did not find: listed, and its read fails
        if walked_path == file_name:
            size, stamp, reason = walked_size, walked_stamp, walked_reason
            walked_path, walked_size, walked_stamp, walked_reason = next(found, _WALKED_ALL)
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
        choice.add((order_key(file_name), file_name, split, label, size, row_labels, extra, stamp),
                   bool(names) and (known is None or known.issuperset(names)))
    while walked_path is not None:
        skip(walked_path, walked_reason)
        walked_path, walked_size, walked_stamp, walked_reason = next(found, _WALKED_ALL)
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
        return make_listing(root, [], listed, 0, chosen.total_bytes, skips, folder, chosen.files, label_offset, table,
                        unlabelled=True)
    if not chosen.split_counts:
        raise OptionsError(_no_labels_message(table, chosen.unknown, labels is not None))
    names = list(labels) if labels is not None else sorted(seen)
    return make_listing(root, names, chosen.split_counts, chosen.unknown, chosen.total_bytes, skips, folder,
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
    if any(is_junk(part) for part in relpath.split("/")):
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
