"""DALI's index of an uncompressed TFRecord shard: a text line ``"<offset> <size>"`` per record.

NVIDIA DALI's ``fn.readers.tfrecord`` needs one index file per shard (``index_path``), in the
format its ``tfrecord2idx`` script writes: each record's byte offset in the shard and its framed
size (length, its CRC, the data, its CRC: the data's length plus 16), one record a line, in shard
order. The ``tfrecord`` package for PyTorch reads the same files. The writer knows every
record's length while it writes, so it writes the index beside the shard (``dali-<shard>.idx``: ``index_name``) at
the cost of a line a record, instead of a second pass that reads the whole shard back (and
``tfrecord2idx`` imports TensorFlow). GZIP shards have no index: DALI reads uncompressed
TFRecords only.
"""
from __future__ import annotations

from collections.abc import Iterable

__all__ = ["FRAMING", "PREFIX", "SUFFIX", "Index", "extent", "index_name", "index_text", "parse_index"]

PREFIX = "dali-"
SUFFIX = ".idx"
# The bytes TFRecord adds around a record's data: uint64 length, its masked CRC, the data's masked CRC.
FRAMING = 16


def index_name(shard: str) -> str:
    """The index file of a shard (a name, a path or a pattern): beside it, ``PREFIX`` before its
    name and ``SUFFIX`` after, so that ``dali-train-00000-of-00004.tfrecord.idx`` indexes
    ``train-00000-of-00004.tfrecord``.

    The prefix keeps the index out of the patterns training code finds its shards with
    (``train-*``, ``train*``: TPU ResNet's, the Model Garden's, TF-slim's), which would
    otherwise read an index as a shard (``DataLossError: corrupted record``).
    """
    folder, sep, name = shard.rpartition("/")
    return f"{folder}{sep}{PREFIX}{name}{SUFFIX}"


def index_text(lengths: Iterable[int]) -> bytes:
    """The index of a shard whose records' data have ``lengths``, in order."""
    lines, offset = [], 0
    for length in lengths:
        size = length + FRAMING
        lines.append(f"{offset} {size}\n")
        offset += size
    return "".join(lines).encode("ascii")


def parse_index(text: bytes) -> list[tuple[int, int]]:
    """``(offset, size)`` per line of an index file.

    Raises:
      ValueError: a line that is not two integers.
    """
    rows = []
    for number, line in enumerate(text.decode("ascii").splitlines(), 1):
        fields = line.split()
        if len(fields) != 2:
            raise ValueError(f"line {number} is {line!r}, not '<offset> <size>'")
        rows.append((int(fields[0]), int(fields[1])))
    return rows


def extent(text: bytes) -> tuple[int, int]:
    """``(records, end)`` of an index file: its line count, and its last line's offset plus size (the
    shard's length, were the index its own; 0 for an empty index), without parsing the other lines.

    Raises:
      ValueError: a last line that is not two integers, or a last line without its line break.
    """
    if not text:
        return 0, 0
    if not text.endswith(b"\n"):
        raise ValueError("its last line has no line break (cut short?)")
    last = text[text.rfind(b"\n", 0, len(text) - 1) + 1:]
    fields = last.split()
    if len(fields) != 2 or not all(field.isdigit() for field in fields):
        raise ValueError(f"its last line is {last.rstrip()!r}, not '<offset> <size>'")
    offset, size = (int(field) for field in fields)
    return text.count(b"\n"), offset + size


class Index:
    """The lengths of the records written to a shard so far, for ``index_text``."""

    def __init__(self) -> None:
        self.lengths: list[int] = []

    def add(self, data: bytes) -> None:
        self.lengths.append(len(data))

    def text(self) -> bytes:
        return index_text(self.lengths)
