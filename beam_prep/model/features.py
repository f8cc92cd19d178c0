"""The one record layout that the writer encodes and the reader parses.

Keys follow TensorFlow's ImageNet tooling (``image/encoded``,
``image/class/label``, ...) so existing training code reads our files.

The writer side must not import TensorFlow: every Beam worker process would pay
its multi-second import and hundreds of MB of memory for nothing. So the
``tf.train.Example`` message is built here from its schema with protobuf alone,
in a private descriptor pool (no clash with TensorFlow's own ``tensorflow.Example``
when both live in one process). The bytes are the same wire format that
``tf.io.parse_example`` reads. TensorFlow is imported only by the functions
that the reader calls.
"""
from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf


class FeatureKind(enum.Enum):
    BYTES = "bytes"
    INT64 = "int64"
    FLOAT = "float"  # extra features alone (--metadata columns)


# key -> kind: the whole schema, in one place.
ENCODED = "image/encoded"
FORMAT = "image/format"
HEIGHT = "image/height"
WIDTH = "image/width"
CHANNELS = "image/channels"
LABEL = "image/class/label"
LABEL_TEXT = "image/class/text"
FILENAME = "image/filename"
SHA256 = "image/key/sha256"

SCHEMA: Mapping[str, FeatureKind] = {
    ENCODED: FeatureKind.BYTES,
    FORMAT: FeatureKind.BYTES,
    HEIGHT: FeatureKind.INT64,
    WIDTH: FeatureKind.INT64,
    CHANNELS: FeatureKind.INT64,
    LABEL: FeatureKind.INT64,
    LABEL_TEXT: FeatureKind.BYTES,
    FILENAME: FeatureKind.BYTES,
    SHA256: FeatureKind.BYTES,
}

# The label id of a record in a dataset without labels (a table without a label column over
# images in no label folder, as an image-captioning set): it holds no label features at all.
NO_LABEL = -2
LABEL_KEYS = (LABEL, LABEL_TEXT)

IMAGE_FORMATS = ("jpeg", "png", "raw")
# Stored bytes per sample (pixel x channel) of a 224-ish photo in each format, measured
# on photographs: for sizing shards (writer) and shuffle buffers (reader), nothing exact.
BYTES_PER_SAMPLE = {"jpeg": 0.15, "png": 0.6, "raw": 1.0}


@dataclasses.dataclass(frozen=True)
class ImageRecord:
    """One labelled image, ready to serialise.

    ``label_ids`` and ``label_texts``, for multi-label data, replace ``label`` and
    ``label_text`` with lists (the same keys, each a list of every label's id or name);
    single-label records keep one value each, so existing readers read them unchanged.
    ``extra``: the other features (--metadata's columns), str, int or float each.
    A ``label`` of ``NO_LABEL`` (a dataset without labels) leaves both label keys out.
    """

    encoded: bytes
    image_format: str
    height: int
    width: int
    channels: int
    label: int
    label_text: str
    filename: str
    sha256: str
    label_ids: tuple[int, ...] | None = None
    label_texts: tuple[str, ...] | None = None
    extra: Mapping[str, Any] | None = None

    def values(self) -> dict[str, Any]:
        """Feature key -> value, or a list of values (multi-label labels)."""
        values = {
            ENCODED: self.encoded,
            FORMAT: self.image_format.encode(),
            HEIGHT: self.height,
            WIDTH: self.width,
            CHANNELS: self.channels,
            LABEL: self.label,
            LABEL_TEXT: self.label_text.encode("utf-8"),
            FILENAME: self.filename.encode("utf-8", "surrogateescape"),  # a name's own bytes
            SHA256: self.sha256.encode(),
        }
        if self.label == NO_LABEL:
            del values[LABEL], values[LABEL_TEXT]
        elif self.label_ids is not None:
            values[LABEL] = list(self.label_ids)
            values[LABEL_TEXT] = [name.encode("utf-8") for name in self.label_texts or ()]
        for key, value in (self.extra or {}).items():
            values[key] = value.encode("utf-8") if isinstance(value, str) else value
        return values


