"""Reads a beam-prep dataset back as a ``tf.data`` pipeline of ``(images, labels)`` batches.

    from beam_prep.reader import make_dataset
    train = make_dataset("gs://bucket/out", split="train", batch_size=256)
    model.fit(train, validation_data=make_dataset("gs://bucket/out", split="validation"))

Everything the reader needs to know (labels, image size and format, shard files
and their record counts, compression) comes from ``manifest.json``, read
through ``tf.io.gfile`` so local paths and ``gs://`` take the same code. The
parse spec and feature keys come from :mod:`beam_prep.features`, the module the
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
count (see :func:`_read_shard`).
"""
from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

from beam_prep import features
from beam_prep.dataset import (MANIFEST, READ_COMPRESSIONS, DatasetInfo, ImageInfo, SplitInfo,
                               join as _join, parse_manifest)
from beam_prep.errors import DatasetError, OptionsError, StorageError
from beam_prep.storage import bucket_of

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

__all__ = [
    "DatasetInfo",
    "ImageInfo",
    "RandomCropFlip",
    "SplitInfo",
    "load_info",
    "make_dataset",
    "random_crop_flip",
]

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
# Read-ahead per open file: big sequential reads matter on GCS (each read is a
# request); 4 MiB x 16 files bounds the memory at 64 MiB.
READ_BUFFER_BYTES = 4 << 20
# Records parsed together on the per-image (augmentation) path before unbatching.
PARSE_CHUNK = 64
# libjpeg's accurate integer IDCT: the very pixels Pillow (and so the writer, and
# most serving code) decodes. TensorFlow's own default is INTEGER_FAST, which is
# off by up to 8 levels in two thirds of the pixels; at 224x224 the accurate one
# measured 0-7% slower, within run-to-run noise.
DEFAULT_DCT_METHOD = "INTEGER_ACCURATE"
DCT_METHODS = ("INTEGER_ACCURATE", "INTEGER_FAST")

Augment = Union[str, "RandomCropFlip", Callable[["tf.Tensor"], "tf.Tensor"]]


# --------------------------------------------------------------------------- #
# What a dataset holds
# --------------------------------------------------------------------------- #


