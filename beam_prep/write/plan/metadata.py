"""``--metadata``: a table (CSV, TSV or JSON Lines) that says what each image is.

Read once, streamed: each row is checked as it comes (fields, JSON, ``file_name``,
one type per column) and spilled to disk, sorted by ``file_name``, so that the
listing can join it with the walk of ``--input`` in one merge of two sorted
streams, and a table of millions of rows never sits in memory. Any problem is an
``OptionsError`` naming the table and the line, raised before any work.

Columns: ``file_name`` (the image's path under ``--input``), ``label`` (one
name) or ``labels`` (several: a JSON list, or names separated by ``;`` in
CSV/TSV), ``split`` (optional), and any other column, stored in each record as
a feature of its own: strings as bytes, integers as int64, floats as float.
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
    "MetadataRow",
    "Table",
    "check_path",
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
      count: rows read.
    """

    def __init__(self, path: str, columns: tuple[str, ...], kinds: dict[str, FeatureKind], has_label: bool,
                 multi_label: bool, has_split: bool, rows: SortedRows) -> None:
        self.path = path
        self.columns = columns
        self.kinds = kinds
        self.has_label = has_label
        self.multi_label = multi_label
        self.has_split = has_split
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
        previous: tuple = ("", 0)
        for row in self._rows:
            if row[0] == previous[0]:
                raise OptionsError(f"--metadata {self.path} lines {previous[1]} and {row[1]} both name "
                                   f"{row[0]!r}: keep one row per image")
            previous = row
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


def read_table(path: str, folder: SpillFolder, splits: Sequence[str]) -> Table:
    """Reads and checks the whole table, spilling its rows to ``folder`` sorted by ``file_name``.

    Args:
      path: the table (local or gs://); its extension says its format.
      folder: where the rows go.
      splits: the names a ``split`` column may hold.

    Raises:
      OptionsError: the first problem, naming the table's line: a row with the
        wrong fields, invalid JSON, no ``file_name`` column, a ``file_name`` that
        leaves ``--input``, a column whose values do not fit one type.
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
        reader = _RowReader(path, header, first_line, fmt, tuple(splits), SortedRows(folder, "metadata"))
        try:
            for values, line in records:
                reader.add(values, line)
        except UnicodeDecodeError as e:
            raise OptionsError(f"--metadata {path} is not UTF-8 text ({e.reason}): save it as UTF-8") from None
    return reader.table()


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
                 rows: SortedRows) -> None:
        self._path = path
        self._fmt = fmt
        self._splits = splits
        self._rows = rows
        duplicates = sorted({name for name in header if header.count(name) > 1})
        where = f"--metadata {path} line {line}"
        if duplicates:
            raise OptionsError(f"{where}: column {duplicates[0]!r} appears twice: name each column once")
        if FILE_NAME not in header:
            raise OptionsError(f"{where}: no {FILE_NAME} column (columns: {', '.join(header)}): "
                               f"add one with each image's path under --input")
        if LABEL in header and LABELS in header:
            raise OptionsError(f"{where}: both {LABEL} and {LABELS} columns: keep {LABEL} for one name a row, "
                               f"or {LABELS} for several")
        clashes = [name for name in header if name in SCHEMA or not name]
        if clashes:
            raise OptionsError(f"{where}: column {clashes[0]!r} cannot be a feature of its own "
                               "(empty, or a key of the record's image and label): rename it")
        self._header = header
        self._keys = set(header)
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
                     multi_label=LABELS in self._header, has_split=SPLIT in self._header, rows=self._rows)

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
            values = [values[name] for name in header]
        elif len(values) != len(header):
            raise OptionsError(f"{_where(self._path, line)} has {len(values)} fields, but the header has "
                               f"{len(header)}: quote fields that hold the separator")
        file_name = _file_name(values[self._file_at], self._path, line)
        label, labels = self._labels(values, line)
        split = self._split(values[self._split_at], line) if self._split_at is not None else None
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
            raise OptionsError(f"--metadata {self._path} line {line}: column {name!r} holds "
                               f"{json.dumps(value)}: a feature holds a string, an integer or a number")
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
        raise OptionsError(f"--metadata {self._path} line {line}: column {name!r} holds {json.dumps(value)}, "
                           f"but line {first_line} made it {_KIND_WORDS[kind]} ({json.dumps(first)}): "
                           "give a column values of one type")


_KIND_WORDS = {FeatureKind.BYTES: "a string column", FeatureKind.INT64: "an integer column",
               FeatureKind.FLOAT: "a number column"}


def _parse_cell(text: str) -> Any:
    """A CSV/TSV cell as an int, a float or the text itself, as it reads."""
    stripped = text.strip()
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


_PLAIN_PATH = re.compile(r"[^/\s.:][^:]*")  # no leading slash, dot or space: canonical unless it has "." parts


def _file_name(value: Any, path: str, line: int) -> str:
    """``file_name`` made canonical (``./a.jpg`` is ``a.jpg``); refused where it leaves ``--input``."""
    if (isinstance(value, str) and _PLAIN_PATH.fullmatch(value) and "//" not in value and "/." not in value
            and not value.endswith(("/", " ", "\t"))):
        return value  # already canonical: the common case, checked cheaply
    if not isinstance(value, str) or not value.strip():
        raise OptionsError(f"{_where(path, line)}: {FILE_NAME} is empty: give the image's path under --input")
    text = value.strip()
    if text.startswith("/") or "://" in text or re.match(r"[A-Za-z]:[\\/]", text):
        raise OptionsError(f"{_where(path, line)}: {FILE_NAME} {text!r} is an absolute path: "
                           "give the path under --input")
    name = posixpath.normpath(text)
    if name == ".." or name.startswith("../"):
        raise OptionsError(f"{_where(path, line)}: {FILE_NAME} {text!r} leaves --input: give a path under --input")
    if name == ".":
        raise OptionsError(f"{_where(path, line)}: {FILE_NAME} {text!r} names --input itself: "
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
