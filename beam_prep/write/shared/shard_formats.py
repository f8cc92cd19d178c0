"""``--file_format``: what one record becomes, and how a shard of records is written.

Both sinks write every format through this one small interface
(``ShardFormat``): ``payload`` turns a converted image into the bytes a shard
stores for it, where the record is made (``examples.make_example``), and
``records`` opens a shard and returns the function that appends one payload.

* ``tfrecord``: a serialized ``tf.train.Example`` in TFRecord framing, GZIP or not; an
  uncompressed shard gets DALI's index beside it (``io.dali_index``: ``dali-<shard>.idx``), one of
  the shard's ``companions``, which every step that renames or removes a shard moves with it.
* ``array_record``: the same ``tf.train.Example``, in an ArrayRecord file (as
  TFDS writes ``file_format=array_record``), for Grain's random access.
* ``webdataset``: a tar sample per record, ``<key>.<jpg|png|raw>``, ``<key>.cls``
  (the stored label id as text) and ``<key>.json`` (file name, label text,
  sha256 and size of the source, image size), as ``webdataset.WebDataset`` reads.
"""
from __future__ import annotations

import abc
import contextlib
import io
import json
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_prep.io import array_record, dali_index, tar
from beam_prep.io.libraries import LIBRARIES, Library, require
from beam_prep.io.storage import storage_error
from beam_prep.io.tfrecord import Checksum, count_records, read_records, shard_writer, write_record
from beam_prep.model.dataset import FILE_FORMATS, TFRECORD
from beam_prep.model.features import (
    CHANNELS,
    ENCODED,
    FORMAT,
    HEIGHT,
    NO_LABEL,
    WIDTH,
    ImageRecord,
    decode_example,
    encode_example,
    sha256_and_filename,
    sha256_and_labels,
)

__all__ = ["FILE_FORMATS", "ShardFormat", "StoredImage", "check_installed", "dali_indexed", "shard_format", "writer_library"]

# The image member's extension per stored format: what webdataset's decoders key on.
_EXTENSIONS = {"jpeg": "jpg", "png": "png", "raw": "raw"}


class StoredImage(NamedTuple):
    """A record's image as its shard stores it: the bytes, their format (``jpeg``, ``png``, ``raw``) and size."""

    data: bytes
    image_format: str
    height: int
    width: int
    channels: int


class ShardFormat(abc.ABC):
    """One ``--file_format``: the bytes of a record, and a shard file of them."""

    name: str

    @abc.abstractmethod
    def payload(self, record: ImageRecord, source_size: int) -> bytes:
        """What a shard stores for ``record``; ``source_size`` is its source file's size in bytes."""

    @abc.abstractmethod
    def records(self, path: str, compression: str, checksum: Checksum | None = None,
                shown_as: str | None = None) -> contextlib.AbstractContextManager[Callable[[bytes], None]]:
        """A shard file at ``path`` (local or gs://), as a function that appends one payload.

        ``checksum`` gets the shard's bytes; ``shown_as`` is the path errors name.

        Raises:
          StorageError: the file cannot be written, naming it.
        """

    @abc.abstractmethod
    def read(self, path: str, compression: str) -> Iterator[bytes]:
        """Each payload of the shard at ``path``, in order, as ``payload`` made it: what a shard
        rewritten without some of its records (``finish.drop``) is read with.

        Raises:
          DatasetError, StorageError: a damaged or unreadable shard, naming it.
        """

    @abc.abstractmethod
    def identity(self, payload: bytes, multi_label: bool) -> tuple[str, tuple[str, ...]]:
        """A payload's source sha256 (hex) and the label names it counts under in class_counts
        (``("",)`` for a record without labels); ``multi_label``: the dataset's records have several."""

    def source(self, payload: bytes) -> tuple[str, str]:
        """A payload's source sha256 (hex) and file name (its path under the run's input)."""
        return sha256_and_filename(payload)

    def stored_image(self, payload: bytes) -> StoredImage:
        """A payload's image as stored (what an append hashes a dataset's records by, where the dataset
        keeps no hash lines)."""
        example = decode_example(payload)
        return StoredImage(example[ENCODED], example[FORMAT].decode(), example[HEIGHT], example[WIDTH],
                           example[CHANNELS])

    @abc.abstractmethod
    def count(self, path: str, compression: str) -> int:
        """The records in the shard at ``path``: for the shuffle sink, whose writer cannot count them.

        Raises:
          DatasetError, StorageError: a damaged or unreadable shard, naming it.
        """

    def companions(self, path: str, compression: str) -> tuple[str, ...]:
        """The files ``records`` writes beside the shard at ``path`` (none by default): a step that
        renames, publishes or removes the shard does the same to each (``shard_files``)."""
        return ()

    def shard_files(self, path: str, compression: str) -> list[str]:
        """The shard at ``path`` and its ``companions``: what moves together."""
        return [path, *self.companions(path, compression)]


class _TFRecord(ShardFormat):
    name = TFRECORD

    def payload(self, record: ImageRecord, source_size: int) -> bytes:
        return encode_example(record)

    @contextlib.contextmanager
    def records(self, path, compression, checksum=None, shown_as=None) -> Iterator[Callable[[bytes], None]]:
        if not dali_indexed(self.name, compression):
            with shard_writer(path, compression, checksum, shown_as) as f:
                yield lambda payload: write_record(f, payload)
            return
        index = dali_index.Index()

        def write(payload: bytes) -> None:
            write_record(f, payload)
            index.add(payload)

        with shard_writer(path, compression, checksum, shown_as) as f:
            yield write
        _write_index(dali_index.index_name(path), index.text(), dali_index.index_name(shown_as or path))

    def read(self, path: str, compression: str) -> Iterator[bytes]:
        return read_records(path, compression)

    def companions(self, path: str, compression: str) -> tuple[str, ...]:
        return (dali_index.index_name(path),) if dali_indexed(self.name, compression) else ()

    def identity(self, payload: bytes, multi_label: bool) -> tuple[str, tuple[str, ...]]:
        return sha256_and_labels(payload)

    def count(self, path: str, compression: str) -> int:
        return count_records(path, compression)


