"""``make_dataset``: the ``tf.data`` pipeline, from shard files to batches of ``(images, labels)``.

The stages, each a function here: the files and their order
(:func:`_records`: shuffle files, interleave, count, shuffle records, repeat),
then parse and decode (:func:`_images`: batched, or per image for a user's
augmentation), then the options. What to read comes from
:mod:`beam_prep.reader.sources`, what a record becomes from
:mod:`beam_prep.reader.plan`.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from beam_prep.model import features
from beam_prep.model.dataset import ImageInfo
from beam_prep.reader.config import ReaderConfig
from beam_prep.reader.plan import (
    Augment,
    RecordPlan,
    decode_batch,
    decode_one,
    finish,
    make_plan,
)
from beam_prep.reader.plan import parse as parse_records
from beam_prep.reader.shards import read_buffer_bytes, read_shard
from beam_prep.reader.sources import (
    RecordFiles,
    resolve_source,
    select_files,
    tf_compression,
)

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

__all__ = ["default_shuffle_buffer", "make_dataset"]

_LOG = logging.getLogger(__name__)

# The training shuffle holds serialized records (before decoding), as many as fit in
# this many bytes: a bound on memory traffic, chosen in benchmarks/bench_reader.py
# (docs/performance/reader.md; docs/design/reader.md says why more buys little mixing).
SHUFFLE_BUFFER_BYTES = 64 << 20
SHUFFLE_BUFFER_RECORDS = (256, 4096)  # at least, at most
VARYING_SIZE_SHUFFLE_BUFFER = 1024
# Shard files read at once: fixed (not AUTOTUNE, which follows the core count) so a
# deterministic read order is the same on every machine; enough to hide object-store latency.
MAX_CYCLE_LENGTH = 16
# Records parsed together on the per-image (augmentation) path before unbatching.
PARSE_CHUNK = 64


def default_shuffle_buffer(image: ImageInfo) -> int:
    """Records in the default training shuffle buffer: about ``SHUFFLE_BUFFER_BYTES`` of them."""
    if not image.fixed_size:
        return VARYING_SIZE_SHUFFLE_BUFFER
    record = image.height * image.width * image.channels * features.BYTES_PER_SAMPLE[image.format]
    low, high = SHUFFLE_BUFFER_RECORDS
    return int(min(high, max(low, SHUFFLE_BUFFER_BYTES // max(record, 1))))


def make_dataset(
    path: str | RecordFiles,
    split: str = "train",
    batch_size: int | None = 256,
    *,
    training: bool | None = None,
    dtype: Any = "uint8",
    one_hot: bool = False,
    augment: Augment | None = None,
    resize: int | tuple[int, int] | None = None,
    repeat: bool = False,
    drop_remainder: bool = False,
    extra_keys: Sequence[str] = (),
    config: ReaderConfig = ReaderConfig(),
    version: int | None = None,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``(images, labels)`` batches of a dataset (docs/guides/reading-back.md).

    Everything the reader needs (labels, image size and format, shard files and
    their record counts) comes from the dataset's ``manifest.json``, so the
    arguments are only what a training script decides for itself; the rarely
    changed knobs are in ``config``.

    Args:
      path: the folder holding ``manifest.json`` (local or ``gs://``), or ``RecordFiles`` without one.
      split: the split to read (``train``, ``validation``, ...); not used with ``RecordFiles``.
      batch_size: images per batch (per replica with an input context), or None for single images.
      training: shuffle in any order, or not and in a fixed order; default ``split == "train"``.
      dtype: of the images: ``uint8`` as stored, or a float dtype scaled to [0, 1].
      one_hot: float32 one-hot labels, not int64 ids; ids count from 0 whatever ``--label_offset``.
        A multi-label dataset (``load_info(path).multi_label``) always gives float32 multi-hot
        labels, ``[batch, num_classes]``.
      augment: ``"crop_flip"``, ``"random_resized_crop"``, a ``RandomCropFlip`` or a per-image function.
      resize: (height, width) or an int: centre-crop to that aspect and resize; batches varying sizes.
      repeat: repeat forever (no length then: give Keras ``steps_per_epoch``).
      drop_remainder: drop the last, smaller batch, for a static batch shape.
      extra_keys: other record features (e.g. ``features.FILENAME``, or a ``--metadata`` column listed in
        ``load_info(path).extra_features``, with its type) yielded as a third element, a dict.
      config: shuffling, order, distribution, JPEG decoding and ``tf.data`` options: a :class:`ReaderConfig`.
      version: the dataset's version to read (``load_info(path).history``): exactly the records it held,
        whatever was appended since; None: the latest.

    Returns:
      A ``tf.data.Dataset`` of ``(images, labels)``, or ``(images, labels, extras)`` with
      ``extra_keys``: images ``[batch, height, width, channels]`` of ``dtype``, labels int64
      ids ``[batch]`` (float32 ``[batch, num_classes]`` one-hot or multi-hot); without a
      batch size, single images and labels. Its cardinality is known unless ``repeat``.
      A dataset without labels (its manifest's ``labels`` empty) yields ``images``, or
      ``(images, extras)`` with ``extra_keys``.

    Raises:
      DatasetError, OptionsError, StorageError: no manifest or split, bad arguments, an unreadable dataset.
      tf.errors.InvalidArgumentError: while iterating, a damaged shard, by name (docs/design/reader.md).
    """
    source = resolve_source(path, split, version)
    if training is None:
        training = isinstance(path, str) and split == "train"
    deterministic = not training if config.deterministic is None else config.deterministic
    shuffle_buffer = config.shuffle_buffer
    if shuffle_buffer is None:
        shuffle_buffer = default_shuffle_buffer(source.image) if training else 0
    batch_size = config.batch_size(batch_size)
    pipelines, pipeline_id = config.pipelines()
    paths, shard_counts, count = select_files(source, pipelines, pipeline_id)
    plan = make_plan(source.image, source.num_classes, batch_size, dtype, one_hot, augment, resize,
                     extra_keys, config.dct_method, source.label_offset, source.multi_label,
                     source.extra_features)

    _LOG.info(
        "reading %d of %d files (%s records)%s; batch %s, shuffle %d, %s order, augment %s",
        len(paths), len(source.files), count if count is not None else "unknown",
        f" as input pipeline {pipeline_id} of {pipelines}" if pipelines > 1 else "",
        batch_size, shuffle_buffer, "fixed" if deterministic else "any", augment)

    ds = _records(paths, shard_counts, count, tf_compression(source.compression),
                  shuffle_buffer=shuffle_buffer, seed=config.seed, repeat=repeat,
                  deterministic=deterministic)
    ds = _images(ds, plan, batch_size, drop_remainder=drop_remainder, deterministic=deterministic,
                 count=None if repeat else count)
    return _with_options(ds, deterministic, config.options)


