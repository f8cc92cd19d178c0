"""``WriteShards``: Beam's file sink for a PCollection of records in any ``--file_format``.

The shuffle sink's writer: Beam's ``FileBasedSink`` names, stages and renames
the shard files (``SHARD_TEMPLATE``; each worker writes a temporary file that
the sink renames into place once every one is complete, as ``WriteToTFRecord``
does), and ``shard_formats.ShardFormat`` writes each file, as the streaming sink's
workers write theirs: so a record's bytes and a shard's framing have one
implementation for both sinks. An ArrayRecord shard bound for gs:// is written
on the worker's disk and uploaded when closed (``io.array_record``).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import NamedTuple

from apache_beam.coders import BytesCoder
from apache_beam.io.filebasedsink import FileBasedSink
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.iobase import Write

from beam_prep.model.dataset import shard_suffix
from beam_prep.write.shared.shard_formats import shard_format

__all__ = ["FormatSink", "write_shards"]


class _Open(NamedTuple):
    """A shard being written: its context (closed once, by ``close``) and its write function."""

    context: contextlib.ExitStack
    write: Callable[[bytes], None]


class FormatSink(FileBasedSink):
    """A ``FileBasedSink`` of payloads (``shard_formats.ShardFormat.payload``) in one format.

    Args:
      file_path_prefix: each shard's path before its shard name and suffix (``<work>/<split>``).
      file_format: a key of ``formats.FILE_FORMATS``.
      compression: ``gzip`` or ``none`` (tfrecord only; the format writes it, not Beam).
      num_shards: the shard count; 0 lets the runner choose.
      shard_name_template: ``layout.SHARD_TEMPLATE``.
    """

    def __init__(self, file_path_prefix: str, file_format: str, compression: str, num_shards: int,
                 shard_name_template: str) -> None:
        super().__init__(file_path_prefix, coder=BytesCoder(),
                         file_name_suffix=shard_suffix(file_format, compression), num_shards=num_shards,
                         shard_name_template=shard_name_template, mime_type="application/octet-stream",
                         compression_type=CompressionTypes.UNCOMPRESSED)
        self.file_format = file_format
        self.compression = compression

    def open(self, temp_path: str) -> _Open:
        context = contextlib.ExitStack()
        write = context.enter_context(shard_format(self.file_format).records(temp_path, self.compression))
        return _Open(context, write)

    def write_encoded_record(self, file_handle: _Open, encoded_value: bytes) -> None:
        file_handle.write(encoded_value)

    def close(self, file_handle: _Open) -> None:
        file_handle.context.close()


def write_shards(file_path_prefix: str, file_format: str, compression: str, num_shards: int,
                 shard_name_template: str) -> Write:
    """The transform that writes a PCollection of payloads as shards and outputs their paths;
    arguments as ``FormatSink``'s."""
    return Write(FormatSink(file_path_prefix, file_format, compression, num_shards, shard_name_template))
