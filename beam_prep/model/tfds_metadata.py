"""The metadata TensorFlow Datasets needs to read a beam-prep dataset folder as it is.

``tfds.builder_from_directory(OUT)`` reads ``dataset_info.json``,
``features.json`` and one names file per ``ClassLabel``, then the shards that
``dataset_info.json``'s file name template and shard lengths point to. Written
here from our own :class:`~beam_prep.model.dataset.DatasetInfo` with plain JSON, in
the format ``tfds.folder_dataset.write_metadata`` writes, so neither the Beam
workers nor the launcher need TensorFlow Datasets installed.

The features are declared under our record's own keys (``image/encoded``,
``image/class/label``...), flat, so TFDS parses exactly the keys we write and
yields them under the same names; ``tfds.show_examples`` finds the image and
the label because they are top-level features.

TFDS reads only uncompressed TFRecords and needs each shard's record count, so
:func:`unsupported` says why a dataset gets no metadata (GZIP shards, a
manifest without per-shard record counts, raw pixels of varying size).

TFDS describes a split's shards with one name template and one shard count, and an append's
shards (``train-v2-00000-of-00003.tfrecord``) cannot share the first run's: each version's
additions to a split are a TFDS split of their own, named as its shards are (``train-v2``), so
the one template fits every shard, and ``train+train-v2`` reads the whole split as version 2
holds it (:func:`split_spec`; docs/guides/output-format.md, "TFDS's metadata").
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import beam_prep
from beam_prep.errors import DatasetError
from beam_prep.model import features
from beam_prep.model.dataset import DatasetInfo, ImageInfo, shard_suffix

__all__ = [
    "CLASS_LABEL_NAMES",
    "DATASET_INFO",
    "FEATURES",
    "FILEPATH_TEMPLATE",
    "FILES",
    "class_names",
    "dataset_name",
    "metadata_files",
    "split_spec",
    "tfds_splits",
    "unsupported",
]

DATASET_INFO = "dataset_info.json"
FEATURES = "features.json"
# TFDS names a ClassLabel's names file after its feature key, "/" turned into ".".
CLASS_LABEL_NAMES = features.LABEL.replace("/", ".") + ".labels.txt"
FILES = (DATASET_INFO, FEATURES, CLASS_LABEL_NAMES)
# Our shard names (layout.shard_name) in TFDS's template notation: "train-00003-of-00016.tfrecord".
# SHARD_X_OF_Y is TFDS's five-digit "00003-of-00016", as layout.SHARD_TEMPLATE writes it.
FILEPATH_TEMPLATE = "{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}"
# --file_format -> TFDS's fileFormat, for the formats TFDS reads.
TFDS_FILE_FORMATS = {"tfrecord": "tfrecord", "array_record": "array_record"}
VERSION = "1.0.0"

_TFDS = "tensorflow_datasets.core.features."
_TEXT = {"pythonClassName": _TFDS + "text_feature.Text", "text": {}}
_INT64 = {"pythonClassName": _TFDS + "scalar.Scalar",
          "tensor": {"shape": {}, "dtype": "int64", "encoding": "none"}}


def unsupported(info: DatasetInfo) -> str | None:
    """Why TFDS could not read this dataset, or None when it can."""
    if info.file_format not in TFDS_FILE_FORMATS:
        return f"TFDS does not read {info.file_format} shards: write tfrecord or array_record"
    if info.compression != "NONE":
        return (f"TFDS reads only uncompressed TFRecords and these are {info.compression}: "
                "write with --compression none")
    if any(split.shard_num_examples is None for split in info.splits.values()):
        return ("TFDS needs each shard's record count, which this manifest lacks "
                "(edited, or written by an older beam-prep): prepare the dataset again")
    if info.image.format == "raw" and not info.image.fixed_size:
        return "TFDS cannot describe raw pixels of varying size: give --image_size, or write jpeg or png"
    if not info.labels:
        return "the records hold no label, which this TFDS description (one ClassLabel) needs: read them with beam_prep.reader"
    if info.multi_label or info.extra_features:
        return ("the records hold a list of labels or --metadata's extra features, which this TFDS "
                "description (one ClassLabel) does not cover: read them with beam_prep.reader")
    suffix = shard_suffix(info.file_format, info.compression.lower())
    for name, shards, _ in tfds_splits(info):
        expected = [_shard_file(name, i, len(shards), suffix) for i in range(len(shards))]
        if list(shards) != expected:
            wrong = next(s for s, e in zip(shards, expected) if s != e)
            return (f"shard {wrong} of TFDS split {name!r} is not named as its template {FILEPATH_TEMPLATE} "
                    "names it: the manifest was edited")
    return None


def _shard_file(split: str, index: int, count: int, suffix: str) -> str:
    """``FILEPATH_TEMPLATE`` filled in, as TFDS fills it (its five-digit ``SHARD_X_OF_Y``)."""
    return f"{split}-{index:05d}-of-{count:05d}{suffix}"


def _version_split(split: str, version: int) -> str:
    """The TFDS split of what ``version`` added to ``split``: its own name for version 1, else the
    name its shards start with (``layout.shard_name``: ``train-v2``)."""
    return split if version == 1 else f"{split}-v{version}"


def tfds_splits(info: DatasetInfo) -> list[tuple[str, tuple[str, ...], tuple[int, ...]]]:
    """The dataset's TFDS splits, oldest version first: ``(name, shard files, records per shard)``
    for each split each version added shards to (``train``, ``validation``, ``train-v2``...).
    Records per shard are empty where the manifest does not know them."""
    counts = {name: n for split in info.splits.values()
              for name, n in zip(split.shards, split.shard_num_examples or ())}
    return [(_version_split(split, version.version), tuple(shards), tuple(counts[s] for s in shards if s in counts))
            for version in info.history for split in info.splits
            for shards in [version.added.get(split, ((), 0, None))[0]] if shards]


def split_spec(info: DatasetInfo, split: str, version: int | None = None) -> str:
    """The TFDS split string that reads ``split`` as ``version`` holds it (None: the latest): its
    version-1 records, then each later version's (``train+train-v2+train-v3``), for
    ``builder.as_dataset(split=...)``.

    Raises:
      DatasetError: no such version, or the split holds no record at that version.
    """
    held = info.at_version(version)
    names = [_version_split(split, v.version) for v in held.history if v.added.get(split, ((), 0, None))[0]]
    if not names:
        raise DatasetError(f"{info.root or 'this dataset'} has no split {split!r} at version {held.version}: "
                           f"it has {', '.join(map(repr, held.splits)) or 'none'}")
    return "+".join(names)


def class_names(labels: Sequence[str], label_offset: int) -> list[str]:
    """The ClassLabel's names, indexed by stored id: ``label_offset`` placeholders, then the labels.

    TFDS needs a name for every id below the largest, and unique names, so the
    reserved ids get ``reserved_<id>`` (with more underscores in front should a
    label have that name already).
    """
    taken = set(labels)
    reserved = []
    for i in range(label_offset):
        name = f"reserved_{i}"
        while name in taken:
            name = "_" + name
        taken.add(name)
        reserved.append(name)
    return reserved + list(labels)


def _image_feature(image: ImageInfo) -> dict[str, Any]:
    shape = {"dimensions": [str(d) for d in (image.height or -1, image.width or -1, image.channels)]}
    if image.format == "raw":
        # Raw uint8 pixels are what a TFDS Tensor stores with encoding "bytes": decode_raw and reshape.
        return {"pythonClassName": _TFDS + "tensor_feature.Tensor",
                "tensor": {"shape": shape, "dtype": "uint8", "encoding": "bytes"}}
    return {"pythonClassName": _TFDS + "image_feature.Image",
            "image": {"shape": shape, "dtype": "uint8", "encodingFormat": image.format}}


def _features_json(info: DatasetInfo) -> dict[str, Any]:
    declared: dict[str, Any] = {}
    for key, kind in features.SCHEMA.items():
        if key == features.ENCODED:
            declared[key] = _image_feature(info.image)
        elif key == features.LABEL:
            declared[key] = {"pythonClassName": _TFDS + "class_label_feature.ClassLabel",
                             "classLabel": {"numClasses": str(info.label_offset + info.num_classes)}}
        else:
            declared[key] = _TEXT if kind is features.FeatureKind.BYTES else _INT64
    return {"pythonClassName": _TFDS + "features_dict.FeaturesDict",
            "featuresDict": {"features": declared}}


def _dataset_info_json(info: DatasetInfo, name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "version": VERSION,
        "fileFormat": TFDS_FILE_FORMATS[info.file_format],
        "splits": [{"name": name, "filepathTemplate": FILEPATH_TEMPLATE,
                    "shardLengths": [str(n) for n in lengths]}
                   for name, _, lengths in tfds_splits(info)],
        "supervisedKeys": {"tuple": {"items": [{"featureKey": features.ENCODED},
                                               {"featureKey": features.LABEL}]}},
    }


def dataset_name(root: str) -> str:
    """The output folder's name in TFDS's snake_case form: the dataset's ``builder.name``."""
    name = re.sub(r"[^0-9a-z]+", "_", root.rstrip("/").rsplit("/", 1)[-1].lower()).strip("_")
    return name if name and name[0].isalpha() else f"dataset_{name}".rstrip("_")


