"""A whole table read: each row checked against the header and the columns' types as it
comes, and spilled to disk sorted by ``file_name``, so that a table of millions of rows
never sits in memory; any problem refused before any work, naming the table and the line.
"""
from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

from beam_prep.errors import OptionsError
from beam_prep.model.features import SCHEMA
from beam_prep.write.plan.metadata.columns import (
    FILE_NAME,
    LABEL,
    LABELS,
    RESERVED,
    SPLIT,
    canonical_file_name,
    image_column,
    label_name,
    where,
)
from beam_prep.write.plan.metadata.formats import check_path, delimited_records, json_records, opened
from beam_prep.write.plan.metadata.kinds import ColumnKinds
from beam_prep.write.plan.metadata.table import Table
from beam_prep.write.shared.spill import SortedRows, SpillFolder

__all__ = ["read_table"]


def read_table(path: str, folder: SpillFolder, splits: Sequence[str], split_folder: str | None = None) -> Table:
    """Reads and checks the whole table, spilling its rows to ``folder`` sorted by ``file_name``.

    Args:
      path: the table (local or gs://); its extension says its format.
      folder: where the rows go.
      splits: the names a ``split`` column may hold.
      split_folder: for a table inside a split folder (Hugging Face's layout), that
        folder's name: its ``file_name`` values are under that folder, each row is in
        that split, and a ``split`` column may name no other.

    Raises:
      OptionsError: the first problem, naming the table's line: a row with the
        wrong fields, invalid JSON, no ``file_name`` column, a ``file_name`` that
        leaves ``--input`` (or its split folder), a column whose values do not fit one type.
    """
    fmt = check_path(path)
    with opened(path) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")  # a spreadsheet's BOM dropped
        records = json_records(path, text) if fmt == "jsonl" else delimited_records(path, text, fmt)
        try:
            header, first_line = next(records)
        except StopIteration:
            raise OptionsError(f"--metadata {path} is empty: it needs a {FILE_NAME} column") from None
        except UnicodeDecodeError as e:
            raise OptionsError(f"--metadata {path} is not UTF-8 text ({e.reason}): save it as UTF-8") from None
        rows = SortedRows(folder, f"metadata-{split_folder or ''}")
        reader = _RowReader(path, header, first_line, fmt, tuple(splits), rows, split_folder)
        try:
            for values, line in records:
                reader.add(values, line)
        except UnicodeDecodeError as e:
            raise OptionsError(f"--metadata {path} is not UTF-8 text ({e.reason}): save it as UTF-8") from None
    return reader.table()