def _records(paths: tuple[str, ...], shard_counts: tuple[int, ...] | None, count: int | None,
             compression_type: str, *, shuffle_buffer: int, seed: int | None, repeat: bool,
             deterministic: bool) -> tf.data.Dataset:
    """The serialized records of ``paths``, in their order: files shuffled, interleaved, records shuffled."""
    import tensorflow as tf

    buffer_size = read_buffer_bytes(paths[0])  # a split's shards are all in one place

    def read_file(shard, num_records=None):
        return read_shard(shard, compression_type, num_records, buffer_size)

    if shard_counts is not None:
        # Each shard with its record count: a damaged one fails naming itself.
        ds = tf.data.Dataset.from_tensor_slices((list(paths), tf.constant(shard_counts, tf.int64)))
    else:
        ds = tf.data.Dataset.from_tensor_slices(list(paths))
    if shuffle_buffer and len(paths) > 1:
        ds = ds.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
    ds = ds.interleave(read_file, cycle_length=min(len(paths), MAX_CYCLE_LENGTH), block_length=1,
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    if count is not None:
        # The length Keras shows. Also checked as records stream past: without
        # per-shard counts (only the split's), a split with fewer or more records
        # than the manifest says fails the epoch instead of going unnoticed.
        ds = ds.apply(tf.data.experimental.assert_cardinality(count))
    if shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    return ds


def _images(records: tf.data.Dataset, plan: RecordPlan, batch_size: int | None, *, drop_remainder: bool,
            deterministic: bool, count: int | None) -> tf.data.Dataset:
    """Parsed and decoded batches (or single images).

    ``count``: the records of one pass, when known and not repeated.
    """
    import tensorflow as tf

    def parse(serialized):
        return parse_records(plan, serialized)

    def parse_and_decode_batch(serialized):
        return finish(plan, decode_batch(plan, parse(serialized)))

    def map_(ds, fn):
        return ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)

    if batch_size is not None and plan.user_augment is None:
        return map_(records.batch(batch_size, drop_remainder=drop_remainder), parse_and_decode_batch)
    # Per image: a user's augmentation may change shapes, so images are
    # decoded one by one and batched after it.
    ds = map_(records.batch(PARSE_CHUNK), parse)
    ds = map_(ds.unbatch(), lambda parsed: decode_one(plan, parsed))
    if batch_size is not None and plan.has_lists:  # a multi-label record's names: a list each
        ds = ds.ragged_batch(batch_size, drop_remainder=drop_remainder)
    elif batch_size is not None:
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    ds = map_(ds, lambda parsed: finish(plan, parsed))
    if count is not None:
        n = count if batch_size is None else (
            count // batch_size if drop_remainder else math.ceil(count / batch_size))
        ds = ds.apply(tf.data.experimental.assert_cardinality(n))  # unbatch() forgot it.
    return ds


def _with_options(ds: tf.data.Dataset, deterministic: bool,
                  options: tf.data.Options | None) -> tf.data.Dataset:
    import tensorflow as tf

    ds = ds.prefetch(tf.data.AUTOTUNE)
    # Only the order is set: the other tf.data options tried made no difference
    # (docs/performance/reader.md).
    opts = tf.data.Options()
    opts.deterministic = deterministic
    ds = ds.with_options(opts)
    if options is not None:
        ds = ds.with_options(options)
    return ds
