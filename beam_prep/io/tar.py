"""Tar archives written a member at a time, byte for byte the same on every run.

A WebDataset shard is a plain tar file; a sample is its members that share a
key (``<key>.jpg``, ``<key>.cls``, ``<key>.json``). Each member is encoded here
on its own (header, data, padding to 512 bytes), so a worker can encode a
record's members where it makes the record and a shard is their concatenation
and ``END``. The headers hold no time, owner or permissions of this machine
(``mtime`` 0, uid/gid 0, no user or group names, mode 0644): a rerun writes the
same bytes, which resuming a run relies on.
"""
from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Iterator
from typing import BinaryIO

from beam_prep.io.storage import storage_error

__all__ = ["BLOCK", "END", "count_samples", "member", "read_members", "samples", "webdataset_key"]

BLOCK = 512
# The end of an archive: two zero blocks.
END = b"\0" * (2 * BLOCK)


def webdataset_key(filename: str) -> str:
    """A WebDataset sample's ``__key__``: a hash of its record's file name, the same on every run.

    WebDataset takes a member's key to be its name up to the first dot, and
    joins consecutive members with one key into a sample, so a key must hold no
    dot and differ between records; file names may hold dots, and are unique
    within a dataset. The name itself is in the sample's json.
    """
    return hashlib.sha256(filename.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def member(name: str, data: bytes) -> bytes:
    """One regular file of a tar archive: its USTAR header, ``data``, and zeros to a whole block.

    Raises:
      ValueError: ``name`` does not fit a USTAR header (over 100 bytes, or not ASCII).
    """
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    try:
        header = info.tobuf(tarfile.USTAR_FORMAT, encoding="ascii", errors="strict")
    except (UnicodeEncodeError, tarfile.HeaderError) as e:
        raise ValueError(f"tar member name {name!r} does not fit a USTAR header: {e}") from e
    return b"".join((header, data, b"\0" * (-len(data) % BLOCK)))


def read_members(f: BinaryIO) -> Iterator[tuple[str, bytes]]:
    """Each regular file of the tar stream ``f`` as ``(name, data)``, in order, to the end-of-archive block.

    Read header by header rather than with ``tarfile``'s stream mode, which takes
    a file cut short at a member's edge for a whole archive: here a stream that
    ends before its end-of-archive block is cut short.

    Raises:
      ValueError: the stream is cut short or a header is damaged (its checksum), saying where.
    """
    offset = 0
    while True:
        header = f.read(BLOCK)
        if header == b"\0" * BLOCK:
            return
        if len(header) < BLOCK:
            raise ValueError(f"cut short at byte {offset + len(header)}: no end-of-archive block")
        try:
            info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
        except tarfile.HeaderError as e:
            raise ValueError(f"damaged header at byte {offset}: {e}") from e
        padded = info.size + (-info.size % BLOCK)
        body = f.read(padded)
        if len(body) < padded:
            raise ValueError(f"cut short in member {info.name!r} (at byte {offset})")
        offset += BLOCK + padded
        if info.isreg():
            yield info.name, body[:info.size]


def samples(f: BinaryIO) -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    """The tar stream ``f``'s samples in order, as WebDataset joins them: ``(key, [(name, data), ...])``
    for each run of consecutive members whose names share a key (the base name up to its first dot).

    Raises:
      ValueError: as ``read_members``.
    """
    key, members = None, []
    for name, data in read_members(f):
        this = name.rsplit("/", 1)[-1].partition(".")[0]
        if this != key and key is not None:
            yield key, members
            members = []
        key = this
        members.append((name, data))
    if key is not None:
        yield key, members


def count_samples(path: str) -> int:
    """The samples of the tar file ``path`` (any Beam filesystem), as ``samples`` groups them: a
    WebDataset shard's records, with or without a ``cls`` member (a dataset without labels has none).

    Raises:
      StorageError: the file cannot be read or is not a whole tar file, naming it.
    """
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            return sum(1 for _ in samples(f))
    except Exception as e:  # each filesystem raises its own types, tarfile its own.
        raise storage_error("read", path, e) from e
