"""Which files the reader reads: a dataset's manifest and split, or bare TFRecord files; this pipeline's share.

Everything here runs in Python before the ``tf.data`` graph is built, and
fails with typed errors naming what is missing: a manifest, a split, a shard,
files matching a pattern.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from beam_prep.errors import DatasetError, OptionsError, StorageError
from beam_prep.model.dataset import (
    READ_COMPRESSIONS,
    TFRECORD,
    DatasetInfo,
    ImageInfo,
    SplitInfo,
)
from beam_prep.reader.manifest_file import read_manifest_info
from beam_prep.reader.resolve import resolve_split

__all__ = ["RecordFiles", "Source", "load_info", "read_manifest", "resolve_source", "select_files",
           "tf_compression"]

_LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RecordFiles:
    """TFRecord files to read without a manifest: what the manifest would have said, given by hand.

    Pass it to :func:`~beam_prep.reader.make_dataset` in place of a dataset
    folder. A type of its own, rather than four arguments that only count
    when there is no folder, so that a folder and files cannot be mixed up.

    Args:
      files: paths or glob patterns (local or ``gs://``), read in sorted order.
      image: how the images are stored (``ImageInfo``); the reader cannot guess it, so it is required.
      num_classes: the label count; needed for one-hot labels, and checks each
        label id against it.
      compression: ``GZIP`` (what beam-prep writes by default), ``ZLIB`` or ``NONE``.
      label_offset: the stored id of the first label (``--label_offset``); the
        reader subtracts it, as it does with a manifest's.

    Raises:
      OptionsError: when made: no ``image``, or a count, offset or compression out of range.
    """

    files: str | Sequence[str]
    image: ImageInfo | None = None
    num_classes: int | None = None
    compression: str = "GZIP"
    label_offset: int = 0

    def __post_init__(self) -> None:
        if self.image is None:
            raise OptionsError("RecordFiles needs image=ImageInfo(height, width, channels, format): "
                               "without a manifest the reader cannot know how images are stored")
        if self.num_classes is not None and self.num_classes < 1:
            raise OptionsError(f"num_classes must be positive, not {self.num_classes}")
        if self.label_offset < 0:
            raise OptionsError(f"label_offset must be 0 or more, not {self.label_offset}")
        compression = str(self.compression).upper()
        if compression not in READ_COMPRESSIONS:
            raise OptionsError(f"compression must be one of {READ_COMPRESSIONS}, not {compression!r}")
        object.__setattr__(self, "compression", compression)
        patterns = (self.files,) if isinstance(self.files, str) else tuple(self.files)
        object.__setattr__(self, "files", patterns)


@dataclasses.dataclass(frozen=True)
class Source:
    """The files of a split (or matched by patterns) and what is known about them."""

    files: tuple[str, ...]
    image: ImageInfo
    num_classes: int | None
    compression: str
    num_examples: int | None
    shard_num_examples: tuple[int, ...] | None
    label_offset: int = 0  # subtracted from stored ids, so that ids index the labels from 0
    multi_label: bool = False  # each record holds a list of ids (DatasetInfo.multi_label)
    extra_features: Mapping[str, str] = dataclasses.field(default_factory=dict)  # key -> bytes, int64 or float


def load_info(path: str | os.PathLike) -> DatasetInfo:
    """Reads and checks ``path/manifest.json`` (local or ``gs://``).

    Use it to size a model before reading (``load_info(path).num_classes``), or to
    see what a dataset holds: its labels, splits, image spec, format and extra features.
    It imports no TensorFlow: a JAX or PyTorch host reads the manifest for free.

    Args:
      path: the dataset folder, the ``--output`` of the run that wrote it.

    Returns:
      A ``DatasetInfo``: ``labels``, ``num_classes``, ``splits`` (each with its shard
      files and record counts), ``image``, ``file_format``, ``multi_label``,
      ``extra_features``, as the manifest says (docs/reference/manifest.md).

    Raises:
      DatasetError: the folder does not exist, is a file (a shard given for its folder),
        or has no manifest (its pipeline has not finished: the manifest is written
        last), or one this reader cannot use.
      StorageError: the path cannot be read (permissions, network).
    """
    return read_manifest(path)[0]


def read_manifest(path: str | os.PathLike) -> tuple[DatasetInfo, dict[str, Any]]:
    """``load_info(path)`` and the whole manifest it was read from, from one read.

    The manifest also holds the writer's record of its run (counts, failures
    by stage, skipped files by reason), which tools such as ``beam-prep
    inspect`` show and the dataset model leaves out. Raises as ``load_info``.
    """
    text = os.fspath(path)
    return read_manifest_info(text.rstrip("/") or text)


def resolve_source(path: str | RecordFiles, split: str, version: int | None = None) -> Source:
    """The files to read and their description, from a dataset folder's manifest or from ``RecordFiles``."""
    if isinstance(path, RecordFiles):
        if version is not None:
            raise OptionsError("version= reads a dataset folder's versions (its manifest's); RecordFiles have none")
        return _match(path)
    if not isinstance(path, str):
        raise OptionsError(f"path must be a dataset folder or a RecordFiles, not {path!r}")
    info, s, _ = resolve_split(path, split, TFRECORD, "beam_prep.make_dataset", cache=False, version=version)
    if not s.files:
        raise DatasetError(f"split {split!r} of {info.root} has no shard files")
    _check_files_exist(info.root, s)
    return Source(s.files, info.image, info.num_classes, info.compression,
                  s.num_examples, s.shard_num_examples, info.label_offset, info.multi_label,
                  dict(info.extra_features))


def _match(files: RecordFiles) -> Source:
    import tensorflow as tf

    matched: list[str] = []
    for pattern in files.files:
        try:
            found = tf.io.gfile.glob(pattern)
        except tf.errors.NotFoundError:
            found = []
        except tf.errors.OpError as e:
            raise StorageError(f"cannot list {pattern}: {e.message}") from e
        if not found:
            raise DatasetError(f"no files match {pattern}")
        matched += sorted(found)
    return Source(tuple(dict.fromkeys(matched)), files.image, files.num_classes, files.compression,
                  None, None, files.label_offset)


def _check_files_exist(root: str, split: SplitInfo) -> None:
    """One listing of the folder (a single request on GCS), not one request per shard."""
    import tensorflow as tf

    try:
        present = {name.rstrip("/") for name in tf.io.gfile.listdir(root)}
    except tf.errors.NotFoundError as e:
        raise DatasetError(f"dataset folder {root} does not exist") from e
    except tf.errors.OpError as e:
        raise StorageError(f"cannot list {root}: {e.message}") from e
    missing = [path for path in split.files if path.rsplit("/", 1)[-1] not in present]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise DatasetError(
            f"split {split.name!r} lists shard {missing[0]}{more}, which does not exist: "
            "the dataset is incomplete (copied or deleted in part?)")


def tf_compression(compression: str) -> str:
    """TensorFlow's ``compression_type`` for the manifest's name."""
    return "" if compression == "NONE" else compression


def select_files(source: Source, pipelines: int, pipeline_id: int,
                 ) -> tuple[tuple[str, ...], tuple[int, ...] | None, int | None]:
    """This input pipeline's files (every ``pipelines``-th, from ``pipeline_id``), each one's record
    count (None unless the manifest lists them) and their total (None when unknown).

    Splitting by file, not by record, means no pipeline reads (and inflates)
    records that it then throws away.
    """
    if len(source.files) < pipelines:
        raise DatasetError(
            f"{len(source.files)} shard files cannot be split between {pipelines} input pipelines: "
            "every pipeline needs at least one file; write the dataset with more shards "
            "(--num_shards) or use fewer input pipelines")
    indexes = range(pipeline_id, len(source.files), pipelines)
    paths = tuple(source.files[i] for i in indexes)
    shard_counts = None
    if source.shard_num_examples is not None:
        shard_counts = tuple(source.shard_num_examples[i] for i in indexes)
        count = sum(shard_counts)
    elif pipelines == 1:
        count = source.num_examples
    else:
        count = None
        _LOG.info("the manifest has no shard_num_examples: this pipeline's length is unknown")
    return paths, shard_counts, count