def metadata_files(info: DatasetInfo, name: str | None = None,
                   description: str | None = None) -> dict[str, list[str]]:
    """File name -> its lines, for the dataset folder.

    ``name`` is the dataset's TFDS name (``builder.name``; by default the
    folder's, ``dataset_name``); ``description`` its ``info.description`` (by
    default what it holds and which beam-prep wrote it).

    Raises:
      DatasetError: TFDS could not read this dataset (:func:`unsupported` says why).
    """
    reason = unsupported(info)
    if reason is not None:
        raise DatasetError(f"no TFDS metadata: {reason}")
    if name is None:
        name = dataset_name(info.root)
    if description is None:
        description = (f"{info.num_classes} labels, {info.image.format} images, written by beam-prep "
                       f"{beam_prep.__version__}; label ids start at {info.label_offset}.")
        if info.version > 1:
            whole = ", ".join(split_spec(info, split) for split in info.splits)
            description += (f" Version {info.version}: each version's additions are a split of their own "
                            f"(train-v2: what version 2 added); read a whole split as {whole}.")
    return {
        DATASET_INFO: [json.dumps(_dataset_info_json(info, name, description), indent=2, ensure_ascii=False)],
        FEATURES: [json.dumps(_features_json(info), indent=2)],
        CLASS_LABEL_NAMES: class_names(info.labels, info.label_offset),
    }