class _ArrayRecord(ShardFormat):
    name = "array_record"

    def payload(self, record: ImageRecord, source_size: int) -> bytes:
        return encode_example(record)

    def records(self, path, compression, checksum=None, shown_as=None):
        return array_record.shard_records(path, checksum, shown_as)

    def read(self, path: str, compression: str) -> Iterator[bytes]:
        return array_record.read_records(path)

    def identity(self, payload: bytes, multi_label: bool) -> tuple[str, tuple[str, ...]]:
        return sha256_and_labels(payload)

    def count(self, path: str, compression: str) -> int:
        return array_record.count_records(path)


class _WebDataset(ShardFormat):
    name = "webdataset"

    def payload(self, record: ImageRecord, source_size: int) -> bytes:
        key = tar.webdataset_key(record.filename)
        about = {"filename": record.filename.encode("utf-8", "surrogateescape").decode("utf-8", "replace"),
                 "label": record.label, "label_text": record.label_text, "sha256": record.sha256,
                 "size": source_size, "height": record.height, "width": record.width,
                 "channels": record.channels, "format": record.image_format}
        labelled = record.label != NO_LABEL  # a dataset without labels: no .cls, no label in the .json
        if not labelled:
            del about["label"], about["label_text"]
        return b"".join((
            tar.member(f"{key}.{_EXTENSIONS[record.image_format]}", record.encoded),
            tar.member(f"{key}.cls", str(record.label).encode()) if labelled else b"",
            tar.member(f"{key}.json", json.dumps(about, ensure_ascii=False, sort_keys=True).encode("utf-8")),
        ))

    @contextlib.contextmanager
    def records(self, path, compression, checksum=None, shown_as=None) -> Iterator[Callable[[bytes], None]]:
        with shard_writer(path, "none", checksum, shown_as) as f:
            yield f.write
            f.write(tar.END)

    def read(self, path: str, compression: str) -> Iterator[bytes]:
        """Each sample's members encoded again (``tar.member``: the same bytes as written)."""
        try:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                for _, members in tar.samples(f):
                    yield b"".join(tar.member(name, data) for name, data in members)
        except Exception as e:  # each filesystem raises its own types, a damaged tar ValueError.
            raise storage_error("read", path, e) from e

    def identity(self, payload: bytes, multi_label: bool) -> tuple[str, tuple[str, ...]]:
        """From the sample's json: a multi-label record's ``label_text`` is its names joined by ";"."""
        about = _about(payload)
        text = about.get("label_text", "")  # none: a dataset without labels
        return about["sha256"], tuple(text.split(";")) if multi_label else (text,)

    def source(self, payload: bytes) -> tuple[str, str]:
        about = _about(payload)
        return about["sha256"], about["filename"]

    def stored_image(self, payload: bytes) -> StoredImage:
        members = dict(tar.read_members(io.BytesIO(payload + tar.END)))
        about = json.loads(next(data for name, data in members.items() if name.endswith(".json")))
        data = next(data for name, data in members.items() if name.rsplit(".", 1)[-1] in _EXTENSIONS.values())
        return StoredImage(data, about["format"], about["height"], about["width"], about["channels"])

    def count(self, path: str, compression: str) -> int:
        return tar.count_samples(path)


def _about(payload: bytes) -> dict[str, Any]:
    """A WebDataset sample's json member: its source's file name, sha256 and size, its label text."""
    return json.loads(next(data for name, data in tar.read_members(io.BytesIO(payload + tar.END))
                           if name.endswith(".json")))


def dali_indexed(file_format: str, compression: str) -> bool:
    """Whether shards of ``file_format`` and ``compression`` get a DALI index beside them: uncompressed
    TFRecords (DALI reads no GZIP; its WebDataset reader indexes a tar itself as it opens it)."""
    return file_format == TFRECORD and compression == "none"


def _write_index(path: str, text: bytes, shown_as: str) -> None:
    """A shard's DALI index, written once the shard is complete."""
    try:
        with FileSystems.create(path, mime_type="text/plain", compression_type=CompressionTypes.UNCOMPRESSED) as f:
            f.write(text)
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("write", shown_as, e) from e


_FORMATS: dict[str, ShardFormat] = {f.name: f for f in (_TFRecord(), _ArrayRecord(), _WebDataset())}
assert set(_FORMATS) == set(FILE_FORMATS)


def shard_format(name: str) -> ShardFormat:
    """The format ``--file_format name`` writes (a key of ``FILE_FORMATS``)."""
    return _FORMATS[name]


# The libraries a format needs to be written; webdataset's tar files need none but Python's.
_WRITER_LIBRARIES = {"array_record": "array_record"}


def writer_library(name: str) -> Library | None:
    """The optional library that writing format ``name`` needs on every worker, if any."""
    return LIBRARIES[_WRITER_LIBRARIES[name]] if name in _WRITER_LIBRARIES else None


def check_installed(name: str) -> None:
    """Refuses, before any work, a format whose writer's library is missing.

    Raises:
      OptionsError: with the command that installs it.
    """
    if name in _WRITER_LIBRARIES:
        require(_WRITER_LIBRARIES[name], f"--file_format {name}")