def _example_message_class():
    """tensorflow/core/example/{example,feature}.proto, as a runtime schema."""
    f = descriptor_pb2.FileDescriptorProto(
        name="beam_prep/example.proto", package="tensorflow", syntax="proto3"
    )
    repeated = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    optional = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    t = descriptor_pb2.FieldDescriptorProto

    def message(name: str, *fields: tuple[str, int, int, int, str]):
        m = f.message_type.add(name=name)
        for field_name, number, label, ftype, type_name in fields:
            m.field.add(name=field_name, number=number, label=label, type=ftype,
                        type_name=type_name or None)
        return m

    message("BytesList", ("value", 1, repeated, t.TYPE_BYTES, ""))
    message("FloatList", ("value", 1, repeated, t.TYPE_FLOAT, ""))
    message("Int64List", ("value", 1, repeated, t.TYPE_INT64, ""))
    feature = message(
        "Feature",
        ("bytes_list", 1, optional, t.TYPE_MESSAGE, ".tensorflow.BytesList"),
        ("float_list", 2, optional, t.TYPE_MESSAGE, ".tensorflow.FloatList"),
        ("int64_list", 3, optional, t.TYPE_MESSAGE, ".tensorflow.Int64List"),
    )
    feature.oneof_decl.add(name="kind")
    for field in feature.field:
        field.oneof_index = 0
    features = message(
        "Features",
        ("feature", 1, repeated, t.TYPE_MESSAGE, ".tensorflow.Features.FeatureEntry"),
    )
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, label=optional, type=t.TYPE_STRING)
    entry.field.add(name="value", number=2, label=optional, type=t.TYPE_MESSAGE,
                    type_name=".tensorflow.Feature")
    message("Example", ("features", 1, optional, t.TYPE_MESSAGE, ".tensorflow.Features"))

    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


Example = _example_message_class()


def encode_example(record: ImageRecord) -> bytes:
    """Serialises a record as a ``tf.train.Example``: the bytes of protobuf's deterministic
    serialisation (features by key), written out directly (faster than filling the message, and the
    image's bytes copied once; tests/model/test_example_encoding.py holds it to protobuf's own). A float feature goes
    through protobuf, whose conversion to 32 bits (out of range included) this does not repeat, and so do
    extra keys one of which begins another (protobuf's order of those is not the order of their bytes).

    Raises:
      ValueError: an int feature beyond 64 bits (as protobuf refuses one).
    """
    values = record.values()
    keys = sorted(values)
    if record.extra and _one_begins_another(keys):
        return _encode_with_protobuf(values)
    pieces: list[bytes] = []  # joined once: the image's bytes are copied once, not at each level
    total = 0
    for key in keys:
        value = values[key]
        kind = SCHEMA.get(key) or kind_of(value)
        items = value if isinstance(value, list) else [value]
        if kind is FeatureKind.BYTES:
            inner: list[bytes] = []
            size = 0
            for item in items:
                length = _varint(len(item))
                inner += (b"\n", length, item)
                size += 1 + len(length) + len(item)
            tag = b"\n"
        elif kind is FeatureKind.INT64:
            packed = b"".join([_int64(int(item)) for item in items])
            inner = [b"\n", _varint(len(packed)), packed] if packed else []
            size = 1 + len(inner[1]) + len(packed) if packed else 0
            tag = b"\x1a"
        else:
            return _encode_with_protobuf(values)
        name = _KEYS.get(key) or _key(key)
        body = _varint(size)
        feature = 1 + len(body) + size
        length = _varint(feature)
        entry = len(name) + 1 + len(length) + feature
        head = _varint(entry)
        pieces += (b"\n", head, name, b"\x12", length, tag, body, *inner)
        total += 1 + len(head) + entry
    return b"".join([b"\n", _varint(total), *pieces])


def _one_begins_another(keys: list[str]) -> bool:
    """Whether one of ``keys`` (sorted) begins another: protobuf (upb) puts such a key after the longer ones
    it begins ("tags" before "tag"), not in the order of their bytes, so such a record goes through protobuf.
    Of sorted keys, one begins a later one only if it begins the next."""
    return any(later.startswith(key) for key, later in itertools.pairwise(keys))


def _varint(n: int) -> bytes:
    """``n`` (not negative) as a protobuf varint."""
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _int64(n: int) -> bytes:
    """``n`` as an int64 field's varint (a negative one in ten bytes, two's complement)."""
    if not -(1 << 63) <= n < 1 << 63:
        raise ValueError(f"Value out of range: {n}")
    return _varint(n + (1 << 64) if n < 0 else n)


