"""What one record turns into (``RecordPlan``), decided once in Python before tracing, and the maps that do it.

``make_plan`` checks the output arguments against the dataset; the batched
path decodes a parsed batch at once (``decode_batch``), the per-image path
(a user's augmentation) one record at a time (``decode_one``); ``finish``
sets the dtype, labels and output structure once per batch.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from beam_prep.errors import OptionsError
from beam_prep.model import features
from beam_prep.model.dataset import ImageInfo
from beam_prep.reader.config import DEFAULT_DCT_METHOD
from beam_prep.reader.decode import (
    RandomCropFlip,
    center_window,
    decode,
    decode_window,
    random_crop_flip,
    resize,
)

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

__all__ = ["Augment", "RecordPlan", "decode_batch", "decode_one", "finish", "make_plan", "parse"]

Augment = str | RandomCropFlip | Callable[["tf.Tensor"], "tf.Tensor"]


@dataclasses.dataclass(frozen=True)
class RecordPlan:
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
    label_offset: int = 0  # stored ids start here (--label_offset); yielded ids start at 0
    multi_label: bool = False  # each record holds a list of ids: yielded as a multi-hot vector
    extra_features: Mapping[str, str] = dataclasses.field(default_factory=dict)  # --metadata's columns

    @property
    def resizes(self) -> bool:
        return self.size is not None and (not self.image.fixed_size
                                          or self.size != (self.image.height, self.image.width))

    @property
    def labelled(self) -> bool:
        """Whether the records hold labels: not those of a dataset without any (its manifest's
        labels empty), which yields images (and ``extra_keys``) alone."""
        return self.num_classes != 0

    @property
    def parse_keys(self) -> tuple[str, ...]:
        keys = [features.ENCODED, features.LABEL] if self.labelled else [features.ENCODED]
        if self.image.format == "raw" and not self.image.fixed_size:
            keys += [features.HEIGHT, features.WIDTH]
        return tuple(dict.fromkeys(keys + list(self.extra_keys)))

    @property
    def has_lists(self) -> bool:
        """Whether a yielded value is a list of varying length: a multi-label record's label names
        (``image/class/text`` in ``extra_keys``), batched as a ``tf.RaggedTensor``."""
        return self.multi_label and features.LABEL_TEXT in self.extra_keys

    def parse_spec(self) -> dict[str, Any]:
        """The ``tf.io.parse_example`` spec of ``parse_keys``: the schema's, a multi-label dataset's
        label lists (ragged), and the dataset's extra features by their kinds."""
        import tensorflow as tf

        listed = (features.LABEL, features.LABEL_TEXT) if self.multi_label else ()
        keys = self.parse_keys
        spec: dict[str, Any] = features.tf_parse_spec(
            tuple(k for k in keys if k in features.SCHEMA and k not in listed))
        dtypes = {"bytes": tf.string, "int64": tf.int64, "float": tf.float32}
        for key in keys:
            if key in listed:
                spec[key] = tf.io.RaggedFeature(tf.int64 if key == features.LABEL else tf.string,
                                                row_splits_dtype=tf.int64)
            elif key not in features.SCHEMA:
                spec[key] = tf.io.FixedLenFeature([], dtypes[self.extra_features[key]])
        return spec

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
            window = decode_window(encoded, self.image, lambda shape: center_window(shape, self.size),
                                   hw, self.dct_method)
            return resize(window, self.size, self.image.channels)
        return decode(encoded, self.image, hw, self.dct_method)



def make_plan(image: ImageInfo, num_classes: int | None, batch_size: int | None, dtype: Any,
              one_hot: bool, augment: Augment | None, resize_to: int | tuple[int, int] | None,
              extra_keys: Sequence[str], dct_method: str = DEFAULT_DCT_METHOD,
              label_offset: int = 0, multi_label: bool = False,
              extra_features: Mapping[str, str] | None = None) -> RecordPlan:
    """Checks ``make_dataset``'s output arguments against the dataset, and fixes what each record becomes.

    Raises:
      OptionsError: an argument of the wrong kind, or one the dataset cannot meet.
    """
    if one_hot and num_classes is None:
        raise OptionsError("one_hot=True needs RecordFiles(num_classes=) when reading files without a manifest")
    if one_hot and num_classes == 0:
        raise OptionsError("one_hot=True: this dataset has no labels (its records hold images and their "
                           "columns alone): drop one_hot")
    extra_features = dict(extra_features or {})
    size = _output_size(image, resize_to)
    crop_flip, user_augment = _augmentation(augment)
    if size is None and (batch_size is not None or crop_flip is not None):
        what = "batch" if batch_size is not None else "crop and resize back"
        raise OptionsError(
            f"this dataset's image sizes vary (no height/width in its manifest): to {what}, pass "
            "resize=(height, width), or batch_size=None for single images of their own size")
    return RecordPlan(image=image, size=size, crop_flip=crop_flip, user_augment=user_augment,
                dtype=_dtype(dtype), one_hot=one_hot, num_classes=num_classes,
                extra_keys=_extra_keys(extra_keys, extra_features, num_classes != 0), dct_method=dct_method,
                label_offset=label_offset, multi_label=multi_label, extra_features=extra_features)


