"""``dali_reader``: a split of a dataset as NVIDIA DALI reader nodes, for training that decodes on the GPU.

DALI (``nvidia-dali-cuda120``, beam-prep's ``dali`` extra) reads two of the formats beam-prep
writes: uncompressed TFRecords, through ``fn.readers.tfrecord`` and the DALI index the writer
puts beside each shard (``io.dali_index``), and WebDataset tars, through
``fn.readers.webdataset``. It cannot read GZIP TFRecords (it would misread the GZIP header
as a record's length) and has no ArrayRecord reader. ``dali_reader`` reads the manifest,
refuses those cases with one line saying what to do, before DALI is imported or a pipeline
built, and returns the reader's nodes with the shard and index paths and the features spec
filled in from the manifest.

Labels are what ``make_dataset`` and ``data_source`` give: the index in ``labels.txt``
(the stored id less ``--label_offset``). A WebDataset sample's ``.cls`` is the id as ASCII
digits: it is turned into an integer inside the DALI graph (digits times their place
values, summed), so the pipeline stays DALI's own, on the CPU or the GPU.

The plan (``dali_plan``) needs no DALI: what a pipeline would read, checked.
"""
from __future__ import annotations

import os
from typing import Any, NamedTuple

from beam_prep.errors import DatasetError, OptionsError, StorageError
from beam_prep.io.dali_index import extent
from beam_prep.io.libraries import require
from beam_prep.io.storage import is_local
from beam_prep.model import features
from beam_prep.model.dataset import TFRECORD, SplitInfo
from beam_prep.reader.manifest_file import normalise_root, read_manifest_info

__all__ = ["DaliPlan", "dali_plan", "dali_reader"]

_READER = "beam_prep.dali_reader"
_WEBDATASET = "webdataset"
_EXTENSIONS = {"jpeg": "jpg", "png": "png", "raw": "raw"}  # the image member's, as the writer names it
_REWRITE = ("delete it and write it again from its shard (DALI's tfrecord2idx SHARD INDEX), or prepare the dataset "
            "again")


class DaliPlan(NamedTuple):
    """What DALI reads for one split, from the manifest, checked (``dali_plan``).

    Attributes:
      file_format: ``tfrecord`` (uncompressed) or ``webdataset``.
      files: the shards' paths, in order.
      index_files: each shard's DALI index (TFRecord), or None (WebDataset: DALI indexes a tar as it opens it).
      num_examples: the split's record count (an epoch's samples, before DALI's padding).
      labels: the label names; line k of ``labels.txt``, the label DALI gives as k.
      label_offset: what the writer added to each label's index (subtracted again).
      multi_label: each record holds a list of labels (TFRecord only).
      image_extension: the WebDataset image member's extension (``jpg``, ``png`` or ``raw``).
    """

    file_format: str
    files: tuple[str, ...]
    index_files: tuple[str, ...] | None
    num_examples: int
    labels: tuple[str, ...]
    label_offset: int
    multi_label: bool
    image_extension: str


