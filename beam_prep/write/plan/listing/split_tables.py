"""Which tables a listing reads: ``--metadata``'s, or one in each split folder, as Hugging
Face's imagefolder finds them (``metadata.jsonl`` or ``metadata.csv``), read as one.
"""
from __future__ import annotations

import os

from apache_beam.io.filesystems import FileSystems

from beam_prep.errors import OptionsError
from beam_prep.io.storage import is_local, join, storage_error
from beam_prep.write.plan.listing.names import SPLIT_NAMES
from beam_prep.write.plan.metadata import (
    PARQUET_TABLE_NAME,
    SPLIT_TABLE_NAMES,
    Table,
    combine_tables,
    read_table,
)
from beam_prep.write.shared.spill import SpillFolder

__all__ = ["find_split_tables", "read_tables"]


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


def read_tables(root: str, folder: SpillFolder, validation_percent: float, metadata: str | None,
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
