"""``data_source``: an array_record dataset as a random-access source of decoded examples.

For Grain (``grain.MapDataset.source``) and PyTorch (a map-style ``Dataset``).

It imports neither TensorFlow nor Beam: a JAX or PyTorch training host should
not pay for either. Records are the writer's ``tf.train.Example``, parsed with
protobuf alone (``features.decode_example``); images are decoded with Pillow,
as the writer encoded them, so the pixels are the writer's own. Lookups go
through the ``array_record`` library's ``ArrayRecordDataSource``, which Grain
itself uses: it opens each shard on first use, and pickles without its open
files, so a source can be handed to worker processes.
"""
from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import Any, SupportsIndex

import numpy as np

from beam_prep.errors import DatasetError, OptionsError
from beam_prep.io.libraries import require
from beam_prep.io.storage import is_local, join
from beam_prep.model import features
from beam_prep.model.dataset import MANIFEST, DatasetInfo, SplitInfo, parse_manifest

__all__ = ["ArrayRecordSource", "data_source"]

_FORMAT = "array_record"
_READER = "beam_prep.data_source"


def _read_info(root: str) -> DatasetInfo:
    """The manifest at ``root``, read with ``open()``: ArrayRecord files are read from local disk only.

    Raises:
      DatasetError: no manifest, or one that is malformed.
      OptionsError: ``root`` is not a local path.
    """
    if not is_local(root):
        raise OptionsError(f"{_READER} reads ArrayRecord files from local disk (the array_record library "
                           f"opens them itself), not {root}: copy the dataset to local disk first "
                           f"(gcloud storage cp -r {root} .), or mount the bucket (gcsfuse)")
    path = join(root, MANIFEST)
    try:
        with open(path, "rb") as f:
            text = f.read()
    except FileNotFoundError as e:
        raise DatasetError(f"no {MANIFEST} at {path}: not a beam-prep dataset, or its pipeline has not "
                           "finished (the manifest is written last, after every shard)") from e
    except OSError as e:
        raise DatasetError(f"cannot read {path}: {e}") from e
    return DatasetInfo.from_json(parse_manifest(text, path), root, path)


class ArrayRecordSource:
    """A split's records by index: ``len(source)``, ``source[i]`` and ``source.__getitems__(keys)``.

    Each record is a dict: ``image`` (uint8, height x width x channels), ``label``
    (the label's index in ``labels``: the stored id less ``label_offset``, as
    ``make_dataset`` gives it), ``label_text``, ``filename`` and ``sha256`` (of
    the source file). Made by ``data_source``.
    """

    def __init__(self, info: DatasetInfo, split: SplitInfo) -> None:
        require(_FORMAT, _READER)  # the C++ module, with its install command if missing
        from array_record.python.array_record_data_source import ArrayRecordDataSource

        self.info = info
        self.split = split
        self._records = ArrayRecordDataSource(list(split.files)) if split.shards else None
        if len(self) != split.num_examples:
            raise DatasetError(f"split {split.name!r} of {info.root} holds {len(self)} records but its "
                               f"manifest says {split.num_examples}: the dataset is damaged")

    def __len__(self) -> int:
        return len(self._records) if self._records is not None else 0

    def __getitem__(self, index: SupportsIndex) -> dict[str, Any]:
        index = index.__index__()
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"record {index} of split {self.split.name!r}, which holds {len(self)}")
        return self.decode(self._records[index])

    def __getitems__(self, indices: Sequence[SupportsIndex]) -> list[dict[str, Any]]:
        """Several records in one call, read in parallel by shard (what Grain and PyTorch batch with)."""
        return [self.decode(record) for record in self._records.__getitems__(list(indices))]

    def decode(self, serialized: bytes) -> dict[str, Any]:
        """One stored record as this source returns it."""
        values = features.decode_example(serialized)
        return {
            "image": _pixels(values, self.info.image.format),
            "label": int(values[features.LABEL]) - self.info.label_offset,
            "label_text": values[features.LABEL_TEXT].decode("utf-8"),
            "filename": values[features.FILENAME].decode("utf-8", "surrogateescape"),
            "sha256": values[features.SHA256].decode("ascii"),
        }

    def __repr__(self) -> str:
        return (f"ArrayRecordSource({self.info.root!r}, split={self.split.name!r}, "
                f"records={len(self)}, shards={len(self.split.shards)})")


def _pixels(values: dict[str, Any], image_format: str) -> np.ndarray:
    """A record's image as uint8 height x width x channels."""
    height, width, channels = (int(values[k]) for k in (features.HEIGHT, features.WIDTH, features.CHANNELS))
    encoded = values[features.ENCODED]
    if image_format == "raw":
        return np.frombuffer(encoded, dtype=np.uint8).reshape(height, width, channels)
    from PIL import Image

    with Image.open(io.BytesIO(encoded)) as img:
        pixels = np.asarray(img.convert("L" if channels == 1 else "RGB"))
    return pixels.reshape(height, width, channels)


def data_source(path: str | os.PathLike, split: str = "train") -> ArrayRecordSource:
    """A random-access source over split ``split`` of the array_record dataset at ``path``.

    Use it as Grain's source (``grain.MapDataset.source(data_source(path))``)
    or as a PyTorch map-style ``Dataset``; docs/guides/grain-pytorch.md shows
    both. It reads without TensorFlow or Beam.

    Args:
      path: the dataset folder, on local disk.
      split: a split in the manifest.

    Returns:
      An ``ArrayRecordSource``: ``len``, and a decoded dict per index.

    Raises:
      DatasetError: no dataset there, a dataset of another format (naming its reader),
        no such split, or shards that do not hold what the manifest says.
      OptionsError: ``path`` is not local, or the array_record library is not installed
        (the message gives its install command; beam-prep's ``array_record`` extra
        installs it too).
    """
    root = os.path.abspath(os.fspath(path)) if is_local(os.fspath(path)) else os.fspath(path).rstrip("/")
    info = _read_info(root)
    info.require_format(_FORMAT, _READER)
    if split not in info.splits:
        raise DatasetError(f"{root} has no split {split!r}; it has {', '.join(info.splits)}")
    return ArrayRecordSource(info, info.splits[split])

