"""Stored image bytes to uint8 pixels in TensorFlow: whole, a window of them, resized, randomly cropped.

Per-image functions, traced inside the reader's ``tf.data`` maps. A JPEG is
decoded only as far as needed: a centre crop or a random crop decodes just
that window (``tf.io.decode_and_crop_jpeg``), and a random crop well over the
output size is also scaled down in the DCT domain as it is decoded.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from beam_prep.errors import OptionsError
from beam_prep.model.dataset import ImageInfo
from beam_prep.reader.config import DEFAULT_DCT_METHOD

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

__all__ = ["RandomCropFlip", "center_window", "decode", "decode_window", "random_crop_flip", "resize"]

# The DCT scales libjpeg decodes at (tf.io.decode_and_crop_jpeg's ratio), smallest first.
_DCT_RATIOS = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class RandomCropFlip:
    """The built-in training augmentation: a random crop, resized back, and a random left-right flip.

    The crop box is drawn as in Inception/ResNet training
    (``tf.image.sample_distorted_bounding_box``): ``area_range`` of the image's
    area, with width/height in ``aspect_ratio_range``; it is resized to the
    output size so batches keep one shape. JPEG records decode only the crop,
    at the smallest DCT scale (1/2, 1/4, 1/8) that keeps it at least the output
    size. ``augment="crop_flip"`` is ``RandomCropFlip()``;
    ``augment="random_resized_crop"`` is ``RandomCropFlip.inception()``.
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

    @classmethod
    def inception(cls) -> RandomCropFlip:
        """The crop ImageNet training recipes take from the whole image (Inception, the TPU ResNet,
        Model Garden, torchvision's RandomResizedCrop): 8-100% of the area, width/height 3/4 to
        4/3, and a flip. For datasets that keep whole images (``--image_format original``)."""
        return cls(area_range=(0.08, 1.0))


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

    out = resize(decode_window(encoded, image, window, record_hw, dct_method, at_least=size), size,
                 image.channels)
    if params.flip:
        out = tf.image.random_flip_left_right(out)
    return out



def decode(encoded: tf.Tensor, image: ImageInfo, record_hw=None,
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


def decode_window(encoded, image: ImageInfo, window_fn, record_hw=None,
                   dct_method: str = DEFAULT_DCT_METHOD, at_least: tuple[int, int] | None = None) -> tf.Tensor:
    """Decodes the box ``window_fn(shape) -> [y, x, h, w]``; JPEG decodes only that box.

    With ``at_least`` (height, width), a JPEG box that large twice over or more
    is decoded scaled down by 2, 4 or 8, never below ``at_least``: for a
    resize to that size, which follows.
    """
    import tensorflow as tf

    if image.format == "jpeg":
        shape = tf.image.extract_jpeg_shape(encoded)[:2]
        box = window_fn(shape)
        if at_least is None:
            return tf.io.decode_and_crop_jpeg(encoded, box, channels=image.channels, dct_method=dct_method)
        return _decode_scaled_window(encoded, box, at_least, image.channels, dct_method)
    full = decode(encoded, image, record_hw, dct_method)
    box = window_fn(tf.shape(full)[:2])
    return tf.slice(full, [box[0], box[1], 0], [box[2], box[3], image.channels])


def _decode_scaled_window(encoded: tf.Tensor, box: tf.Tensor, at_least: tuple[int, int], channels: int,
                          dct_method: str) -> tf.Tensor:
    """The JPEG's ``box`` decoded at the largest DCT ratio that keeps it ``at_least`` (h, w).

    libjpeg then does a fraction of the inverse DCT, upsampling and colour
    conversion (the coded bytes are read all the same). A scaled decode's crop
    window is on the scaled grid, so the box is divided by the ratio, rounding
    down: it stays inside the image and moves by less than one scaled pixel.
    """
    import tensorflow as tf

    def fits(ratio: int) -> tf.Tensor:
        return tf.logical_and(box[2] >= ratio * at_least[0], box[3] >= ratio * at_least[1])

    # Each ratio that fits implies the smaller ones do: their count indexes the largest.
    index = tf.add_n([tf.cast(fits(ratio), tf.int32) for ratio in _DCT_RATIOS[1:]])

    def branch(ratio: int):
        return lambda: tf.io.decode_and_crop_jpeg(encoded, box // ratio, channels=channels, ratio=ratio,
                                                  dct_method=dct_method)

    return tf.switch_case(index, [branch(ratio) for ratio in _DCT_RATIOS])


def center_window(shape: tf.Tensor, size: tuple[int, int]) -> tf.Tensor:
    """The largest centred box of the target's aspect ratio: resizing it distorts nothing."""
    import tensorflow as tf

    h = tf.cast(shape[0], tf.float64)
    w = tf.cast(shape[1], tf.float64)
    crop_h = tf.maximum(tf.minimum(h, tf.round(w * size[0] / size[1])), 1.0)
    crop_w = tf.maximum(tf.minimum(w, tf.round(h * size[1] / size[0])), 1.0)
    y = tf.math.floordiv(h - crop_h, 2.0)
    x = tf.math.floordiv(w - crop_w, 2.0)
    return tf.cast(tf.stack([y, x, crop_h, crop_w]), tf.int32)


def resize(image: tf.Tensor, size: tuple[int, int], channels: int) -> tf.Tensor:
    """Rounded back to uint8: a box (area) filter when shrinking, bilinear when enlarging.

    Shrinking needs a filter as wide as the scale to keep from aliasing.
    TensorFlow's antialiased bilinear (``antialias=True``: a triangle as wide
    as the scale) costs about twice the JPEG decode itself, most of a
    ``resize=`` read's CPU; the box average over each output pixel's
    footprint (``method="area"``) costs a third of it and is as close to a
    Lanczos resize of the same pixels, or closer (docs/design/reader.md,
    *Resizing*). Enlarging (a random crop resized back up) is plain
    bilinear, which antialiasing would not change. An image shrunk along one
    axis and enlarged along the other (a random crop's aspect) keeps the
    antialiased bilinear, whose filter follows each axis' scale.
    """
    import tensorflow as tf

    shape = tf.shape(image)
    fewer = tf.logical_and(shape[0] >= size[0], shape[1] >= size[1])
    more = tf.logical_and(shape[0] <= size[0], shape[1] <= size[1])
    # 0: shrinks (or keeps) along both axes; 1: enlarges (or keeps) along both; 2: mixed.
    index = tf.where(fewer, 0, tf.where(more, 1, 2))
    out = tf.switch_case(index, [
        lambda: tf.image.resize(image, size, method="area"),
        lambda: tf.image.resize(image, size, method="bilinear"),
        lambda: tf.image.resize(image, size, method="bilinear", antialias=True),
    ])
    out = tf.cast(tf.clip_by_value(tf.round(out), 0.0, 255.0), tf.uint8)
    return tf.ensure_shape(out, [size[0], size[1], channels])