class _RowReader:
    """Checks each row against the header and the column types seen so far, and spills it."""

    def __init__(self, path: str, header: list[str], line: int, fmt: str, splits: tuple[str, ...],
                 rows: SortedRows, split_folder: str | None = None) -> None:
        self._path = path
        self._fmt = fmt
        self._splits = splits
        self._rows = rows
        self._split_folder = split_folder
        self._prefix = f"{split_folder}/" if split_folder else ""
        duplicates = sorted({name for name in header if header.count(name) > 1})
        here = where(path, line)
        if duplicates:
            raise OptionsError(f"{here}: column {duplicates[0]!r} appears twice: name each column once")
        self._keys = set(header)  # a JSON row's keys, as the table names them
        self._source_header = header
        header = image_column(header, here, split_folder)
        if LABEL in header and LABELS in header:
            raise OptionsError(f"{here}: both {LABEL} and {LABELS} columns: keep {LABEL} for one name a row, "
                               f"or {LABELS} for several")
        clashes = [name for name in header if name in SCHEMA or not name]
        if clashes:
            raise OptionsError(f"{here}: column {clashes[0]!r} cannot be a feature of its own "
                               "(empty, or a key of the record's image and label): rename it")
        self._header = header
        self._columns = tuple(name for name in header if name not in RESERVED)
        # Where each column is in a row (a JSON object's values are put in the header's order).
        self._file_at = header.index(FILE_NAME)
        self._label_at = header.index(LABEL) if LABEL in header else None
        self._labels_at = header.index(LABELS) if LABELS in header else None
        self._split_at = header.index(SPLIT) if SPLIT in header else None
        self._extra_at = [(name, header.index(name)) for name in self._columns]
        self._kinds = ColumnKinds(path, fmt)

    def table(self) -> Table:
        kinds = self._kinds.final(self._columns)
        return Table(self._path, self._columns, kinds, has_label=LABEL in self._header or LABELS in self._header,
                     multi_label=LABELS in self._header, has_split=SPLIT in self._header, rows=self._rows,
                     header=self._source_header)

    def add(self, values: Any, line: int) -> None:
        """Checks one row (a CSV/TSV row's fields, or a JSON object) and spills it."""
        header = self._header
        if isinstance(values, dict):
            if values.keys() != self._keys:
                missing = sorted(self._keys - values.keys())
                extra = sorted(values.keys() - self._keys)
                said = (f"lacks {', '.join(missing)}" if missing else "") + (" and " if missing and extra else "") + (
                    f"has {', '.join(extra)}, which the first row has not" if extra else "")
                raise OptionsError(f"{where(self._path, line)} {said}: give every row the same keys")
            values = [values[name] for name in self._source_header]
        elif len(values) != len(header):
            separator = "tab" if self._fmt == "tsv" else "comma"
            if len(values) < len(header):
                advice = f"give each row every column, an empty one as nothing between two {separator}s"
            elif self._fmt == "tsv":
                advice = "a tab inside a field splits it (TSV has no quoting): replace it, or save the table as CSV"
            else:
                advice = "quote fields that hold the separator"
            raise OptionsError(f"{where(self._path, line)} has {len(values)} fields, but the header has "
                               f"{len(header)}: {advice}")
        file_name = self._prefix + canonical_file_name(values[self._file_at], self._path, line, self._split_folder)
        label, labels = self._labels(values, line)
        split = self._split(values[self._split_at], line) if self._split_at is not None else self._split_folder
        value = self._kinds.value
        extra = tuple([value(name, values[at], line) for name, at in self._extra_at])
        self._rows.append((file_name, line, label, labels, split, extra))

    def _labels(self, values: list[Any], line: int) -> tuple[str, tuple[str, ...] | None]:
        if self._labels_at is not None:
            names = (label_name(name, self._path, line) for name in self._label_list(values[self._labels_at], line))
            labels = tuple(dict.fromkeys(name for name in names if name))
            return ";".join(labels), labels
        if self._label_at is not None:
            return label_name(values[self._label_at], self._path, line), None
        return "", None

    def _label_list(self, value: Any, line: int) -> list[Any]:
        if isinstance(value, str) and self._fmt != "jsonl":
            if not value.strip().startswith("["):
                return value.split(";")
            try:
                value = json.loads(value)
            except ValueError as e:
                raise OptionsError(f"{where(self._path, line)}: {LABELS} is not a valid JSON list ({e.msg}): "
                                   "write [\"a\", \"b\"] or a;b") from None
        if not isinstance(value, list):
            raise OptionsError(f"{where(self._path, line)}: {LABELS} must be a list of names, "
                               f"not {json.dumps(value)}")
        return value

    def _split(self, value: Any, line: int) -> str:
        split = value.strip() if isinstance(value, str) else value
        if split not in self._splits:
            raise OptionsError(f"{where(self._path, line)}: split {json.dumps(split)} is not one of "
                               f"{', '.join(self._splits)}")
        if self._split_folder is not None and split != self._split_folder:
            raise OptionsError(f"{where(self._path, line)}: split {json.dumps(split)} in the table of split "
                               f"folder {self._split_folder}: move the row to {split}'s table, or drop the column")
        return split
