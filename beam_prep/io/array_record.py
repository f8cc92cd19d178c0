"""ArrayRecord shards: the writer's options, and a shard written anywhere Beam can write.

The library writes only to a local path, so a gs:// shard is written locally and copied up
through Beam's ``FileSystems``. Why ``WRITER_OPTIONS`` are what they are:
docs/design/array-record.md.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from beam_prep.errors import StorageError
from beam_prep.io.libraries import require
from beam_prep.io.storage import is_local, storage_error
from beam_prep.io.tfrecord import Checksum, shard_writer

__all__ = ["WRITER_OPTIONS", "count_records", "read_records", "shard_records"]

WRITER_OPTIONS = "group_size:1,uncompressed,max_parallelism:1"
_NEEDED_FOR = "--file_format array_record"
_CHUNK = 1 << 20
_BATCH = 256  # records read at once


@contextlib.contextmanager
def shard_records(path: str, checksum: Checksum | None = None,
                  shown_as: str | None = None) -> Iterator[Callable[[bytes], None]]:
    """An ArrayRecord file at ``path`` (local or any Beam filesystem), as a function that writes one record.

    ``checksum``, if given, gets the finished file's bytes; ``shown_as`` is the
    path errors name. Nothing is left at ``path`` by a failed write but what a
    failed write of any shard leaves: a file under its temporary name.

    Raises:
      OptionsError: the ``array_record`` library is not installed.
      StorageError: the file cannot be written, naming it.
    """
    module = require("array_record", _NEEDED_FOR)
    local = path if is_local(path) else None
    stage = None
    if local is None:
        stage = tempfile.mkdtemp(prefix="beam-prep-array-record-")
        local = os.path.join(stage, "shard.array_record")
    try:
        try:
            writer = module.ArrayRecordWriter(local, WRITER_OPTIONS)
        except Exception as e:  # the C++ writer raises ValueError or RuntimeError
            raise storage_error("write", shown_as or path, e) from e
        def write(record: bytes) -> None:  # a failed write names the file, wherever it is made
            try:
                writer.write(record)
            except Exception as e:  # the C++ writer raises ValueError or RuntimeError
                raise storage_error("write", shown_as or path, e) from e

        try:
            yield write
        finally:
            try:
                writer.close()
            except Exception as e:  # its last block: the disk may be full
                raise storage_error("write", shown_as or path, e) from e
        _copy(local, path if stage is not None else None, checksum, shown_as or path)
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)


def _copy(local: str, target: str | None, checksum: Checksum | None, shown_as: str) -> None:
    """Reads the finished local file once: into ``checksum``, and to ``target`` when it is remote."""
    if checksum is None and target is None:
        return
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(shard_writer(target, "none", checksum, shown_as)) if target else None
        try:
            with open(local, "rb") as f:
                while chunk := f.read(_CHUNK):
                    if out is not None:
                        out.write(chunk)
                    elif checksum is not None:
                        checksum.update(chunk)
        except OSError as e:
            raise storage_error("read back", shown_as, e) from e


def count_records(path: str, shown_as: str | None = None) -> int:
    """The records in an ArrayRecord file, from its footer; one not on local disk is copied here first.

    Raises:
      OptionsError: the ``array_record`` library is not installed.
      StorageError: the file cannot be read, naming it.
    """
    with _reader(path, shown_as) as reader:
        return reader.num_records()


def read_records(path: str, shown_as: str | None = None) -> Iterator[bytes]:
    """Each record of an ArrayRecord file, in order, ``_BATCH`` at a time; one not on local disk
    is copied here first.

    Raises:
      OptionsError: the ``array_record`` library is not installed.
      StorageError: the file cannot be read, naming it.
    """
    with _reader(path, shown_as) as reader:
        count = reader.num_records()
        for start in range(0, count, _BATCH):
            yield from reader.read(list(range(start, min(count, start + _BATCH))))


@contextlib.contextmanager
def _reader(path: str, shown_as: str | None) -> Iterator[Any]:
    """The library's reader of ``path``, copied to local disk first when remote; what it raises
    becomes a StorageError naming the file."""
    module = require("array_record", _NEEDED_FOR)
    where = shown_as or path
    with contextlib.ExitStack() as stack:
        local = path
        if not is_local(path):
            stage = tempfile.mkdtemp(prefix="beam-prep-array-record-")
            stack.callback(shutil.rmtree, stage, True)
            local = os.path.join(stage, "shard.array_record")
            _download(path, local, where)
        try:
            reader = module.ArrayRecordReader(local)
            try:
                yield reader
            finally:
                reader.close()  # raises, too, for a file it could not read whole
        except StorageError:
            raise
        except Exception as e:  # the C++ reader raises ValueError or RuntimeError
            raise storage_error("read", where, e) from e


def _download(path: str, local: str, shown_as: str) -> None:
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as src, open(local, "wb") as dst:
            shutil.copyfileobj(src, dst, _CHUNK)
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("read", shown_as, e) from e
