"""TFRecord framing: how one record's bytes are laid out in a shard file.

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

import struct
from typing import BinaryIO

import google_crc32c

__all__ = ["frame", "masked_crc32c", "write_record"]

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8


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
