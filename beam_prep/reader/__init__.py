"""Reads a beam-prep dataset back as a ``tf.data`` pipeline of ``(images, labels)`` batches.

    from beam_prep.reader import make_dataset
    train = make_dataset("gs://bucket/out", split="train", batch_size=256)
    model.fit(train, validation_data=make_dataset("gs://bucket/out", split="validation"))

Everything it needs (labels, image format, shard files and their record counts)
comes from ``manifest.json``, checked by :class:`beam_prep.model.dataset.DatasetInfo`;
the parse spec is :mod:`beam_prep.model.features`, the writer's own, so the two cannot
drift apart. A record that fails to decode fails the pipeline (a corrupt dataset
should stop training, not shrink it), and a damaged shard fails naming its file.

One job a module: ``sources`` (what to read), ``config`` (``ReaderConfig``),
``decode`` (bytes to pixels), ``plan`` (what a record becomes), ``shards`` (one
shard file), ``pipeline`` (``make_dataset``). See docs/design/reader.md for why the
pipeline is laid out as it is.
"""
from __future__ import annotations

from beam_prep.model.dataset import DatasetInfo, ImageInfo, SplitInfo
from beam_prep.reader.config import ReaderConfig
from beam_prep.reader.decode import RandomCropFlip, random_crop_flip
from beam_prep.reader.pipeline import make_dataset
from beam_prep.reader.sources import RecordFiles, load_info

__all__ = [
    "DatasetInfo",
    "ImageInfo",
    "RandomCropFlip",
    "ReaderConfig",
    "RecordFiles",
    "SplitInfo",
    "load_info",
    "make_dataset",
    "random_crop_flip",
]
