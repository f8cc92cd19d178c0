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
    Plan,
    decode_batch,
    decode_one,
    finish,
    make_plan,
)
from beam_prep.reader.shards import read_shard
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

# The training shuffle holds serialized records (before decoding), as many as
# fit in about 64 MiB: ~2,900 records of 224x224 JPEG, ~440 of raw 224x224x3
# pixels. Measured: a 2,048-record buffer of raw pixels (300 MB) costs a third
# of the reader's throughput in memory traffic, one of JPEGs costs nothing. The
# writer spreads classes over every shard in hash order and files are shuffled
# each epoch, so a larger buffer buys little mixing.
SHUFFLE_BUFFER_BYTES = 64 << 20
SHUFFLE_BUFFER_RECORDS = (256, 4096)  # at least, at most
VARYING_SIZE_SHUFFLE_BUFFER = 1024
# Shard files read at once. A fixed number (not AUTOTUNE, which follows the core
# count) keeps a deterministic read order the same on every machine; 16 GZIP
# streams keep a 16-core host busy and hide object-store latency.
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
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``(images, labels)`` from a beam-prep dataset.

    The arguments are what a training script sets for itself; the rest (order
    and shuffling, distribution, JPEG decoding, ``tf.data.Options``) has
    defaults that suit nearly every run and lives in ``config``, a
    :class:`ReaderConfig` (as ``tfds.load`` takes a ``tfds.ReadConfig``), which
    also checks its either/or pairs when made. Files without a manifest are a
    :class:`RecordFiles` in place of the folder, not four more arguments.

    Args:
      path: the dataset folder holding ``manifest.json`` (local or ``gs://``),
        or :class:`RecordFiles`: TFRecord files without a manifest.
      split: which split to read (``train``, ``validation``, ...); not used
        with ``RecordFiles``.
      batch_size: images per batch, or None for single images (then images of
        varying size come out as they are). With an ``input_context`` this is the
        per-replica size unless ``config.global_batch_size`` is given instead.
      training: sets the defaults of ``config`` for training (shuffle, any
        order) or evaluation (no shuffle, a fixed order). Default:
        ``split == "train"`` (False when reading ``RecordFiles``).
      dtype: ``uint8`` (as stored, the cheapest to move to an accelerator) or a
        float dtype (``float32``...) scaled to [0, 1].
      one_hot: labels as float32 one-hot vectors (depth: the number of labels)
        instead of int64 ids.
      augment: a per-image augmentation: ``"crop_flip"``,
        ``"random_resized_crop"`` (ImageNet training's crop of 8-100% of the
        image, for whole images: ``RandomCropFlip.inception()``) or a
        :class:`RandomCropFlip` (built in, decodes only the crop of a JPEG), or a
        function from a uint8 [h, w, c] image (at the output size) to a uint8 or
        [0, 1] float image of one fixed shape. Off unless asked for, in training
        too: what augmentation suits is a modelling decision.
      resize: output (height, width), or an int for a square: each image is
        centre-cropped to that aspect ratio and resized (bilinear, antialiased
        when shrinking). Required to batch a dataset whose image sizes vary.
      repeat: repeat forever (then the dataset has no length: give Keras
        ``steps_per_epoch``).
      drop_remainder: drop the last, smaller batch (static batch shape).
      extra_keys: other record features (e.g. ``features.FILENAME``) to yield as a
        third element, a dict: for evaluation and debugging (Keras ``fit`` would
        take a third element for sample weights).
      config: shuffling, order, distribution, JPEG decoding and ``tf.data``
        options; see :class:`ReaderConfig`.

    Returns:
      A dataset of ``(images, labels)`` (``(images, labels, extras)`` with
      ``extra_keys``): images [batch, h, w, c] of ``dtype``, labels int64 [batch]
      or float32 [batch, num_classes]. Label ids index ``load_info(path).labels``
      from 0 whatever ``--label_offset`` the dataset was written with (the stored
      id less the offset); ``extra_keys`` hold the stored values as they are. Its
      cardinality is known when the number of records read is (from the
      manifest), so Keras shows progress.

    Raises:
      DatasetError: no manifest, an unknown split, a listed shard missing, no
        files matched, or fewer shard files than input pipelines.
      OptionsError: arguments that do not fit together or the dataset.
      StorageError: the dataset cannot be read (permissions, network).

    While iterating (in Python, ``model.fit``, or a distributed loop alike):
      tf.errors.InvalidArgumentError: a shard file is damaged (truncated, or
        corrupted inside its GZIP stream or a record) or stopped being readable;
        the message names the file by its full path (``shard file PATH is
        damaged or could not be read: ...``). Raised where the manifest lists
        each shard's record count (``shard_num_examples``, which beam-prep
        writes); reading ``RecordFiles``, or a manifest without them, a damaged
        file raises TensorFlow's own ``tf.errors.DataLossError``, which does
        not name it. See :func:`beam_prep.reader.shards.read_shard`.
    """
    source = resolve_source(path, split)
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
                     extra_keys, config.dct_method, source.label_offset)

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

    def read_file(shard, num_records=None):
        return read_shard(shard, compression_type, num_records)

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


def _images(records: tf.data.Dataset, plan: Plan, batch_size: int | None, *, drop_remainder: bool,
            deterministic: bool, count: int | None) -> tf.data.Dataset:
    """Parsed and decoded batches (or single images); ``count``: the records of one pass, when known
    and not repeated."""
    import tensorflow as tf

    parse_spec = features.tf_parse_spec(plan.parse_keys)

    def parse(serialized):
        return tf.io.parse_example(serialized, parse_spec)

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
    if batch_size is not None:
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
    # Only the order is set: the other tf.data options tried (intra-op threads,
    # slack, map_fn parallel iterations) measured within noise of the defaults.
    opts = tf.data.Options()
    opts.deterministic = deterministic
    ds = ds.with_options(opts)
    if options is not None:
        ds = ds.with_options(options)
    return ds
