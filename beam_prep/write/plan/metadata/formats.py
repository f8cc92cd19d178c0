"""Which files are tables, and a table's file read: its format by its name, its sha256 (a
resume with another table is refused), its text as records, each with its line number.

CSV and TSV are read by ``csv`` (TSV without quoting), JSON Lines one object a line;
blank lines are skipped. Any problem is an ``OptionsError`` naming the table and the line.
"""
from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import posixpath
from collections.abc import Iterator
from typing import Any

from beam_prep.errors import OptionsError
from beam_prep.io.storage import is_local, open_to_read

__all__ = ["FORMATS", "PARQUET_TABLE_NAME", "SPLIT_TABLE_NAMES", "check_path", "delimited_records", "file_sha256",
           "json_records", "opened"]

# The table's format, by how its name ends.
FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl"}
# The tables Hugging Face's imagefolder finds in each split folder, in the order looked for;
# metadata.parquet it reads too, and beam-prep refuses, saying so.
SPLIT_TABLE_NAMES = ("metadata.jsonl", "metadata.csv")
PARQUET_TABLE_NAME = "metadata.parquet"


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
    with opened(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def opened(path: str) -> Iterator[Any]:
    """The table opened for reading; a failure to open or read it (a missing object, no
    permission: remote filesystems may say so only at the first read) is an ``OptionsError``."""
    try:
        with open_to_read(path) as f:
            yield f
    except (OptionsError, UnicodeDecodeError):
        raise
    except Exception as e:
        raise OptionsError(f"cannot read --metadata {path}: {e}") from e



def delimited_records(path: str, text: io.TextIOBase, fmt: str) -> Iterator[tuple[Any, int]]:
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


def json_records(path: str, text: io.TextIOBase) -> Iterator[tuple[Any, int]]:
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

