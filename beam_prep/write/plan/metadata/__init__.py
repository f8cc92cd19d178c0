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

Its modules, by job: ``formats`` (which files are tables, their text as records),
``columns`` (the columns with a meaning, their values checked), ``kinds`` (each
other column's one type), ``reader`` (a whole table read, row by row, spilled) and
``table`` (a read table; the tables of each split folder as one).
"""
from __future__ import annotations

from beam_prep.write.plan.metadata.columns import FILE_NAME, LABEL, LABELS, SPLIT
from beam_prep.write.plan.metadata.formats import (
    FORMATS,
    PARQUET_TABLE_NAME,
    SPLIT_TABLE_NAMES,
    check_path,
    file_sha256,
)
from beam_prep.write.plan.metadata.reader import read_table
from beam_prep.write.plan.metadata.table import MetadataRow, Table, combine_tables

__all__ = [
    "FILE_NAME",
    "FORMATS",
    "LABEL",
    "LABELS",
    "PARQUET_TABLE_NAME",
    "SPLIT",
    "SPLIT_TABLE_NAMES",
    "MetadataRow",
    "Table",
    "check_path",
    "combine_tables",
    "file_sha256",
    "read_table",
]
