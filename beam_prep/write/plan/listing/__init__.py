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

Its modules, by job: ``names`` (split folders, junk, label names, skip reasons),
``from_folders`` (a tree whose folders give labels), ``from_table`` (a tree a table
describes), ``split_tables`` (which tables: ``--metadata`` or one in each split
folder), ``listed`` (the ``Listing`` the launcher holds) and ``stamps`` (the listed
files' sizes and stamps a dataset keeps, by which an append tells a file unchanged).
"""
from __future__ import annotations

from collections.abc import Sequence

from beam_prep.errors import OptionsError
from beam_prep.write.plan.listing.from_folders import list_folders
from beam_prep.write.plan.listing.from_table import list_table
from beam_prep.write.plan.listing.listed import Listing
from beam_prep.write.plan.listing.names import (
    JUNK_NAMES,
    SKIP_DEPTH,
    SKIP_HIDDEN,
    SKIP_NO_ROW,
    SKIP_NOT_IMAGE,
    SPLIT_NAMES,
    check_label_name,
    read_labels_file,
)
from beam_prep.write.plan.listing.split_tables import find_split_tables
from beam_prep.write.shared.entry import UNKNOWN_LABEL
from beam_prep.write.shared.hashing import order_key, split_for, stable_hash
from beam_prep.write.shared.spill import SpillFolder

__all__ = [
    "JUNK_NAMES",
    "SKIP_DEPTH",
    "SKIP_HIDDEN",
    "SKIP_NOT_IMAGE",
    "SKIP_NO_ROW",
    "SPLIT_NAMES",
    "UNKNOWN_LABEL",
    "Listing",
    "check_label_name",
    "find_split_tables",
    "list_tree",
    "order_key",
    "read_labels_file",
    "split_for",
    "stable_hash",
]


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
            return list_table(root, folder, validation_percent, labels, label_offset, metadata, split_tables,
                              stratify, max_per_class)
        return list_folders(root, folder, validation_percent, labels, label_offset, recursive, stratify, max_per_class)
    except BaseException:
        folder.close()
        raise
