"""A read table: its columns and their types in memory, its rows on disk, sorted by
``file_name``; and the tables of each split folder (Hugging Face's layout) as one.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from beam_prep.errors import OptionsError
from beam_prep.model.features import FeatureKind
from beam_prep.write.plan.metadata.kinds import KIND_WORDS
from beam_prep.write.shared.spill import SortedRows

__all__ = ["MetadataRow", "Table", "combine_tables"]


@dataclasses.dataclass(frozen=True)
class MetadataRow:
    """One row of the table, checked: the image it names and what it says of it.

    ``labels`` is None for single-label tables (then ``label`` is the name, perhaps
    empty), a tuple of names for multi-label ones; ``split`` is None where the table
    has no split column; ``extra`` holds the other columns' values in ``Table.columns``
    order, as read (``Table.features`` gives them their column's final type).
    """

    file_name: str
    line: int
    label: str
    labels: tuple[str, ...] | None
    split: str | None
    extra: tuple[Any, ...]


class Table:
    """A read table: its columns and their types in memory, its rows on disk, sorted by ``file_name``.

    Attributes:
      path: the table, as ``--metadata`` names it.
      columns: the extra columns (features), in the table's order.
      kinds: each extra column's type (``FeatureKind``), checked over every row.
      has_label: the table names labels (``label`` or ``labels``); without, an
        image's label is its top folder under ``--input``.
      multi_label: the table has a ``labels`` column.
      has_split: the table has a ``split`` column.
      header: every column, as the table names them (for messages).
      per_split: the tables of each split folder, combined (``combine_tables``): each
        row's split is its table's folder.
      count: rows read.
    """

    def __init__(self, path: str, columns: tuple[str, ...], kinds: dict[str, FeatureKind], has_label: bool,
                 multi_label: bool, has_split: bool, rows: SortedRows | _Chained, header: Sequence[str] = (),
                 per_split: bool = False) -> None:
        self.path = path
        self.columns = columns
        self.kinds = kinds
        self.has_label = has_label
        self.multi_label = multi_label
        self.has_split = has_split
        self.header = tuple(header)
        self.per_split = per_split
        self._rows = rows

    @property
    def count(self) -> int:
        return self._rows.count

    def rows(self) -> Iterator[tuple]:
        """Every row as a tuple of ``MetadataRow``'s fields (millions of them: no object each),
        sorted by ``file_name`` (then line).

        Raises:
          OptionsError: two rows name the same file (both lines named).
        """
        previous_name, previous_line = "", 0  # no row names "" (``_file_name`` refuses it)
        for row in self._rows:
            file_name, line, _, _, _, _ = row
            if file_name == previous_name:  # (a table in a split folder: its own, as names start with the folder)
                raise OptionsError(f"--metadata {self.path} lines {previous_line} and {line} both name "
                                   f"{file_name!r}: keep one row per image")
            previous_name, previous_line = file_name, line
            yield row

    def features(self, extra: tuple[Any, ...]) -> dict[str, Any]:
        """A row's extra columns (``MetadataRow.extra``) as record features, each of its column's type."""
        return {name: float(value) if self.kinds[name] is FeatureKind.FLOAT else value
                for name, value in zip(self.columns, extra)}

    def feature_kinds(self) -> dict[str, str]:
        """The extra features' types, as the manifest lists them."""
        return {name: self.kinds[name].value for name in self.columns}


class _Chained:
    """Several tables' sorted rows, one after another: sorted as a whole when the tables are
    taken in their split folders' order (each row's ``file_name`` starts with its folder)."""

    def __init__(self, parts: Sequence[Any]) -> None:
        self._parts = parts

    @property
    def count(self) -> int:
        return sum(part.count for part in self._parts)

    def __iter__(self) -> Iterator[Any]:
        for part in self._parts:
            yield from part


def combine_tables(tables: Sequence[Table]) -> Table:
    """The tables of each split folder as one: the same columns in each, and types that agree
    (an integer column in one and a number column in another is a number column).

    Args:
      tables: each split folder's table, read with its ``split_folder``, in the folders' name order.

    Raises:
      OptionsError: two tables with different columns, or a column of two types (both tables named).
    """
    first = tables[0]
    kinds = dict(first.kinds)
    for table in tables[1:]:
        if (table.columns, table.has_label, table.multi_label) != (first.columns, first.has_label, first.multi_label):
            raise OptionsError(f"--metadata {table.path} has columns {', '.join(table.header)} where "
                               f"{first.path} has {', '.join(first.header)}: give each split's table the same columns")
        for name, kind in table.kinds.items():
            known = kinds[name]
            if {kind, known} == {FeatureKind.INT64, FeatureKind.FLOAT}:
                kinds[name] = FeatureKind.FLOAT
            elif kind is not known:
                raise OptionsError(f"--metadata {table.path} makes column {name!r} {KIND_WORDS[kind]} where "
                                   f"{first.path} makes it {KIND_WORDS[known]}: give a column values of one type")
    return Table(", ".join(table.path for table in tables), first.columns, kinds, first.has_label,
                 first.multi_label, any(table.has_split for table in tables), _Chained([t._rows for t in tables]),
                 first.header, per_split=True)

