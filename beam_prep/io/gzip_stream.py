"""A GZIP stream whose stretches that deflate hardly shrinks are stored, not deflated.

Every reader of a ``.gz`` shard inflates it on every epoch of training, and
inflating Huffman-coded bytes costs TensorFlow's reader as much per byte
whether they shrank by half or by 4%. JPEG records, what the default command
writes, shrink by about 4% (their pixels are entropy-coded already), and their
inflate cost the reader about a tenth of its CPU (docs/design/sinks.md). So the
stream is written a chunk (``CHUNK``) at a time: a chunk that deflate shrinks by
at least ``MIN_SAVING`` is written deflated, any other as stored blocks (what
zlib itself does with a block deflate would enlarge), which a reader copies.
Raw pixels shrink by about 15% on average, unevenly: their chunks that
save 10% or more stay deflated, the rest are stored (a raw shard comes out
larger than at a plain ISA-L level, and reads faster).

The file is a standard GZIP member (RFC 1952, deflate as RFC 1951 has it): any
GZIP reader reads it, TensorFlow's ``compression_type="GZIP"`` included. Each
deflated chunk ends with a full flush, so none refers back to a stored one;
that costs a chunk's first matches (a 32 KiB window in a 128 KiB chunk), nothing
measurable. After a stored chunk, the next ``SKIP_AFTER_STORED`` are stored
without trying (a shard's records are all of a kind), so a JPEG shard costs its
writer a few tries at deflate, not one a chunk. The header has no name and no
time, so a rerun writes the same bytes.
"""
from __future__ import annotations

import struct
from typing import BinaryIO

from isal import isal_zlib

__all__ = ["CHUNK", "MIN_SAVING", "SKIP_AFTER_STORED", "GzipStream"]

CHUNK = 128 * 1024
MIN_SAVING = 0.10
SKIP_AFTER_STORED = 7
# RFC 1952: magic, deflate, no flags, mtime 0, no extra flags, OS unknown (as zlib and ISA-L write it).
_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
_STORED_MAX = 0xFFFF  # the most a stored block holds
_STORED_HEADER = struct.Struct("<BHH")  # BFINAL and BTYPE 00 in a byte of its own, LEN, NLEN
_TRAILER = struct.Struct("<II")  # CRC-32 and size mod 2**32 of the uncompressed bytes


# The stream's last block: stored, final and empty, after the last chunk's own blocks.
_FINAL_BLOCK = _STORED_HEADER.pack(1, 0, 0xFFFF)


def _stored(data: memoryview | bytes) -> bytes:
    """``data`` as stored (not final) deflate blocks, starting on a byte boundary (after a full flush)."""
    pieces = []
    for start in range(0, len(data), _STORED_MAX):
        piece = data[start:start + _STORED_MAX]
        pieces += (_STORED_HEADER.pack(0, len(piece), len(piece) ^ 0xFFFF), piece)
    return b"".join(pieces)


class GzipStream:
    """A writable GZIP file over ``raw`` (closed by ``close``, which leaves ``raw`` open).

    Args:
      raw: where the GZIP bytes go.
      level: ISA-L's compression level for the chunks it deflates.
    """

    def __init__(self, raw: BinaryIO, level: int) -> None:
        self._raw = raw
        self._deflate = isal_zlib.compressobj(level, isal_zlib.DEFLATED, -isal_zlib.MAX_WBITS)
        self._pending = bytearray()
        self._crc = 0
        self._size = 0
        self._skip = 0
        self._closed = False
        raw.write(_HEADER)

    def write(self, data: bytes) -> int:
        if self._closed:
            raise ValueError("write to a closed GzipStream")
        self._crc = isal_zlib.crc32(data, self._crc)
        self._size += len(data)
        self._pending += data
        if len(self._pending) >= CHUNK:
            view = memoryview(self._pending)
            whole = len(view) - len(view) % CHUNK
            for start in range(0, whole, CHUNK):
                self._raw.write(self._chunk(view[start:start + CHUNK]))
            view.release()
            del self._pending[:whole]
        return len(data)

    def _chunk(self, chunk: memoryview) -> bytes:
        """One chunk's deflate blocks, ending on a byte boundary, none referring to bytes before it."""
        if self._skip:
            self._skip -= 1
            return _stored(chunk)
        deflated = self._deflate.compress(chunk) + self._deflate.flush(isal_zlib.Z_FULL_FLUSH)
        if len(deflated) <= len(chunk) * (1 - MIN_SAVING):
            return deflated
        self._skip = SKIP_AFTER_STORED
        return _stored(chunk)

    def flush(self) -> None:
        self._raw.flush()

    def close(self) -> None:
        """Writes the rest, the final block and the trailer; ``raw`` stays open."""
        if self._closed:
            return
        self._closed = True
        tail = memoryview(self._pending)
        if tail:
            self._raw.write(self._chunk(tail))
        tail.release()
        self._pending.clear()
        self._raw.write(_FINAL_BLOCK)
        self._raw.write(_TRAILER.pack(self._crc & 0xFFFFFFFF, self._size & 0xFFFFFFFF))

    def __enter__(self) -> GzipStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
