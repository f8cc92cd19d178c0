"""The records of an ArrayRecord or WebDataset shard as serialized ``tf.train.Example``: what
``verify`` checks, with the same checks as a TFRecord shard's.

An ArrayRecord shard holds the Examples themselves. A WebDataset sample is
turned back into the Example the TFRecord writer would have made of it (its
image, its ``cls`` as the label and its ``json``'s fields), after checking that
the sample is whole and agrees with itself; one that is not is a ``Bad`` record
with the reason, and the shard read on. A shard that cannot be read to its end
raises ``DatasetError`` after the records before the damage.

Files are opened with ``tf.io.gfile`` (local or gs://), as ``verify`` opens
every other file; an ArrayRecord shard on gs:// is copied to local disk first,
since its library reads only local files.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import NamedTuple

from beam_prep.errors import DatasetError
from beam_prep.io.libraries import require
from beam_prep.io.storage import is_local
from beam_prep.io.tar import samples, webdataset_key
from beam_prep.model.features import NO_LABEL, ImageRecord, encode_example

__all__ = ["Bad", "examples"]

_BATCH = 256
_IMAGE_FORMATS = {"jpg": "jpeg", "png": "png", "raw": "raw"}


class Bad(NamedTuple):
    """A record that could not be turned into an Example, and why."""

    reason: str


def examples(file_format: str, path: str) -> Iterator[bytes | Bad]:
    """Each record of the shard at ``path``, in order.

    Raises:
      DatasetError: the shard cannot be read to its end (after yielding what was before).
      OptionsError: the format's library is not installed.
    """
    if file_format == "array_record":
        return _array_records(path)
    if file_format == "webdataset":
        return _webdataset_samples(path)
    raise ValueError(f"{file_format} shards are read with tf.data, not here")


def _array_records(path: str) -> Iterator[bytes]:
    module = require("array_record", "verifying an array_record dataset")
    with _local(path) as local:
        try:
            reader = module.ArrayRecordReader(local)
            try:
                count = reader.num_records()
                for start in range(0, count, _BATCH):
                    yield from reader.read(list(range(start, min(count, start + _BATCH))))
            finally:
                reader.close()  # raises, too, for a file it could not read whole
        except Exception as e:  # the C++ reader raises ValueError or RuntimeError
            raise DatasetError(f"{type(e).__name__}: {e}") from e


@contextlib.contextmanager
def _local(path: str) -> Iterator[str]:
    if is_local(path):
        yield path
        return
    import tensorflow as tf

    folder = tempfile.mkdtemp(prefix="beam-prep-verify-")
    try:
        local = os.path.join(folder, "shard")
        try:
            tf.io.gfile.copy(path, local)
        except tf.errors.OpError as e:
            raise DatasetError(f"cannot be copied to local disk to read: {e.message}") from e
        yield local
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _webdataset_samples(path: str) -> Iterator[bytes | Bad]:
    import tensorflow as tf

    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            for key, members in samples(f):
                yield _sample_example(key, {name.rsplit("/", 1)[-1].partition(".")[2]: data
                                            for name, data in members})
    except ValueError as e:
        raise DatasetError(f"not a whole tar file: {e}") from e
    except tf.errors.OpError as e:
        raise DatasetError(f"{type(e).__name__}: {e.message}") from e


def _sample_example(key: str, members: dict[str, bytes]) -> bytes | Bad:
    """A sample as the Example the TFRecord writer makes, or why it cannot be one.

    A sample of a dataset without labels has no ``cls`` and no label in its json: its Example
    has no label keys, as the other formats' records."""
    images = [ext for ext in members if ext in _IMAGE_FORMATS]
    missing = [part for part, ok in (("an image (jpg, png or raw)", len(images) == 1),
                                     ("json", "json" in members)) if not ok]
    try:
        about = json.loads(members["json"]) if "json" in members else {}
    except ValueError as e:
        return Bad(f"sample {key}'s json cannot be read: {type(e).__name__}: {e}")
    labelled = "cls" in members or (isinstance(about, dict) and "label" in about)
    if labelled and "cls" not in members:
        missing.insert(1, "cls")
    if missing:
        return Bad(f"sample {key} lacks {', '.join(missing)}: it has {', '.join(sorted(members)) or 'nothing'}")
    try:
        label = int(members["cls"]) if labelled else NO_LABEL
        record = ImageRecord(encoded=members[images[0]], image_format=_IMAGE_FORMATS[images[0]],
                             height=int(about["height"]), width=int(about["width"]),
                             channels=int(about["channels"]), label=label,
                             label_text=str(about["label_text"]) if labelled else "",
                             filename=str(about["filename"]), sha256=str(about["sha256"]))
    except (ValueError, KeyError, TypeError) as e:
        return Bad(f"sample {key}'s cls or json cannot be read: {type(e).__name__}: {e}")
    if labelled and about.get("label") != label:
        return Bad(f"sample {key}'s cls is {label} but its json's label is {about.get('label')!r}")
    if webdataset_key(record.filename) != key:
        return Bad(f"sample {key}'s key is not the one of its file name {record.filename!r} "
                   f"({webdataset_key(record.filename)}): renamed, or two samples mixed")
    return encode_example(record)