def _dtype(dtype: Any) -> tf.DType:
    import tensorflow as tf

    try:
        tf_dtype = tf.as_dtype(dtype)
    except TypeError as e:
        raise OptionsError(f"dtype must be uint8 or a float dtype, not {dtype!r}") from e
    if tf_dtype != tf.uint8 and not tf_dtype.is_floating:
        raise OptionsError(f"dtype must be uint8 or a float dtype, not {tf_dtype.name}")
    return tf_dtype


def _output_size(image: ImageInfo, resize_to: int | tuple[int, int] | None) -> tuple[int, int] | None:
    """``resize``'s (height, width); else the stored size; None when sizes vary."""
    if resize_to is None:
        return (image.height, image.width) if image.fixed_size else None
    size = (resize_to, resize_to) if isinstance(resize_to, int) else tuple(resize_to)
    if len(size) != 2 or min(size) < 1:
        raise OptionsError(f"resize must be a positive int or (height, width), not {resize_to!r}")
    return int(size[0]), int(size[1])


_NAMED_AUGMENTS: dict[str, Callable[[], RandomCropFlip]] = {
    "crop_flip": RandomCropFlip,
    "random_resized_crop": RandomCropFlip.inception,
}


def _augmentation(augment: Augment | None) -> tuple[RandomCropFlip | None, Callable | None]:
    """(the built-in crop and flip, a user's function): at most one of them."""
    wrong = (f"augment must be 'crop_flip', 'random_resized_crop', a RandomCropFlip or a function, "
             f"not {augment!r}")
    if isinstance(augment, str):
        if augment not in _NAMED_AUGMENTS:
            raise OptionsError(wrong)
        return _NAMED_AUGMENTS[augment](), None
    if isinstance(augment, RandomCropFlip):
        return augment, None
    if augment is not None and not callable(augment):
        raise OptionsError(wrong)
    return None, augment


def _extra_keys(extra_keys: Sequence[str], extra_features: Mapping[str, str], labelled: bool = True
                ) -> tuple[str, ...]:
    """``extra_keys``, checked: the schema's keys but the image (and the labels, in a dataset
    without any), and the dataset's extra features."""
    keys = tuple(extra_keys)
    known = [k for k in features.SCHEMA if k != features.ENCODED and (labelled or k not in features.LABEL_KEYS)]
    known += list(extra_features)
    for key in keys:
        if key not in known:
            raise OptionsError(f"extra_keys: {key!r} is not a record feature other than the image; "
                               f"known: {', '.join(known)}")
    return keys


def parse(plan: RecordPlan, serialized: tf.Tensor) -> dict[str, tf.Tensor]:
    """A batch of serialized records parsed; a multi-label dataset's id lists made multi-hot at once,
    so that every later step (unbatch, batch) sees dense tensors."""
    import tensorflow as tf

    parsed = tf.io.parse_example(serialized, plan.parse_spec())
    if plan.multi_label:
        parsed[features.LABEL] = _multi_hot(plan, parsed[features.LABEL])
    return parsed


def _multi_hot(plan: RecordPlan, ids: tf.RaggedTensor) -> tf.Tensor:
    """Ragged stored ids [b, (n)] to float32 [b, num_classes]: 1 where the record has the label."""
    import tensorflow as tf

    ids = ids - plan.label_offset
    checks = [tf.debugging.assert_non_negative(ids.flat_values, message="negative label id"),
              tf.debugging.assert_less(ids.flat_values, tf.constant(plan.num_classes, tf.int64),
                                       message="label id out of range of the labels")]
    with tf.control_dependencies(checks):
        return tf.math.bincount(ids, minlength=plan.num_classes, maxlength=plan.num_classes,
                                binary_output=True, axis=-1, dtype=tf.float32)


def decode_batch(plan: RecordPlan, parsed: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
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


def decode_one(plan: RecordPlan, parsed: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """One record on the per-image path: decode (or crop-decode), augment."""
    parsed = dict(parsed)
    image = plan.image_of(parsed)
    if plan.user_augment is not None:
        image = plan.user_augment(image)
    del parsed[features.ENCODED]
    parsed["image"] = image
    return parsed


def finish(plan: RecordPlan, parsed: Mapping[str, tf.Tensor]):
    """dtype, labels and output structure, once per batch."""
    import tensorflow as tf

    image = parsed["image"]
    if image.dtype != plan.dtype:
        image = tf.image.convert_image_dtype(image, plan.dtype, saturate=True)
    if not plan.labelled:  # a dataset without labels: images, and the columns asked for
        return (image, {key: parsed[key] for key in plan.extra_keys}) if plan.extra_keys else image
    labels = parsed[features.LABEL]
    if plan.multi_label:  # multi-hot already (``parse``)
        return (image, labels, {key: parsed[key] for key in plan.extra_keys}) if plan.extra_keys else (image, labels)
    if plan.label_offset:
        # Stored ids start at --label_offset; yielded ids index the dataset's labels from 0.
        labels = labels - plan.label_offset
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

