"""``WriteShards``: Beam's file sink for a PCollection of records in any ``--file_format``.

The shuffle sink's writer: Beam's ``FileBasedSink`` names, stages and renames
the shard files (``SHARD_TEMPLATE``; each worker writes a temporary file that
the sink renames into place once every one is complete, as ``WriteToTFRecord``
does), and ``shard_formats.ShardFormat`` writes each file, as the streaming sink's
workers write theirs: so a record's bytes and a shard's framing have one
implementation for both sinks. An ArrayRecord shard bound for gs:// is written
on the worker's disk and uploaded when closed (``io.array_record``).

Each shard's size and sha256 are taken as its bytes are written (``tfrecord.Checksum``;
ArrayRecord's writer is a C++ library: its finished local file is read once, as
the streaming sink does). Beam's writer can hand on only the temporary file's path,
so ``close`` leaves the checksum beside it (as ``ShardFormat.records`` leaves a shard's
companions, its DALI index, which ``finalize_write`` moves to the final names) (``<temp>.checksum.json``) and
``finalize_write``, which renames the temporary files, outputs each shard's final
path, size and sha256 (``WrittenShard``): the manifest's ``shard_bytes`` and ``shard_sha256``.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from apache_beam.coders import BytesCoder
from apache_beam.io.filebasedsink import FileBasedSink
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.iobase import Write

from beam_prep.io.storage import read_bytes
from beam_prep.io.tfrecord import Checksum
from beam_prep.model.dataset import shard_suffix
from beam_prep.write.shared.shard_formats import shard_format

__all__ = ["FormatSink", "WrittenShard", "write_shards", "written_shard"]


class _Open(NamedTuple):
    """A shard being written: its context (closed once, by ``close``), its write function,
    its temporary path and the checksum of the bytes written so far."""

    context: contextlib.ExitStack
    write: Callable[[bytes], None]
    path: str
    checksum: Checksum


def _checksum_path(temp_path: str) -> str:
    return temp_path + ".checksum.json"


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
        checksum = Checksum()
        write = context.enter_context(shard_format(self.file_format).records(temp_path, self.compression, checksum))
        return _Open(context, write, temp_path, checksum)

    def write_encoded_record(self, file_handle: _Open, encoded_value: bytes) -> None:
        file_handle.write(encoded_value)

    def close(self, file_handle: _Open) -> None:
        file_handle.context.close()
        about = {"size": file_handle.checksum.size, "sha256": file_handle.checksum.hexdigest()}
        with FileSystems.create(_checksum_path(file_handle.path), mime_type="application/json") as f:
            f.write(json.dumps(about).encode("utf-8"))

    def finalize_write(self, init_result: Any, writer_results: list[str],
                       pre_finalize_results: Any) -> Iterator[str]:
        """Renames the shards into place (Beam's own step) and outputs each one's ``WrittenShard``
        as JSON (Beam's ``Write`` outputs strings): read it with ``written_shard``.

        Beam names shard ``i`` after the ``i``-th of the sorted temporary paths; their
        checksums are read before the renames, as Beam then removes the temporary folder.
        """
        temps = sorted(writer_results)
        finals = [self._get_final_name(i, len(temps)) for i in range(len(temps))]
        checksums = {final: json.loads(read_bytes(_checksum_path(temp))) for final, temp in zip(finals, temps)}
        # The shards' companions (a DALI index: ShardFormat.companions) are moved here, before Beam
        # removes the temporary folder; each shard then follows its own, by Beam's rename.
        fmt = shard_format(self.file_format)
        sources = [c for temp in temps for c in fmt.companions(temp, self.compression)]
        if sources:
            FileSystems.rename(sources, [c for final in finals for c in fmt.companions(final, self.compression)])
        for path in super().finalize_write(init_result, writer_results, pre_finalize_results):
            yield json.dumps({"path": path, **checksums[path]})


class WrittenShard(NamedTuple):
    """A shard Beam's file sink wrote: its final path, size in bytes and sha256."""

    path: str
    size: int
    sha256: str


def written_shard(text: str) -> WrittenShard:
    """A ``WrittenShard`` from what ``write_shards`` outputs."""
    row = json.loads(text)
    return WrittenShard(str(row["path"]), int(row["size"]), str(row["sha256"]))


def write_shards(file_path_prefix: str, file_format: str, compression: str, num_shards: int,
                 shard_name_template: str) -> Write:
    """The transform that writes a PCollection of payloads as shards and outputs each one's
    ``WrittenShard`` as JSON (``written_shard`` reads it); arguments as ``FormatSink``'s."""
    return Write(FormatSink(file_path_prefix, file_format, compression, num_shards, shard_name_template))
