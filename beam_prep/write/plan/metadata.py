"""``--metadata``: a table (CSV, TSV or JSON Lines) that says what each image is.

Read once, streamed: each row is checked as it comes (fields, JSON, ``file_name``,
one type per column) and spilled to disk, sorted by ``file_name``, so that the
listing can join it with the walk of ``--input`` in one merge of two sorted
streams, and a table of millions of rows never sits in memory. Any problem is an
``OptionsError`` naming the table and the line, raised before any work.

Columns: ``file_name`` (the image's path under ``--input``, or under the table's
own folder for Hugging Face's per-split tables; a lone ``*_file_name`` column
serves as well, as Hugging Face reads it), ``label`` (one name) or ``labels``
(several: a JSON list, or names separated by ``;`` in CSV/TSV), ``split``
(optional), and any other column, stored in each record as a feature of its
own: strings as bytes, integers and booleans as int64, floats as float.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import hashlib
import io
import json
import os
import posixpath
import re
from collections.abc import Iterator, Sequence
from typing import Any

from beam_prep.errors import OptionsError
from beam_prep.io.storage import is_local, open_to_read
from beam_prep.model.features import SCHEMA, FeatureKind
from beam_prep.write.plan.spill import SortedRows, SpillFolder

__all__ = [
    "FILE_NAME",
    "FORMATS",
    "LABEL",
    "LABELS",
    "SPLIT",
    "SPLIT_TABLE_NAMES",
    "MetadataRow",
    "Table",
    "check_path",
    "combine_tables",
    "file_sha256",
    "read_table",
]

FILE_NAME = "file_name"
LABEL = "label"
LABELS = "labels"
SPLIT = "split"
_RESERVED = (FILE_NAME, LABEL, LABELS, SPLIT)
# The table's format, by how its name ends.
FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl"}
# The tables Hugging Face's imagefolder finds in each split folder, in the order looked for;
# metadata.parquet it reads too, and beam-prep refuses, saying so.
SPLIT_TABLE_NAMES = ("metadata.jsonl", "metadata.csv")
PARQUET_TABLE_NAME = "metadata.parquet"
# Booleans as a CSV/TSV cell may spell them (pandas' defaults, which Hugging Face reads with).
_BOOLEANS = {"True": True, "TRUE": True, "true": True, "False": False, "FALSE": False, "false": False}
_INT = re.compile(r"[+-]?\d+")
_INT64_RANGE = (-(2**63), 2**63 - 1)


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


def check_path(path: str) -> str:
    """The table's format, from its name; refuses one it cannot read.

    Raises:
      OptionsError: an unknown extension, or a local table that does not exist.
    """
    suffix = posixpath.splitext(path)[1].lower()
    if suffix not in FORMATS:
        raise OptionsError(f"--metadata {path} must end in {', '.join(FORMATS)} (CSV, TSV or JSON Lines)")
    if is_local(path) and not os.path.isfile(path):
        raise OptionsError(f"--metadata {path} is not a file")
    return FORMATS[suffix]


def file_sha256(path: str) -> str:
    """The table's sha256 (hex), read in chunks: a resume with another table is refused.

    Raises:
      OptionsError: the table cannot be read.
    """
    digest = hashlib.sha256()
    with _reading(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def _reading(path: str) -> Iterator[Any]:
    """The table opened for reading; a failure to open or read it (a missing object, no
    permission: remote filesystems may say so only at the first read) is an ``OptionsError``."""
    try:
        with open_to_read(path) as f:
            yield f
    except (OptionsError, UnicodeDecodeError):
        raise
    except Exception as e:
        raise OptionsError(f"cannot read --metadata {path}: {e}") from e


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
    with _reading(path) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")  # a spreadsheet's BOM dropped
        records = _json_records(path, text) if fmt == "jsonl" else _delimited_records(path, text, fmt)
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
                raise OptionsError(f"--metadata {table.path} makes column {name!r} {_KIND_WORDS[kind]} where "
                                   f"{first.path} makes it {_KIND_WORDS[known]}: give a column values of one type")
    return Table(", ".join(table.path for table in tables), first.columns, kinds, first.has_label,
                 first.multi_label, any(table.has_split for table in tables), _Chained([t._rows for t in tables]),
                 first.header, per_split=True)


def _delimited_records(path: str, text: io.TextIOBase, fmt: str) -> Iterator[tuple[Any, int]]:
    """(header, 1), then (fields, line) per row of a CSV or TSV; blank lines skipped."""
    options = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if fmt == "tsv" else {}
    reader = csv.reader(text, strict=True, **options)
    first = True
    try:
        for fields in reader:
            if not fields or fields == [""]:
                continue
            if first:
                first = False
                yield [name.strip() for name in fields], reader.line_num
                continue
            yield fields, reader.line_num
    except csv.Error as e:
        raise OptionsError(f"--metadata {path} line {reader.line_num}: {e}: fix its quoting") from None


def _json_records(path: str, text: io.TextIOBase) -> Iterator[tuple[Any, int]]:
    """(the first row's keys, 1), then (row, line) per line of a JSON Lines file, the first row too."""
    first: tuple[dict, int] | None = None
    for number, line in enumerate(text, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.rstrip("\r\n"))
        except ValueError as e:
            raise OptionsError(f"--metadata {path} line {number} is not valid JSON ({e.msg}, column {e.colno}): "
                               "write one JSON object a line") from None
        if not isinstance(row, dict):
            raise OptionsError(f"--metadata {path} line {number} is a JSON {type(row).__name__}, "
                               "not an object: write one JSON object a line")
        if first is None:
            first = (row, number)
            yield list(row), number
        yield row, number


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
        where = f"--metadata {path} line {line}"
        if duplicates:
            raise OptionsError(f"{where}: column {duplicates[0]!r} appears twice: name each column once")
        self._keys = set(header)  # a JSON row's keys, as the table names them
        self._source_header = header
        header = _image_column(header, where, split_folder)
        if LABEL in header and LABELS in header:
            raise OptionsError(f"{where}: both {LABEL} and {LABELS} columns: keep {LABEL} for one name a row, "
                               f"or {LABELS} for several")
        clashes = [name for name in header if name in SCHEMA or not name]
        if clashes:
            raise OptionsError(f"{where}: column {clashes[0]!r} cannot be a feature of its own "
                               "(empty, or a key of the record's image and label): rename it")
        self._header = header
        self._columns = tuple(name for name in header if name not in _RESERVED)
        # Where each column is in a row (a JSON object's values are put in the header's order).
        self._file_at = header.index(FILE_NAME)
        self._label_at = header.index(LABEL) if LABEL in header else None
        self._labels_at = header.index(LABELS) if LABELS in header else None
        self._split_at = header.index(SPLIT) if SPLIT in header else None
        self._extra_at = [(name, header.index(name)) for name in self._columns]
        self._kinds: dict[str, FeatureKind] = {}
        self._first: dict[str, tuple[int, Any]] = {}  # column -> (line, value) that decided its type
        self._empty: dict[str, int] = {}  # column -> first line with an empty string (CSV/TSV)

    def table(self) -> Table:
        kinds = {name: self._kinds.get(name, FeatureKind.BYTES) for name in self._columns}
        for name, line in self._empty.items():
            if kinds[name] is not FeatureKind.BYTES:
                self._misfit(name, line, "", kinds[name])
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
                raise OptionsError(f"{_where(self._path, line)} {said}: give every row the same keys")
            values = [values[name] for name in self._source_header]
        elif len(values) != len(header):
            separator = "tab" if self._fmt == "tsv" else "comma"
            if len(values) < len(header):
                advice = f"give each row every column, an empty one as nothing between two {separator}s"
            elif self._fmt == "tsv":
                advice = "a tab inside a field splits it (TSV has no quoting): replace it, or save the table as CSV"
            else:
                advice = "quote fields that hold the separator"
            raise OptionsError(f"{_where(self._path, line)} has {len(values)} fields, but the header has "
                               f"{len(header)}: {advice}")
        file_name = self._prefix + _file_name(values[self._file_at], self._path, line, self._split_folder)
        label, labels = self._labels(values, line)
        split = self._split(values[self._split_at], line) if self._split_at is not None else self._split_folder
        extra = tuple([self._value(name, values[at], line) for name, at in self._extra_at])
        self._rows.append((file_name, line, label, labels, split, extra))

    def _labels(self, values: list[Any], line: int) -> tuple[str, tuple[str, ...] | None]:
        if self._labels_at is not None:
            names = (_label_name(name, self._path, line) for name in self._label_list(values[self._labels_at], line))
            labels = tuple(dict.fromkeys(name for name in names if name))
            return ";".join(labels), labels
        if self._label_at is not None:
            return _label_name(values[self._label_at], self._path, line), None
        return "", None

    def _label_list(self, value: Any, line: int) -> list[Any]:
        if isinstance(value, str) and self._fmt != "jsonl":
            if not value.strip().startswith("["):
                return value.split(";")
            try:
                value = json.loads(value)
            except ValueError as e:
                raise OptionsError(f"{_where(self._path, line)}: {LABELS} is not a valid JSON list ({e.msg}): "
                                   "write [\"a\", \"b\"] or a;b") from None
        if not isinstance(value, list):
            raise OptionsError(f"{_where(self._path, line)}: {LABELS} must be a list of names, "
                               f"not {json.dumps(value)}")
        return value

    def _split(self, value: Any, line: int) -> str:
        split = value.strip() if isinstance(value, str) else value
        if split not in self._splits:
            raise OptionsError(f"{_where(self._path, line)}: split {json.dumps(split)} is not one of "
                               f"{', '.join(self._splits)}")
        if self._split_folder is not None and split != self._split_folder:
            raise OptionsError(f"{_where(self._path, line)}: split {json.dumps(split)} in the table of split "
                               f"folder {self._split_folder}: move the row to {split}'s table, or drop the column")
        return split

    def _value(self, name: str, value: Any, line: int) -> Any:
        """A cell as a bytes, int64 or float value, checked against its column's type so far.

        A CSV/TSV cell is a number where it reads as one, but a column that holds text
        keeps every cell's text as written (ids like 007 stay strings there).
        """
        text = None
        if self._fmt != "jsonl" and self._kinds.get(name) is FeatureKind.BYTES:
            return value  # the common case first: a text column keeps every cell as written
        if isinstance(value, str) and self._fmt != "jsonl":
            if not value.strip():
                self._empty.setdefault(name, line)
                return value
            text, value = value, _parse_cell(value)
        kind = _kind_of(value)
        if kind is None:
            advice = ("give every row a value (NaN for a missing number)" if value is None
                      else "a feature holds a string, an integer, a number or a boolean: store it as a string")
            raise OptionsError(f"--metadata {self._path} line {line}: column {name!r} holds "
                               f"{json.dumps(value)}: {advice}")
        if isinstance(value, bool):
            value = int(value)  # stored as int64 0/1
        known = self._kinds.get(name)
        if text is not None and known is FeatureKind.BYTES:
            return text
        if known is None or (known is FeatureKind.INT64 and kind is FeatureKind.FLOAT):
            self._kinds[name] = kind
            self._first.setdefault(name, (line, text if text is not None else value))
        elif not (known is kind or (known is FeatureKind.FLOAT and kind is FeatureKind.INT64)):
            self._misfit(name, line, text if text is not None else value, known)
        return value

    def _misfit(self, name: str, line: int, value: Any, kind: FeatureKind) -> None:
        first_line, first = self._first[name]
        advice = "give a column values of one type"
        if value == "" and kind is not FeatureKind.BYTES:
            advice = "fill the cell (NaN for a missing number, which makes the column a number column)"
        raise OptionsError(f"--metadata {self._path} line {line}: column {name!r} holds {json.dumps(value)}, "
                           f"but line {first_line} made it {_KIND_WORDS[kind]} ({json.dumps(first)}): {advice}")


_KIND_WORDS = {FeatureKind.BYTES: "a string column", FeatureKind.INT64: "an integer column",
               FeatureKind.FLOAT: "a number column"}


def _parse_cell(text: str) -> Any:
    """A CSV/TSV cell as an int, a float, a bool (``True``, ``false``, ... as pandas reads them)
    or the text itself, as it reads."""
    stripped = text.strip()
    if stripped in _BOOLEANS:
        return _BOOLEANS[stripped]
    if _INT.fullmatch(stripped):
        number = int(stripped)
        return number if _INT64_RANGE[0] <= number <= _INT64_RANGE[1] else text
    try:
        return float(stripped)
    except ValueError:
        return text


def _kind_of(value: Any) -> FeatureKind | None:
    if isinstance(value, bool):
        return FeatureKind.INT64
    if isinstance(value, int):
        return FeatureKind.INT64 if _INT64_RANGE[0] <= value <= _INT64_RANGE[1] else None
    if isinstance(value, float):
        return FeatureKind.FLOAT
    if isinstance(value, str):
        return FeatureKind.BYTES
    return None


def _where(path: str, line: int) -> str:
    return f"--metadata {path} line {line}"


_PLAIN_PATH = re.compile(r"[^/\s.:\\][^:\\]*")  # no leading slash, dot or space: canonical unless it has "." parts


def _image_column(header: list[str], where: str, split_folder: str | None) -> list[str]:
    """The header with its image column named ``file_name``: Hugging Face reads a lone
    ``*_file_name`` column (``image_file_name``) as the image too. One image a record: a
    second image column, or a list of them, is refused.

    Raises:
      OptionsError: no image column, or more than one.
    """
    images = [name for name in header
              if name in (FILE_NAME, "file_names") or name.endswith(("_" + FILE_NAME, "_file_names"))]
    if not images:
        under = f"its split folder {split_folder}" if split_folder else "--input"
        raise OptionsError(f"{where}: no {FILE_NAME} column (columns: {', '.join(header)}): "
                           f"add one with each image's path under {under}")
    if len(images) > 1 or images[0].endswith("file_names"):
        raise OptionsError(f"{where}: image columns {', '.join(images)}: a record holds one image; keep one "
                           f"{FILE_NAME} column (and store other paths under a name not ending in _{FILE_NAME})")
    return [FILE_NAME if name == images[0] else name for name in header]


def _file_name(value: Any, path: str, line: int, split_folder: str | None = None) -> str:
    """``file_name`` made canonical (``./a.jpg`` is ``a.jpg``, ``a\\b.jpg`` is ``a/b.jpg``, as Hugging
    Face reads it); refused where it leaves ``--input`` (or, in a split folder's table, that folder)."""
    if (isinstance(value, str) and _PLAIN_PATH.fullmatch(value) and "//" not in value and "/." not in value
            and not value.endswith(("/", " ", "\t"))):
        return value  # already canonical: the common case, checked cheaply
    under = f"its split folder {split_folder}" if split_folder else "--input"
    if not isinstance(value, str) or not value.strip():
        raise OptionsError(f"{_where(path, line)}: {FILE_NAME} is empty: give the image's path under {under}")
    text = value.strip()
    if text.startswith(("/", "\\")) or "://" in text or re.match(r"[A-Za-z]:[\\/]", text):
        raise OptionsError(f"{_where(path, line)}: {FILE_NAME} {text!r} is an absolute path: "
                           f"give the path under {under}")
    name = posixpath.normpath(text.replace("\\", "/"))
    if name == ".." or name.startswith("../"):
        raise OptionsError(f"{_where(path, line)}: {FILE_NAME} {text!r} leaves {under}: give a path under {under}")
    if name == ".":
        raise OptionsError(f"{_where(path, line)}: {FILE_NAME} {text!r} names {under} itself: "
                           "give an image's path")
    return name


def _label_name(value: Any, path: str, line: int) -> str:
    """A label name as labels.txt can hold it: text (an integer is its digits), no line breaks."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise OptionsError(f"{_where(path, line)}: a label must be a name, not {json.dumps(value)}")
    name = value.strip()
    if not name.isprintable() and name.splitlines() not in ([name], []):
        raise OptionsError(f"{_where(path, line)}: label {name!r} has a line break: "
                           "labels.txt holds one label a line")
    return name