def default_shuffle_buffer(image: ImageInfo) -> int:
    """Records in the default training shuffle buffer: about ``SHUFFLE_BUFFER_BYTES`` of them."""
    if not image.fixed_size:
        return VARYING_SIZE_SHUFFLE_BUFFER
    record = image.height * image.width * image.channels * features.BYTES_PER_SAMPLE[image.format]
    low, high = SHUFFLE_BUFFER_RECORDS
    return int(min(high, max(low, SHUFFLE_BUFFER_BYTES // max(record, 1))))


def load_info(path: str) -> DatasetInfo:
    """Reads and checks ``path/manifest.json`` (local or ``gs://``).

    Use it to size a model before reading (``load_info(path).num_classes``).

    Raises:
      DatasetError: no manifest (the dataset is missing, or its pipeline has not
        finished: the manifest is written last), or one this reader cannot use.
      StorageError: the path cannot be read (permissions, network).
    """
    import tensorflow as tf

    root = path.rstrip("/") or path
    manifest_path = _join(root, MANIFEST)
    try:
        with tf.io.gfile.GFile(manifest_path, "rb") as f:
            text = f.read()
    except tf.errors.NotFoundError as e:
        bucket = bucket_of(root)
        if bucket and not tf.io.gfile.exists(bucket + "/"):
            raise StorageError(f"cannot read {manifest_path}: bucket {bucket} does not exist") from e
        raise DatasetError(
            f"no {MANIFEST} at {manifest_path}: not a beam-prep dataset, or its pipeline has not "
            "finished (the manifest is written last, after every shard)") from e
    except tf.errors.PermissionDeniedError as e:
        raise StorageError(f"cannot read {manifest_path}: permission denied; grant the credentials "
                           f"in use read access to {bucket_of(root) or root}") from e
    except tf.errors.OpError as e:
        raise StorageError(f"cannot read {manifest_path}: {e.message}") from e
    return DatasetInfo.from_json(parse_manifest(text, manifest_path), root, manifest_path)


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


# --------------------------------------------------------------------------- #
# Augmentation
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class RandomCropFlip:
    """The built-in training augmentation: a random crop, resized back, and a random left-right flip.

    The crop box is drawn as in Inception/ResNet training
    (``tf.image.sample_distorted_bounding_box``): ``area_range`` of the image's
    area, with width/height in ``aspect_ratio_range``; it is resized to the
    output size so batches keep one shape. JPEG records decode only the crop.
    ``augment="crop_flip"`` is ``RandomCropFlip()``.
    """

    area_range: tuple[float, float] = (0.25, 1.0)
    aspect_ratio_range: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True
    max_attempts: int = 10

    def __post_init__(self) -> None:
        low, high = self.area_range
        if not 0 < low <= high <= 1:
            raise OptionsError(f"area_range must satisfy 0 < low <= high <= 1, not {self.area_range}")
        low, high = self.aspect_ratio_range
        if not 0 < low <= high:
            raise OptionsError(f"aspect_ratio_range must satisfy 0 < low <= high, not {self.aspect_ratio_range}")


def random_crop_flip(
    encoded: tf.Tensor,
    image: ImageInfo,
    size: tuple[int, int],
    *,
    params: RandomCropFlip = RandomCropFlip(),
    record_hw: tuple[tf.Tensor, tf.Tensor] | None = None,
    dct_method: str = DEFAULT_DCT_METHOD,
) -> tf.Tensor:
    """Decodes one stored image with a random crop (and flip), resized to ``size``: uint8 [h, w, c].

    ``record_hw`` is the record's (height, width), needed only for raw images of
    varying size.
    """
    import tensorflow as tf

    def window(shape: tf.Tensor) -> tf.Tensor:
        begin, crop, _ = tf.image.sample_distorted_bounding_box(
            tf.concat([shape, [image.channels]], 0),
            bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
            min_object_covered=params.area_range[0],
            aspect_ratio_range=params.aspect_ratio_range,
            area_range=params.area_range,
            max_attempts=params.max_attempts,
            use_image_if_no_bounding_boxes=True)
        return tf.stack([begin[0], begin[1], crop[0], crop[1]])

    out = _resize(_decode_window(encoded, image, window, record_hw, dct_method), size, image.channels)
    if params.flip:
        out = tf.image.random_flip_left_right(out)
    return out


# --------------------------------------------------------------------------- #
# Decoding one image
# --------------------------------------------------------------------------- #


def _decode(encoded: tf.Tensor, image: ImageInfo, record_hw=None,
            dct_method: str = DEFAULT_DCT_METHOD) -> tf.Tensor:
    """The whole stored image, uint8 [h, w, c]; the static shape is set when sizes are fixed."""
    import tensorflow as tf

    c = image.channels
    if image.format == "jpeg":
        out = tf.io.decode_jpeg(encoded, channels=c, dct_method=dct_method)
    elif image.format == "png":
        out = tf.io.decode_png(encoded, channels=c, dtype=tf.uint8)
    else:
        if image.fixed_size:
            hw = (image.height, image.width)
        else:
            hw = tuple(tf.cast(v, tf.int32) for v in record_hw)
        out = tf.reshape(tf.io.decode_raw(encoded, tf.uint8), [hw[0], hw[1], c])
    if image.fixed_size:
        # A runtime check too: a record of another size fails loudly here.
        out = tf.ensure_shape(out, [image.height, image.width, c])
    return out


def _decode_window(encoded, image: ImageInfo, window_fn, record_hw=None,
                   dct_method: str = DEFAULT_DCT_METHOD) -> tf.Tensor:
    """Decodes the box ``window_fn(shape) -> [y, x, h, w]``; JPEG decodes only that box."""
    import tensorflow as tf

    if image.format == "jpeg":
        shape = tf.image.extract_jpeg_shape(encoded)[:2]
        return tf.io.decode_and_crop_jpeg(encoded, window_fn(shape), channels=image.channels,
                                          dct_method=dct_method)
    full = _decode(encoded, image, record_hw, dct_method)
    box = window_fn(tf.shape(full)[:2])
    return tf.slice(full, [box[0], box[1], 0], [box[2], box[3], image.channels])


def _center_window(shape: tf.Tensor, size: tuple[int, int]) -> tf.Tensor:
    """The largest centred box of the target's aspect ratio: resizing it distorts nothing."""
    import tensorflow as tf

    h = tf.cast(shape[0], tf.float64)
    w = tf.cast(shape[1], tf.float64)
    crop_h = tf.maximum(tf.minimum(h, tf.round(w * size[0] / size[1])), 1.0)
    crop_w = tf.maximum(tf.minimum(w, tf.round(h * size[1] / size[0])), 1.0)
    y = tf.math.floordiv(h - crop_h, 2.0)
    x = tf.math.floordiv(w - crop_w, 2.0)
    return tf.cast(tf.stack([y, x, crop_h, crop_w]), tf.int32)


def _resize(image: tf.Tensor, size: tuple[int, int], channels: int) -> tf.Tensor:
    """Bilinear, rounded back to uint8; antialiased only when shrinking.

    Antialiasing stops a shrunk image from aliasing but costs about four times
    plain bilinear, and changes nothing when enlarging (a random crop resized
    back up, the common case), so it is chosen per image.
    """
    import tensorflow as tf

    shape = tf.shape(image)
    shrinks = tf.logical_or(shape[0] > size[0], shape[1] > size[1])
    out = tf.cond(shrinks,
                  lambda: tf.image.resize(image, size, method="bilinear", antialias=True),
                  lambda: tf.image.resize(image, size, method="bilinear"))
    out = tf.cast(tf.clip_by_value(tf.round(out), 0.0, 255.0), tf.uint8)
    return tf.ensure_shape(out, [size[0], size[1], channels])


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What one record turns into; decided once, in Python, before tracing."""

    image: ImageInfo
    size: tuple[int, int] | None  # output height, width; None: as stored (varying)
    crop_flip: RandomCropFlip | None
    user_augment: Callable | None
    dtype: Any
    one_hot: bool
    num_classes: int | None
    extra_keys: tuple[str, ...]
    dct_method: str = DEFAULT_DCT_METHOD

    @property
    def resizes(self) -> bool:
        return self.size is not None and (not self.image.fixed_size
                                          or self.size != (self.image.height, self.image.width))

    @property
    def parse_keys(self) -> tuple[str, ...]:
        keys = [features.ENCODED, features.LABEL]
        if self.image.format == "raw" and not self.image.fixed_size:
            keys += [features.HEIGHT, features.WIDTH]
        return tuple(dict.fromkeys(keys + list(self.extra_keys)))

    def record_hw(self, parsed: Mapping[str, tf.Tensor]):
        return (parsed[features.HEIGHT], parsed[features.WIDTH]) if features.HEIGHT in parsed else None

    def image_of(self, parsed: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """One record's uint8 image at the output size (before user augmentation and dtype)."""
        encoded = parsed[features.ENCODED]
        hw = self.record_hw(parsed)
        if self.crop_flip is not None:
            return random_crop_flip(encoded, self.image, self.size, params=self.crop_flip,
                                    record_hw=hw, dct_method=self.dct_method)
        if self.resizes:
            return _resize(_decode_window(encoded, self.image,
                                          lambda shape: _center_window(shape, self.size), hw,
                                          self.dct_method),
                           self.size, self.image.channels)
        return _decode(encoded, self.image, hw, self.dct_method)


# --------------------------------------------------------------------------- #
# The pipeline
# --------------------------------------------------------------------------- #


def make_dataset(
    path: str | None = None,
    split: str = "train",
    batch_size: int | None = 256,
    *,
    training: bool | None = None,
    dtype: Any = "uint8",
    one_hot: bool = False,
    shuffle_buffer: int | None = None,
    seed: int | None = None,
    repeat: bool = False,
    drop_remainder: bool = False,
    deterministic: bool | None = None,
    augment: Augment | None = None,
    resize: int | tuple[int, int] | None = None,
    input_context: tf.distribute.InputContext | None = None,
    num_input_pipelines: int | None = None,
    input_pipeline_id: int | None = None,
    global_batch_size: int | None = None,
    files: str | Sequence[str] | None = None,
    image: ImageInfo | None = None,
    num_classes: int | None = None,
    compression: str = "GZIP",
    extra_keys: Sequence[str] = (),
    dct_method: str = DEFAULT_DCT_METHOD,
    options: tf.data.Options | None = None,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``(images, labels)`` from a beam-prep dataset.

    Args:
      path: the dataset folder holding ``manifest.json`` (local or ``gs://``).
      split: which split to read (``train``, ``validation``, ...).
      batch_size: images per batch, or None for single images (then images of
        varying size come out as they are). With an ``input_context`` this is the
        per-replica size unless ``global_batch_size`` is given instead.
      training: sets the defaults below for training (shuffle, any order) or
        evaluation (no shuffle, a fixed order). Default: ``split == "train"``
        (False when reading ``files``).
      dtype: ``uint8`` (as stored, the cheapest to move to an accelerator) or a
        float dtype (``float32``...) scaled to [0, 1].
      one_hot: labels as float32 one-hot vectors (depth: the number of labels)
        instead of int64 ids.
      shuffle_buffer: serialized records in the shuffle buffer; 0 turns it off.
        Default when training: as many as fit in about 64 MiB
        (``default_shuffle_buffer``), else 0. Shard files are shuffled
        too whenever this is on.
      seed: seeds the file and record shuffles, so a run can be repeated (with
        ``deterministic``); each epoch still gets a new order.
      repeat: repeat forever (then the dataset has no length: give Keras
        ``steps_per_epoch``).
      drop_remainder: drop the last, smaller batch (static batch shape).
      deterministic: keep a fixed order (costs a little throughput when a slow
        record holds back the rest). Default: not ``training``. Without shuffling,
        two passes then yield the same order.
      augment: a per-image augmentation: ``"crop_flip"`` or a
        :class:`RandomCropFlip` (built in, decodes only the crop of a JPEG), or a
        function from a uint8 [h, w, c] image (at the output size) to a uint8 or
        [0, 1] float image of one fixed shape. Off unless asked for, in training
        too: what augmentation suits is a modelling decision.
      resize: output (height, width), or an int for a square: each image is
        centre-cropped to that aspect ratio and resized (bilinear, antialiased
        when shrinking).
        Required to batch a dataset whose image sizes vary.
      input_context: from ``strategy.distribute_datasets_from_function``: this
        pipeline reads only its share of the shard files.
      num_input_pipelines, input_pipeline_id: the same without an InputContext.
      global_batch_size: with ``input_context``, the global batch; the batch is
        ``input_context.get_per_replica_batch_size(global_batch_size)``.
      files: read these TFRecord files (paths or glob patterns) instead of a
        dataset folder; needs ``image`` and, for one-hot labels, ``num_classes``.
      image: the images' :class:`ImageInfo`, with ``files``.
      num_classes: the label count, with ``files``.
      compression: the files' compression, with ``files``.
      extra_keys: other record features (e.g. ``features.FILENAME``) to yield as a
        third element, a dict: for evaluation and debugging (Keras ``fit`` would
        take a third element for sample weights).
      dct_method: JPEG decoding: ``INTEGER_ACCURATE`` gives exactly the pixels
        Pillow decodes; ``INTEGER_FAST`` (TensorFlow's default) is off by up to 8
        levels and, at 224x224, at most a few percent faster.
      options: ``tf.data.Options`` merged over the reader's own.

    Returns:
      A dataset of ``(images, labels)`` (``(images, labels, extras)`` with
      ``extra_keys``): images [batch, h, w, c] of ``dtype``, labels int64 [batch]
      or float32 [batch, num_classes]. Its cardinality is known when the number of
      records read is (from the manifest), so Keras shows progress.

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
        writes); reading ``files=``, or a manifest without them, a damaged
        file raises TensorFlow's own ``tf.errors.DataLossError``, which does
        not name it. See :func:`_read_shard`.
    """
    import tensorflow as tf

    source = _resolve_source(path, split, files, image, num_classes, compression)
    if training is None:
        training = path is not None and split == "train"
    if deterministic is None:
        deterministic = not training
    if shuffle_buffer is None:
        shuffle_buffer = default_shuffle_buffer(source.image) if training else 0
    if shuffle_buffer < 0:
        raise OptionsError(f"shuffle_buffer must be 0 (off) or more, not {shuffle_buffer}")
    batch_size = _batch_size(batch_size, global_batch_size, input_context)
    pipelines, pipeline_id = _pipelines(input_context, num_input_pipelines, input_pipeline_id)
    paths, shard_counts, count = _select_files(source, pipelines, pipeline_id)
    plan = _make_plan(source, batch_size, dtype, one_hot, augment, resize, extra_keys, dct_method)

    _LOG.info(
        "reading %d of %d files (%s records)%s; batch %s, shuffle %d, %s order, augment %s",
        len(paths), len(source.files), count if count is not None else "unknown",
        f" as input pipeline {pipeline_id} of {pipelines}" if pipelines > 1 else "",
        batch_size, shuffle_buffer, "fixed" if deterministic else "any", augment)

    compression_type = _tf_compression(source.compression)
    parse_spec = features.tf_parse_spec(plan.parse_keys)

    def read_file(shard, num_records=None):
        return _read_shard(shard, compression_type, num_records)

    def parse(serialized):
        return tf.io.parse_example(serialized, parse_spec)

    def parse_and_decode_batch(serialized):
        return _finish(plan, _decode_batch(plan, parse(serialized)))

    def decode_one(parsed):
        return _one(plan, parsed)

    def finish(parsed):
        return _finish(plan, parsed)

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

    if batch_size is not None and plan.user_augment is None:
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)
        ds = ds.map(parse_and_decode_batch, num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=deterministic)
    else:
        # Per image: a user's augmentation may change shapes, so images are
        # decoded one by one and batched after it.
        ds = ds.batch(PARSE_CHUNK).map(parse, num_parallel_calls=tf.data.AUTOTUNE,
                                       deterministic=deterministic)
        ds = ds.unbatch().map(decode_one, num_parallel_calls=tf.data.AUTOTUNE,
                              deterministic=deterministic)
        if batch_size is not None:
            ds = ds.batch(batch_size, drop_remainder=drop_remainder)
        ds = ds.map(finish, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
        if count is not None and not repeat:
            n = count if batch_size is None else (
                count // batch_size if drop_remainder else math.ceil(count / batch_size))
            ds = ds.apply(tf.data.experimental.assert_cardinality(n))  # unbatch() forgot it.
    ds = ds.prefetch(tf.data.AUTOTUNE)

    # Only the order is set: the other tf.data options tried (intra-op threads,
    # slack, map_fn parallel iterations) measured within noise of the defaults.
    opts = tf.data.Options()
    opts.deterministic = deterministic
    ds = ds.with_options(opts)
    if options is not None:
        ds = ds.with_options(options)
    return ds


def _read_shard(shard: tf.Tensor, compression_type: str,
                num_records: tf.Tensor | None = None) -> tf.data.Dataset:
    """One shard file's serialized records; given its record count, a damaged file fails naming itself.

    TensorFlow's own error for a damaged TFRecord file does not say which file
    it is: ``DataLossError: truncated record at 298584' failed with EOF
    reached``, ``corrupted record at 298596`` (a record failing its CRC, in a
    GZIP or a plain file), ``inflate() failed with error -3: incorrect data
    check`` (a corrupted GZIP stream). Neither ``TFRecordDataset`` (whose
    ``name=`` changes nothing) nor ``interleave`` adds the file, and with a
    thousand shards that message cannot be acted on. Worse, a plain
    (``compression NONE``) file cut short, mid-record or not, raises nothing
    at all: TensorFlow reads it as a shorter file.

    tf.data has no way to catch an error inside the pipeline and raise another:
    errors leave the iterator as they are. So, with the record count ``n``
    that the manifest lists for the shard, the file is read as

        TFRecordDataset(shard).ignore_errors(log_warning=True)
            .concatenate(<one element that fails, naming shard>).take(n)

    A sound shard yields its ``n`` records and ``take`` stops there, so the
    failing element is never reached. A damaged one stops early: the read
    error ends the file (``TFRecordDataset`` moves past a file once it errs),
    or a plain file just ends short; either way ``take`` goes on into the
    failing element, whose ``tf.debugging.Assert`` raises
    ``tf.errors.InvalidArgumentError`` whose message names the file by its full
    path. ``ignore_errors`` never hides a lost record: it only ever turns a
    short read into that error, and logs TensorFlow's own error (with its
    offset) as a warning. Records read before the damage are yielded, as
    before. The error is raised inside the graph, so it is the same whether the
    dataset is iterated in Python, by ``model.fit`` or in a
    ``tf.distribute`` loop.

    Why this shape:

    * cost: per record it adds only three C++ iterators that hand the element
      on (``ignore_errors``, ``concatenate``, ``take``); no function runs per
      record, and the failing element's function runs only for a damaged file.
      In ``benchmarks/bench_reader.py``'s readers (a), (d) and (d') it measured
      within run-to-run noise of the unguarded reader. Rejected: a per-record
      counter (``scan``, or ``filter`` on an end marker), which would also see
      a shard with more records than listed, halved the records read per
      CPU-second when only reading; counting per chunk (``batch`` + ``scan``
      + ``unbatch``) cost 2-30% of them.
    * type: ``InvalidArgumentError``, not ``DataLossError``. TensorFlow has no
      op that raises a ``DataLossError`` with a message of ours:
      ``tf.debugging.Assert`` raises ``InvalidArgumentError``, and a
      ``tf.py_function`` raising ``DataLossError`` comes out as
      ``UnknownError`` (with a Python traceback in the message, and a dataset
      that can no longer be serialized).
    * a wrapper around Python iteration (catch ``DataLossError``, find the
      file) would not reach ``model.fit``, which iterates inside a
      ``tf.function``, nor a dataset the user transforms further.

    Limits: without a record count (``files=``, or a manifest without
    ``shard_num_examples``) the file is read as it is: a damaged GZIP or
    corrupted record raises TensorFlow's ``DataLossError``, which does not name
    it, and a plain file cut short goes unnoticed, because nothing tells a
    short file from a whole one. A shard holding more records than the
    manifest lists (not damage: a manifest that does not describe its shards)
    is read up to that count, the rest unread and unreported: seeing that there
    are more takes reading on past the count and telling the end of a sound
    file apart, which needs the per-record counter rejected above. (Before this
    guard the split's count check failed the epoch for it, without naming the
    shard; ``take`` now hides it from that check too.)
    """
    import tensorflow as tf

    records = tf.data.TFRecordDataset(shard, compression_type=compression_type,
                                      buffer_size=READ_BUFFER_BYTES)
    if num_records is None:
        return records

    def fail(path):
        # No quotes in the text: Assert prints strings C-escaped.
        message = tf.strings.join([
            "shard file ", path, " is damaged or could not be read: it ends before the ",
            tf.strings.as_string(num_records), " records the manifest lists for it (cut short, "
            "or a corrupted GZIP stream or record; an error TensorFlow raised reading it is in "
            "its log, as a warning). Restore or rewrite this file."])
        with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
            return tf.identity(path)

    damaged = tf.data.Dataset.from_tensors(shard).map(fail)
    return records.ignore_errors(log_warning=True).concatenate(damaged).take(num_records)


def _decode_batch(plan: _Plan, parsed: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Replaces the encoded strings of a parsed batch by their images, uint8 [b, h, w, c]."""
    import tensorflow as tf

    encoded = parsed.pop(features.ENCODED)
    info = plan.image
    if info.format == "raw" and info.fixed_size and not plan.resizes:
        # Raw pixels of one size: a single vectorised decode for the whole batch.
        flat = tf.io.decode_raw(encoded, tf.uint8)
        parsed["image"] = tf.reshape(flat, [-1, info.height, info.width, info.channels])
        return parsed
    height, width = plan.size or (info.height, info.width)
    elems = {features.ENCODED: encoded}
    if features.HEIGHT in parsed:
        elems[features.HEIGHT] = parsed[features.HEIGHT]
        elems[features.WIDTH] = parsed[features.WIDTH]
    parsed["image"] = tf.map_fn(
        plan.image_of, elems,
        fn_output_signature=tf.TensorSpec([height, width, info.channels], tf.uint8))
    return parsed


def _one(plan: _Plan, parsed: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """One record on the per-image path: decode (or crop-decode), augment."""
    parsed = dict(parsed)
    image = plan.image_of(parsed)
    if plan.user_augment is not None:
        image = plan.user_augment(image)
    del parsed[features.ENCODED]
    parsed["image"] = image
    return parsed


def _finish(plan: _Plan, parsed: Mapping[str, tf.Tensor]):
    """dtype, labels and output structure, once per batch."""
    import tensorflow as tf

    image = parsed["image"]
    if image.dtype != plan.dtype:
        image = tf.image.convert_image_dtype(image, plan.dtype, saturate=True)
    labels = parsed[features.LABEL]
    if plan.num_classes is not None:
        # An id outside the label list would silently become an all-zero one-hot
        # row (or index garbage in a sparse loss): fail instead.
        checks = [tf.debugging.assert_non_negative(labels, message="negative label id"),
                  tf.debugging.assert_less(labels, tf.constant(plan.num_classes, tf.int64),
                                           message="label id out of range of the labels")]
        with tf.control_dependencies(checks):
            labels = tf.identity(labels)
    if plan.one_hot:
        labels = tf.one_hot(labels, plan.num_classes, dtype=tf.float32)
    if plan.extra_keys:
        return image, labels, {key: parsed[key] for key in plan.extra_keys}
    return image, labels


# --------------------------------------------------------------------------- #
# Arguments
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class _Source:
    files: tuple[str, ...]
    image: ImageInfo
    num_classes: int | None
    compression: str
    num_examples: int | None
    shard_num_examples: tuple[int, ...] | None


def _resolve_source(path, split, files, image, num_classes, compression) -> _Source:
    import tensorflow as tf

    if (path is None) == (files is None):
        raise OptionsError("give either a dataset path (with manifest.json) or files=, not both or neither")
    if path is not None:
        if image is not None or num_classes is not None:
            raise OptionsError("image= and num_classes= are for files=; a dataset path has a manifest")
        info = load_info(path)
        if split not in info.splits:
            raise DatasetError(
                f"{info.root} has no split {split!r}; its splits: {', '.join(info.splits) or 'none'}")
        s = info.splits[split]
        if not s.files:
            raise DatasetError(f"split {split!r} of {info.root} has no shard files")
        _check_files_exist(info.root, s)
        return _Source(s.files, info.image, info.num_classes, info.compression,
                       s.num_examples, s.shard_num_examples)
    if image is None:
        raise OptionsError("files= needs image=ImageInfo(height, width, channels, format): "
                           "without a manifest the reader cannot know how images are stored")
    if num_classes is not None and num_classes < 1:
        raise OptionsError(f"num_classes must be positive, not {num_classes}")
    compression = str(compression).upper()
    if compression not in READ_COMPRESSIONS:
        raise OptionsError(f"compression must be one of {READ_COMPRESSIONS}, not {compression!r}")
    patterns = [files] if isinstance(files, str) else list(files)
    matched: list[str] = []
    for pattern in patterns:
        try:
            found = tf.io.gfile.glob(pattern)
        except tf.errors.NotFoundError:
            found = []
        except tf.errors.OpError as e:
            raise StorageError(f"cannot list {pattern}: {e.message}") from e
        if not found:
            raise DatasetError(f"no files match {pattern}")
        matched += sorted(found)
    return _Source(tuple(dict.fromkeys(matched)), image, num_classes, compression, None, None)


def _tf_compression(compression: str) -> str:
    return "" if compression == "NONE" else compression


def _batch_size(batch_size, global_batch_size, input_context) -> int | None:
    if global_batch_size is not None:
        if input_context is None:
            raise OptionsError("global_batch_size= goes with input_context=; otherwise use batch_size=")
        batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    if batch_size is not None and batch_size < 1:
        raise OptionsError(f"batch_size must be positive (or None for single images), not {batch_size}")
    return batch_size


def _pipelines(input_context, num_input_pipelines, input_pipeline_id) -> tuple[int, int]:
    if input_context is not None:
        if num_input_pipelines is not None or input_pipeline_id is not None:
            raise OptionsError("give input_context= or num_input_pipelines=/input_pipeline_id=, not both")
        return input_context.num_input_pipelines, input_context.input_pipeline_id
    if (num_input_pipelines is None) != (input_pipeline_id is None):
        raise OptionsError("num_input_pipelines= and input_pipeline_id= go together")
    if num_input_pipelines is None:
        return 1, 0
    if num_input_pipelines < 1 or not 0 <= input_pipeline_id < num_input_pipelines:
        raise OptionsError(f"input_pipeline_id must be in [0, {num_input_pipelines}), not {input_pipeline_id}")
    return num_input_pipelines, input_pipeline_id


def _select_files(source: _Source, pipelines: int, pipeline_id: int,
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


def _make_plan(source: _Source, batch_size, dtype, one_hot, augment, resize, extra_keys,
               dct_method) -> _Plan:
    import tensorflow as tf

    if dct_method not in DCT_METHODS:
        raise OptionsError(f"dct_method must be one of {DCT_METHODS}, not {dct_method!r}")
    try:
        tf_dtype = tf.as_dtype(dtype)
    except TypeError as e:
        raise OptionsError(f"dtype must be uint8 or a float dtype, not {dtype!r}") from e
    if tf_dtype != tf.uint8 and not tf_dtype.is_floating:
        raise OptionsError(f"dtype must be uint8 or a float dtype, not {tf_dtype.name}")
    if one_hot and source.num_classes is None:
        raise OptionsError("one_hot=True needs num_classes= when reading files= without a manifest")

    size = None
    if resize is not None:
        size = (resize, resize) if isinstance(resize, int) else tuple(resize)
        if len(size) != 2 or min(size) < 1:
            raise OptionsError(f"resize must be a positive int or (height, width), not {resize!r}")
        size = (int(size[0]), int(size[1]))
    elif source.image.fixed_size:
        size = (source.image.height, source.image.width)

    crop_flip = user_augment = None
    if isinstance(augment, str):
        if augment != "crop_flip":
            raise OptionsError(f"augment must be 'crop_flip', a RandomCropFlip or a function, not {augment!r}")
        crop_flip = RandomCropFlip()
    elif isinstance(augment, RandomCropFlip):
        crop_flip = augment
    elif augment is not None:
        if not callable(augment):
            raise OptionsError(f"augment must be 'crop_flip', a RandomCropFlip or a function, not {augment!r}")
        user_augment = augment

    if size is None and (batch_size is not None or crop_flip is not None):
        what = "batch" if batch_size is not None else "crop and resize back"
        raise OptionsError(
            f"this dataset's image sizes vary (no height/width in its manifest): to {what}, pass "
            "resize=(height, width), or batch_size=None for single images of their own size")
    keys = tuple(extra_keys)
    for key in keys:
        if key not in features.SCHEMA or key == features.ENCODED:
            raise OptionsError(f"extra_keys: {key!r} is not a record feature other than the image; "
                               f"known: {', '.join(k for k in features.SCHEMA if k != features.ENCODED)}")
    return _Plan(image=source.image, size=size, crop_flip=crop_flip, user_augment=user_augment,
                 dtype=tf_dtype, one_hot=one_hot, num_classes=source.num_classes, extra_keys=keys,
                 dct_method=dct_method)