def dali_plan(path: str | os.PathLike, split: str = "train", version: int | None = None) -> DaliPlan:
    """What ``dali_reader`` reads for ``split`` of the dataset at ``path``, checked without DALI.

    Args:
      path: the dataset folder, on local disk (DALI reads local files).
      split: a split in the manifest.
      version: the dataset's version to read (``load_info(path).history``): exactly the records it held,
        whatever was appended since; None: the latest.

    Returns:
      The shards, their index files and the labels, as a ``DaliPlan``.

    Raises:
      DatasetError: no dataset there, no such version or split, or a dataset DALI cannot read: GZIP
        TFRecords, TFRecords without their index files or with one whose record count or end is
        not the manifest's for its shard, ArrayRecord, or a multi-label WebDataset; each message
        says what to do.
      OptionsError: a ``gs://`` dataset (copy it to local disk first).
      StorageError: an index file that cannot be read.
    """
    origin = normalise_root(path)
    if not is_local(origin):
        raise OptionsError(f"{_READER} reads local folders (DALI's readers open local files), not {origin}: "
                           "copy the dataset to local disk first (gcloud storage cp -r)")
    info = read_manifest_info(origin)[0].at_version(version)
    if split not in info.splits:
        raise DatasetError(f"{origin} has no split {split!r}; it has {', '.join(info.splits)}")
    chosen = info.splits[split]
    if info.file_format == "array_record":
        raise DatasetError(f"{origin} holds array_record shards, which DALI has no reader for: prepare it with "
                           "--file_format tfrecord --compression none (or --file_format webdataset) to read it "
                           "with DALI, or read it with beam_prep.data_source")
    if info.file_format == TFRECORD and info.compression != "NONE":
        raise DatasetError(f"{origin} holds {info.compression}-compressed TFRecords, which DALI cannot read: "
                           "prepare it with --compression none (or --file_format webdataset)")
    if info.file_format == TFRECORD:
        index_files = chosen.index_files
        if index_files is None:
            raise DatasetError(f"{origin} lists no DALI index files for its shards (prepared by an older "
                               "beam-prep?): prepare it again with --compression none, which writes them")
        missing = next((f for f in index_files if not os.path.isfile(f)), None)
        if missing is not None:
            raise DatasetError(f"{missing}: the DALI index of a shard of {origin} is missing; copy the "
                               "dataset with its .idx files, or prepare it again")
        for i, index in enumerate(index_files):
            _check_index(index, chosen, i)
    else:
        index_files = None
        if info.multi_label:
            raise DatasetError(f"{origin} is a multi-label WebDataset, whose .cls DALI cannot read as labels: "
                               "prepare it with --file_format tfrecord --compression none for DALI")
    return DaliPlan(info.file_format, chosen.files, index_files, chosen.num_examples, info.labels,
                    info.label_offset, info.multi_label, _EXTENSIONS[info.image.format])


def _check_index(path: str, split: SplitInfo, i: int) -> None:
    """Refuses the DALI index of shard ``i`` of ``split`` unless each line is a record's, starting where
    the one before it ends (``extent``), and its record count and its end are the manifest's for the
    shard: DALI reads the records an index lists, and no error says one is short (left from another
    run, or cut short) or that it stopped at a line it could not parse. One read of the index, as
    DALI's own; none of the shard.

    Raises:
      DatasetError: naming the index, what it holds, what the manifest lists, and what to do.
    """
    try:
        with open(path, "rb") as f:
            records, end = extent(f.read())
    except ValueError as e:
        raise DatasetError(f"{path}: not a DALI index ({e}); {_REWRITE}") from e
    except OSError as e:
        raise StorageError(f"cannot read {path}: {e.strerror or e}") from e
    expected = [(name, listed[i], found) for name, listed, found in (
        ("records", split.shard_num_examples, records), ("bytes", split.shard_bytes, end)) if listed is not None]
    if any(listed != found for _, listed, found in expected):
        raise DatasetError(f"{path}: the DALI index lists {records} records ending at byte {end}, but the manifest "
                           f"lists {' in '.join(f'{listed} {name}' for name, listed, _ in expected)} for its "
                           f"shard {split.shards[i]} (left from another run, or cut short?): DALI would read "
                           f"the records it lists and no others; {_REWRITE}")


