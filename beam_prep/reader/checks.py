"""What ``verify`` computes per batch of serialized records: each record's decoded shape and label checks.

One ``tf.function`` over a batch of serialized records, traced once and
called by :mod:`beam_prep.tools.verification` on each batch a shard's pipeline
reads (and on single records, to name one that fails). It parses with the
record spec of :mod:`beam_prep.model.features` and decodes with the reader's own
:func:`~beam_prep.reader.decode.decode`, so a record passes exactly when the
reader would give training the image the manifest promises.

Decoded pixels are dropped at once: only their shape leaves the graph, with a
few booleans and the strings needed to name a record that fails.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from beam_prep.model import features
from beam_prep.model.dataset import DatasetInfo, ImageInfo
from beam_prep.reader.config import DEFAULT_DCT_METHOD
from beam_prep.reader.decode import decode

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

__all__ = ["CHECK_KEYS", "batch_checker"]

CHECK_KEYS = (features.ENCODED, features.LABEL, features.LABEL_TEXT, features.HEIGHT,
              features.WIDTH, features.CHANNELS, features.FILENAME)


def batch_checker(info: DatasetInfo, dct_method: str = DEFAULT_DCT_METHOD,
                  ) -> Callable[[tf.Tensor], dict[str, tf.Tensor]]:
    """A function from a batch of serialized records (string [b]) to their checks, each [b]:

    * ``label`` (int64), ``text`` and ``filename`` (string): as stored; a multi-label
      dataset's ids and names each joined by ``;`` (strings);
    * ``counts`` (int64 [b, len(labels)]): each record's labels, one-hot (multi-hot);
    * ``in_range``: ``0 <= label - label_offset < len(labels)``, for each of a record's ids;
    * ``text_ok``: in range, and ``labels[label - label_offset]`` is the record's text (each one);
    * ``decoded`` (int32 [b, 3]): the shape the reader's decode gives; ``stored`` (int32
      [b, 3]): the record's own height, width, channels;
    * ``shape_ok``: decoded as the manifest says (its size when fixed, its channels
      always) and as the record says.

    One traced function per image description, labels and offset (cached), so
    verifying again does not trace again.

    Raises (when called, as TensorFlow errors): a record that is not an Example
    of this spec, or whose image does not decode.
    """
    # A dataset without labels is checked as label lists: each record's must be empty.
    return _batch_checker(info.image, info.labels, info.label_offset, dct_method,
                          info.multi_label or not info.labels)


@functools.lru_cache(maxsize=8)
def _batch_checker(image: ImageInfo, label_names: tuple[str, ...], label_offset: int, dct_method: str,
                   multi_label: bool = False) -> Callable[[tf.Tensor], dict[str, tf.Tensor]]:
    import tensorflow as tf

    spec = features.tf_parse_spec(CHECK_KEYS)
    if multi_label:
        spec[features.LABEL] = tf.io.RaggedFeature(tf.int64, row_splits_dtype=tf.int64)
        spec[features.LABEL_TEXT] = tf.io.RaggedFeature(tf.string, row_splits_dtype=tf.int64)
    # Decode as stored, without the reader's size assertion: a record of another size
    # is then a problem to report, not an error that ends the shard's read.
    as_stored = dataclasses.replace(image, height=None, width=None)
    num_labels = len(label_names)
    labels = tf.constant(list(label_names) or [""], tf.string)

    def shape_of(record):
        encoded, height, width = record
        return tf.shape(decode(encoded, as_stored, (height, width), dct_method), out_type=tf.int32)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def check(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        parsed = tf.io.parse_example(serialized, spec)
        stored = tf.cast(tf.stack([parsed[features.HEIGHT], parsed[features.WIDTH],
                                   parsed[features.CHANNELS]], axis=1), tf.int32)
        decoded = tf.map_fn(shape_of, (parsed[features.ENCODED], parsed[features.HEIGHT],
                                       parsed[features.WIDTH]),
                            fn_output_signature=tf.TensorSpec([3], tf.int32))
        if image.fixed_size:
            expected = tf.reduce_all(decoded == [image.height, image.width, image.channels], axis=1)
        else:
            expected = decoded[:, 2] == image.channels
        shape_ok = tf.logical_and(expected, tf.reduce_all(decoded == stored, axis=1))

        label = parsed[features.LABEL]
        text = parsed[features.LABEL_TEXT]
        index = label - label_offset
        clipped = tf.clip_by_value(index, 0, max(num_labels - 1, 0))
        if multi_label:  # ragged [b, (n)]: every id in range, every name its id's
            in_range = tf.reduce_all(tf.logical_and(index >= 0, index < num_labels), axis=1)
            named = tf.strings.reduce_join(tf.gather(labels, clipped), axis=1, separator=";")
            text = tf.strings.reduce_join(text, axis=1, separator=";")
            label = tf.strings.reduce_join(tf.strings.as_string(label), axis=1, separator=";")
            counts = tf.math.bincount(clipped, minlength=num_labels, maxlength=num_labels, axis=-1,
                                      dtype=tf.int64)
        else:
            in_range = tf.logical_and(index >= 0, index < num_labels)
            named = tf.gather(labels, clipped)
            counts = tf.one_hot(clipped, num_labels, dtype=tf.int64)
        return {"label": label, "text": text, "filename": parsed[features.FILENAME], "counts": counts,
                "in_range": in_range, "text_ok": tf.logical_and(in_range, tf.equal(named, text)),
                "decoded": decoded, "stored": stored, "shape_ok": shape_ok}

    return check
