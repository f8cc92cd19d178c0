"""``encode_example`` writes the Example's bytes itself: held here to protobuf's own deterministic
serialisation of the same message (the oracle), filled as TensorFlow's tooling fills one."""
from __future__ import annotations

import itertools

import pytest

from beam_prep.model.features import NO_LABEL, SCHEMA, Example, FeatureKind, ImageRecord, encode_example, kind_of


def protobuf_bytes(record: ImageRecord) -> bytes:
    example = Example()
    for key, value in record.values().items():
        items = value if isinstance(value, list) else [value]
        kind = SCHEMA.get(key) or kind_of(value)
        feature = example.features.feature[key]
        if kind is FeatureKind.BYTES:
            feature.bytes_list.value.extend(items)
        elif kind is FeatureKind.FLOAT:
            feature.float_list.value.extend(items)
        else:
            feature.int64_list.value.extend(int(v) for v in items)
    return example.SerializeToString(deterministic=True)


def record(**changes) -> ImageRecord:
    fields = {"encoded": b"\xff\xd8" + bytes(range(256)) * 3, "image_format": "jpeg", "height": 224, "width": 224,
              "channels": 3, "label": 7, "label_text": "class_007", "filename": "class_007/img_000123.jpg",
              "sha256": "ab" * 32}
    return ImageRecord(**{**fields, **changes})


CASES = {
    "the default record": record(),
    "no label": record(label=NO_LABEL, label_text=""),
    "label 0, empty text": record(label=0, label_text=""),
    "multi-label": record(label_ids=(3, 0, 127, 128, 16384), label_texts=("c", "a", "é", "x" * 200, "")),
    "multi-label, none": record(label_ids=(), label_texts=()),
    "an empty image": record(encoded=b""),
    "lengths of every varint width": record(encoded=b"x" * 128, filename="f" * 16384, label_text="t" * 127),
    "a large image": record(encoded=bytes(3_000_000)),
    "a name not UTF-8 (surrogate-escaped)": record(filename="bad\udcff\udcfe.jpg"),
    "unicode names": record(label_text="猫 и 🐱", filename="猫/🐱 ;$(x) ../x.jpg"),
    "extra features": record(extra={"caption": "a cat", "zz": -1, "aa": 2**63 - 1, "id": -(2**63), "flag": True,
                                    "é key": "v", "B": "", "n": 0}),
    "extra floats": record(extra={"score": 0.1, "neg": -1e30, "big": 1e300, "nan": float("nan"), "n": 5}),
    "an extra key sorting before the schema's": record(extra={"a": "first", "image/a": 1, "image/zz": "last"}),
    # protobuf (upb) puts a key after every longer key it begins: "tags" before "tag", "image/class/label"
    # before "image/class"
    "extra keys that begin others": record(extra={"tag": "a", "tags": "b", "tag_2": 3, "image/class": 1,
                                                  "imag": 7}),
    "an extra key that begins another, ints alone": record(extra={"id": 1, "id2": 2}),
}


@pytest.mark.parametrize("name", CASES)
def test_the_bytes_are_protobufs(name):
    assert encode_example(CASES[name]) == protobuf_bytes(CASES[name])


def test_every_label_id_and_size_gives_protobufs_bytes():
    for label, size in itertools.product((0, 1, 127, 128, 300, 2**31, 2**62, -2, -1), (0, 1, 65535, 2**31 - 1)):
        r = record(label=label, height=size, width=size + 1, channels=size % 5)
        assert encode_example(r) == protobuf_bytes(r), (label, size)


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**80])
def test_an_int_beyond_64_bits_is_refused_as_protobuf_refuses_it(value):
    r = record(extra={"big": value})
    with pytest.raises(ValueError):
        protobuf_bytes(r)
    with pytest.raises(ValueError):
        encode_example(r)
