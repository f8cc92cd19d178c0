"""TFRecord files: how one record's bytes are laid out, and the stream a shard is written to.

The format is TensorFlow's (``tensorflow/core/lib/io/record_writer.cc``)::

    uint64 length        little-endian
    uint32 masked_crc32c(length bytes)
    bytes  data
    uint32 masked_crc32c(data)

Written here rather than through Beam's ``_TFRecordUtil``, which is private to
Beam and may change in any release; a dozen lines over ``google_crc32c`` (C; a
dependency of google-cloud-storage, which apache-beam[gcp] requires) frame as fast.
"""
from __future__ import annotations

import contextlib
import hashlib
import struct
from collections.abc import Iterator
from typing import BinaryIO

import google_crc32c
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from isal import igzip

from beam_prep.errors import DatasetError
from beam_prep.io.gzip_stream import GzipStream
from beam_prep.io.storage import storage_error

__all__ = ["GZIP_LEVEL", "Checksum", "count_records", "frame", "masked_crc32c", "read_records", "shard_writer",
           "write_record"]

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
# ISA-L at level 2: within about 1% of zlib's default level's output on the records the default
# command writes, for half of level 3's CPU and a small part of zlib's (benchmarks/bench_gzip.py;
# docs/performance/framing.md has the figures).
GZIP_LEVEL = 2


def masked_crc32c(data: bytes) -> int:
    """CRC32C of ``data``, rotated right by 15 bits plus a constant, as TFRecord stores it.

    The mask keeps a CRC computed over bytes that embed CRCs from being trivially weak.
    """
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """``data`` as one framed TFRecord."""
    length = _LENGTH.pack(len(data))
    return b"".join((length, _CRC.pack(masked_crc32c(length)), data, _CRC.pack(masked_crc32c(data))))


def write_record(f: BinaryIO, data: bytes) -> None:
    """Writes ``data`` to ``f`` as one TFRecord, in one ``write`` call."""
    f.write(frame(data))


class Checksum:
    """A shard's size and sha256, taken as its bytes are written (``shard_writer``) or read back."""

    def __init__(self) -> None:
        self._sha256 = hashlib.sha256()
        self.size = 0

    def update(self, data: bytes) -> None:
        self._sha256.update(data)
        self.size += len(data)

    def hexdigest(self) -> str:
        return self._sha256.hexdigest()


class _Named:
    """A file whose failed write raises StorageError naming it, wherever the write is made: a sink
    holds its shard open across calls (``contextlib.ExitStack``), outside the ``with`` of
    ``shard_writer``, whose own handler then never sees the error."""

    def __init__(self, raw: BinaryIO, shown_as: str) -> None:
        self._raw = raw
        self._shown_as = shown_as

    def write(self, data: bytes) -> int:
        try:
            return self._raw.write(data)
        except OSError as e:
            raise storage_error("write", self._shown_as, e) from e

    def flush(self) -> None:
        try:
            self._raw.flush()
        except OSError as e:
            raise storage_error("write", self._shown_as, e) from e


class _Checksummed:
    """A file whose written bytes also go to a ``Checksum``."""

    def __init__(self, raw: BinaryIO, checksum: Checksum) -> None:
        self._raw = raw
        self._checksum = checksum

    def write(self, data: bytes) -> int:
        self._checksum.update(data)
        return self._raw.write(data)

    def flush(self) -> None:
        self._raw.flush()


@contextlib.contextmanager
def shard_writer(path: str, compression: str, checksum: Checksum | None = None,
                 shown_as: str | None = None) -> Iterator[BinaryIO]:
    """A shard file; GZIP is a standard stream, as Beam's sinks write, its chunks deflated by ISA-L
    where that shrinks them enough to repay a reader's inflate, stored where not (``gzip_stream``).

    ``checksum``, if given, gets every byte the file gets;
    ``shown_as`` is the path errors name (a shard written under a temporary name
    is named by its final one).

    The GZIP header holds no time and no file name (as zlib's, which Beam's
    sink uses), so a rerun writes byte-identical files. A failed write raises
    StorageError naming the file, wherever it is made: the job's one-line error says which.
    """
    try:
        with FileSystems.create(path, mime_type="application/octet-stream",
                                compression_type=CompressionTypes.UNCOMPRESSED) as opened:
            raw: BinaryIO = _Named(opened, shown_as or path)  # type: ignore[assignment]
            if checksum is not None:
                raw = _Checksummed(raw, checksum)
            if compression == "none":
                yield raw
                return
            with GzipStream(raw, GZIP_LEVEL) as f:
                yield f
    except OSError as e:
        raise storage_error("write", shown_as or path, e) from e


def count_records(path: str, compression: str) -> int:
    """The records in a shard, counted by their framing: each length is checked
    against its CRC and the payload skipped, not parsed.

    For a shard whose writer could not count (the shuffle sink's, Beam's file sink): the
    manifest's per-shard counts are what TFDS, ``verify`` and the reader's
    cardinality rely on.

    Raises:
      DatasetError: a record cut short or a damaged length, naming the file.
      StorageError: the file cannot be read.
    """
    return sum(1 for _ in _frames(path, compression, check_data=False))


def read_records(path: str, compression: str) -> Iterator[bytes]:
    """Each record of a shard (local or gs://), in order, its length and data checked against
    their CRCs: what a shard rewritten without some of its records is read with
    (``finish.drop``), without TensorFlow.

    Raises:
      DatasetError: a record cut short or damaged, naming the file.
      StorageError: the file cannot be read.
    """
    return _frames(path, compression, check_data=True)


def _frames(path: str, compression: str, check_data: bool) -> Iterator[bytes]:
    header_size = _LENGTH.size + _CRC.size
    try:
        with FileSystems.open(path, mime_type="application/octet-stream",
                              compression_type=CompressionTypes.UNCOMPRESSED) as raw:
            f = igzip.IGzipFile(fileobj=raw, mode="rb") if compression == "gzip" else raw
            count = 0
            while header := f.read(header_size):
                if len(header) < header_size:
                    raise DatasetError(f"{path}: record {count} is cut short")
                (length,) = _LENGTH.unpack_from(header)
                (crc,) = _CRC.unpack_from(header, _LENGTH.size)
                if masked_crc32c(header[:_LENGTH.size]) != crc:
                    raise DatasetError(f"{path}: record {count} has a damaged length")
                body = f.read(length + _CRC.size)
                if len(body) < length + _CRC.size:
                    raise DatasetError(f"{path}: record {count} is cut short")
                data = body[:length]
                if check_data and masked_crc32c(data) != _CRC.unpack_from(body, length)[0]:
                    raise DatasetError(f"{path}: record {count} is damaged (its CRC does not match)")
                yield data
                count += 1
    except OSError as e:
        raise storage_error("read", path, e) from e