def _key(key: str) -> bytes:
    """A map entry's key field (tag, length, UTF-8)."""
    name = key.encode("utf-8")
    return b"\n" + _varint(len(name)) + name


_SMALL = [bytes((n,)) for n in range(0x80)]
_KEYS = {key: _key(key) for key in SCHEMA}


def _encode_with_protobuf(values: Mapping[str, Any]) -> bytes:
    """``encode_example`` by filling protobuf's message: for a record with a float feature, or with extra
    keys one of which begins another."""
    example = Example()
    features = example.features.feature
    for key, value in values.items():
        items = value if isinstance(value, list) else [value]
        kind = SCHEMA.get(key) or kind_of(value)
        if kind is FeatureKind.BYTES:
            features[key].bytes_list.value.extend(items)
        elif kind is FeatureKind.FLOAT:
            features[key].float_list.value.extend(items)
        else:
            features[key].int64_list.value.extend(int(v) for v in items)
    return example.SerializeToString(deterministic=True)


def kind_of(value: Any) -> FeatureKind:
    """An extra feature's kind, by its value's Python type."""
    if isinstance(value, (bytes, str)):
        return FeatureKind.BYTES
    return FeatureKind.FLOAT if isinstance(value, float) else FeatureKind.INT64


def decode_example(serialized: bytes) -> dict[str, Any]:
    """Parses one record without TensorFlow: for tools and tests, not for training."""
    example = Example.FromString(serialized)
    out: dict[str, Any] = {}
    for key, kind in SCHEMA.items():
        if key in LABEL_KEYS and key not in example.features.feature:
            continue  # a record of a dataset without labels
        feature = example.features.feature[key]
        out[key] = (feature.bytes_list.value[0] if kind is FeatureKind.BYTES
                    else feature.int64_list.value[0])
    return out


def label_and_filename(serialized: bytes) -> tuple[int, str]:
    """A record's stored label id and file name, without TensorFlow and without decoding its image
    (what a reader's ``targets`` and ``samples`` are read from)."""
    feature = Example.FromString(serialized).features.feature
    return (int(feature[LABEL].int64_list.value[0]),
            feature[FILENAME].bytes_list.value[0].decode("utf-8", "surrogateescape"))


def sha256_and_labels(serialized: bytes) -> tuple[str, tuple[str, ...]]:
    """A record's source sha256 (hex) and the label names it counts under in a manifest's
    class counts (each of a multi-label record's; ``("",)`` without labels), without TensorFlow."""
    feature = Example.FromString(serialized).features.feature
    labels = (tuple(v.decode("utf-8") for v in feature[LABEL_TEXT].bytes_list.value)
              if LABEL_TEXT in feature else ("",))
    return feature[SHA256].bytes_list.value[0].decode(), labels


def sha256_and_filename(serialized: bytes) -> tuple[str, str]:
    """A record's source sha256 (hex) and file name (its path under the run's input), without TensorFlow
    and without decoding its image: what an append reads the records already in a dataset by."""
    feature = Example.FromString(serialized).features.feature
    return (feature[SHA256].bytes_list.value[0].decode(),
            feature[FILENAME].bytes_list.value[0].decode("utf-8", "surrogateescape"))


def decode_all(serialized: bytes) -> dict[str, list[Any]]:
    """Every feature of one record, each as its list of values, without TensorFlow: multi-label
    records and extra features too (for tools and tests)."""
    example = Example.FromString(serialized)
    return {key: list(getattr(feature, feature.WhichOneof("kind")).value) if feature.WhichOneof("kind") else []
            for key, feature in example.features.feature.items()}


def tf_parse_spec(keys: tuple[str, ...] | None = None) -> dict[str, tf.io.FixedLenFeature]:
    """The ``tf.io.parse_example`` spec for ``keys`` (default: every key)."""
    import tensorflow as tf

    dtypes = {FeatureKind.BYTES: tf.string, FeatureKind.INT64: tf.int64}
    return {key: tf.io.FixedLenFeature([], dtypes[SCHEMA[key]])
            for key in (keys or tuple(SCHEMA))}
