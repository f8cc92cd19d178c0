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

import re
from collections.abc import Iterable

__all__ = ["FRAMING", "PREFIX", "SUFFIX", "Index", "extent", "index_name", "index_text", "parse_index"]

PREFIX = "dali-"
SUFFIX = ".idx"
# The bytes TFRecord adds around a record's data: uint64 length, its masked CRC, the data's masked CRC.
FRAMING = 16
_LINE = re.compile(rb"([0-9]+) ([0-9]+)")
_SHOWN = 40  # the bytes of a bad line a message shows


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
    """``(offset, size)`` per line of an index file, each line exactly as ``index_text`` writes it:
    two decimal integers, one space between, a line break after. DALI reads no other form as its
    writer meant it: it stops at the first line it cannot parse and skips blank ones, reading fewer
    (or other) records than the file seems to list, with no error.

    Raises:
      ValueError: a line of another form, or a last line without its line break.
    """
    if text and not text.endswith(b"\n"):
        raise ValueError("its last line has no line break (cut short?)")
    rows = []
    for number, line in enumerate(text.split(b"\n")[:-1], 1):
        fields = _LINE.fullmatch(line)
        if fields is None:
            shown = repr(line[:_SHOWN] + (b"..." if len(line) > _SHOWN else b""))[1:]  # escaped, as str's
            raise ValueError(f"line {number} is {shown}, not '<offset> <size>'")
        rows.append((int(fields[1]), int(fields[2])))
    return rows


def extent(text: bytes) -> tuple[int, int]:
    """``(records, end)`` of an index file, checked whole: its line count, and its last line's offset
    plus size (the shard's length, were the index its own; 0 for an empty index). Each line is
    ``parse_index``'s form, the first record starts at 0, each next one where the one before it
    ends, and none is smaller than a record's framing.

    Raises:
      ValueError: a line that is not ``parse_index``'s form, or whose offset or size could not be
        a record's of one shard; naming the line.
    """
    end = 0
    rows = parse_index(text)
    for number, (offset, size) in enumerate(rows, 1):
        if offset != end:
            raise ValueError(f"line {number} says offset {offset}, but the record before it ends at byte {end}")
        if size < FRAMING:
            raise ValueError(f"line {number} says size {size}, less than a record's framing ({FRAMING} bytes)")
        end += size
    return len(rows), end


class Index:
    """The lengths of the records written to a shard so far, for ``index_text``."""

    def __init__(self) -> None:
        self.lengths: list[int] = []

    def add(self, data: bytes) -> None:
        self.lengths.append(len(data))

    def text(self) -> bytes:
        return index_text(self.lengths)