def dali_reader(path: str | os.PathLike, split: str = "train", *, shard_id: int = 0, num_shards: int = 1,
                random_shuffle: bool = False, seed: int = -1, name: str = "Reader", version: int | None = None,
                **reader_args: Any) -> tuple[Any, Any]:
    """DALI's reader for ``split`` of the dataset at ``path``: call it inside a ``pipeline_def``.

    An uncompressed TFRecord dataset is read with ``fn.readers.tfrecord`` (its shards and their
    index files, the image and label features), a WebDataset one with ``fn.readers.webdataset``;
    see docs/guides/gpu-dali.md. Everything is checked before DALI is imported (``dali_plan``).

    Args:
      path: the dataset folder, on local disk.
      split: a split in the manifest.
      shard_id: this pipeline's part of the split, from 0 (one per GPU: its rank).
      num_shards: how many parts the split is read in (the number of GPUs).
      random_shuffle: shuffle the records, in DALI's buffer (``initial_fill`` records).
      seed: the shuffle's seed (-1: DALI picks one).
      name: the reader's name, for ``pipeline.epoch_size(name)`` and DALI's iterators'
        ``reader_name``.
      version: the dataset's version to read (``load_info(path).history``): exactly the records it held,
        whatever was appended since; None: the latest.
      **reader_args: other arguments of the DALI reader (``initial_fill``,
        ``pad_last_batch``, ``stick_to_shard``, ``prefetch_queue_depth``...).

    Returns:
      ``(images, labels)``: the stored image bytes (decode them with ``fn.decoders.image``:
      ``device="mixed"`` on a GPU) and the labels, int64 of shape ``(1,)`` (a multi-label
      TFRecord dataset: each record's list), the index in ``labels.txt``; labels is None for a
      dataset without labels.

    Raises:
      DatasetError, OptionsError: as ``dali_plan``; OptionsError also when DALI is not installed
        (with its install command).
    """
    plan = dali_plan(path, split, version)
    require("dali", _READER)
    shared = {"shard_id": shard_id, "num_shards": num_shards, "random_shuffle": random_shuffle, "seed": seed,
              "name": name, **reader_args}
    if plan.file_format == TFRECORD:
        return _tfrecord(plan, shared)
    return _webdataset(plan, shared)


def _tfrecord(plan: DaliPlan, shared: dict[str, Any]) -> tuple[Any, Any]:
    import nvidia.dali.tfrecord as tfrec
    from nvidia.dali import fn

    spec = {features.ENCODED: tfrec.FixedLenFeature((), tfrec.string, "")}
    if plan.labels:
        spec[features.LABEL] = (tfrec.VarLenFeature(tfrec.int64, -1) if plan.multi_label
                                else tfrec.FixedLenFeature([1], tfrec.int64, -1))
    records = fn.readers.tfrecord(path=list(plan.files), index_path=list(plan.index_files), features=spec,
                                  **shared)
    labels = records[features.LABEL] if plan.labels else None
    return records[features.ENCODED], _less_offset(labels, plan.label_offset)


def _webdataset(plan: DaliPlan, shared: dict[str, Any]) -> tuple[Any, Any]:
    from nvidia.dali import fn

    if not plan.labels:
        images = fn.readers.webdataset(paths=list(plan.files), ext=[plan.image_extension],
                                       missing_component_behavior="error", **shared)
        return images, None
    images, cls = fn.readers.webdataset(paths=list(plan.files), ext=[plan.image_extension, "cls"],
                                        missing_component_behavior="error", **shared)
    width = len(str(plan.label_offset + len(plan.labels) - 1))  # the most digits a stored id has
    return images, _less_offset(_ascii_integer(cls, width), plan.label_offset)


def _ascii_integer(digits: Any, width: int) -> Any:
    """A node of ASCII digits (at most ``width``) as an int64 of shape ``(1,)``, in DALI's graph.

    Padded at the end with ``"0"`` to ``width`` digits, the digits weighed by their place
    values sum to the number times 10 ** (padding), which is divided out again.
    """
    import numpy as np
    import nvidia.dali.math as dmath
    from nvidia.dali import fn, types

    places = types.Constant(np.array([10 ** (width - 1 - i) for i in range(width)], dtype=np.int64))
    padded = fn.pad(digits, fill_value=ord("0"), shape=[width], axes=[0])
    total = fn.reductions.sum((fn.cast(padded, dtype=types.INT64) - ord("0")) * places)
    length = digits.shape(dtype=types.INT64)
    scale = fn.cast(dmath.pow(10, width - length), dtype=types.INT64)
    return fn.reshape(total, shape=[1]) // scale


def _less_offset(labels: Any, label_offset: int) -> Any:
    """Stored ids as indexes in labels.txt, as every beam-prep reader gives them."""
    if labels is None or not label_offset:
        return labels
    return labels - label_offset
