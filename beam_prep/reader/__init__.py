"""Reads a beam-prep dataset back as a ``tf.data`` pipeline of ``(images, labels)`` batches.

    from beam_prep.reader import make_dataset
    train = make_dataset("gs://bucket/out", split="train", batch_size=256)
    model.fit(train, validation_data=make_dataset("gs://bucket/out", split="validation"))

Everything the reader needs to know (labels, image size and format, shard files
and their record counts, compression) comes from ``manifest.json``, read
through ``tf.io.gfile`` so local paths and ``gs://`` take the same code, and
checked by :class:`beam_prep.model.dataset.DatasetInfo`, the model the writer writes it from. The
parse spec and feature keys come from :mod:`beam_prep.model.features`, the module the
writer encodes with, so the two cannot drift apart.

The pipeline is laid out for throughput on a host that feeds an accelerator
(measured by ``benchmarks/bench_reader.py``):

* shard files are the unit of parallelism and of distribution: a parallel
  ``interleave`` reads several GZIP files at once (inflating is single-threaded
  per file), and each input pipeline of a distributed job reads its own files;
* records are shuffled while still serialized (~20 KB for a 224x224 JPEG)
  rather than as decoded pixels (150 KB), so the buffer costs little memory;
* records are batched first and parsed with one vectorised
  ``tf.io.parse_example`` per batch; each batch is then decoded in a parallel
  ``map`` (``tf.map_fn`` over its images for JPEG and PNG; raw pixels need no
  decoding, one ``decode_raw`` + reshape per batch), and dtype conversion and
  one-hot labels run once per batch. On 224x224 JPEGs this runs at the speed of
  ``decode_jpeg`` alone on bytes held in memory;
* the built-in random crop decodes only the crop of a JPEG
  (``tf.io.decode_and_crop_jpeg``) inside the same batched decode; a user's
  augmentation function takes a per-image path (parse a chunk, unbatch, decode
  and augment each image in a parallel ``map``, batch), since it may change
  shapes.

A record that fails to decode fails the pipeline with TensorFlow's error: a
corrupt dataset should stop training, not silently shrink it. A damaged shard
file (truncated, or corrupted inside its GZIP stream or a record) fails it with
an error that names the file, whenever the manifest lists the shard's record
count (see :func:`beam_prep.reader.shards.read_shard`).

The package, one job a module:

* :mod:`~beam_prep.reader.sources`: what to read: ``load_info``, a split's
  files or ``RecordFiles`` matched, this input pipeline's share;
* :mod:`~beam_prep.reader.config`: ``ReaderConfig``, the rarely changed knobs;
* :mod:`~beam_prep.reader.decode`: stored bytes to pixels (whole, a window,
  resized, ``random_crop_flip``);
* :mod:`~beam_prep.reader.plan`: what a record becomes, decided before
  tracing, and the batch and per-image maps;
* :mod:`~beam_prep.reader.shards`: one shard file, failing by name when damaged;
* :mod:`~beam_prep.reader.pipeline`: ``make_dataset``, the tf.data stages.

The dataset's description itself (``DatasetInfo``, ``ImageInfo``,
``SplitInfo``) is :mod:`beam_prep.model.dataset`, shared with the writer.
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
