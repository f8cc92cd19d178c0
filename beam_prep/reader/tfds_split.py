"""The TFDS split string that reads a split of a beam-prep dataset as a version holds it.

An append's shards are TFDS splits of their own (``train-v2``: ``model.tfds_metadata``), so a
TFDS user reads the whole latest split as ``train+train-v2``; ``tfds_split`` spells it out.
"""
from __future__ import annotations

import os

from beam_prep.model import tfds_metadata
from beam_prep.reader.sources import load_info

__all__ = ["tfds_split"]


def tfds_split(path: str | os.PathLike, split: str = "train", version: int | None = None) -> str:
    """The split string for ``tfds.builder_from_directory(path).as_dataset(split=...)`` that reads
    ``split`` of the dataset in ``path`` as ``version`` holds it (None: the latest).

    Args:
      path: the dataset folder (local or ``gs://``).
      split: the dataset's split.
      version: the dataset version to read (``manifest.json``'s ``versions``); None: the latest.

    Returns:
      ``"train"`` for a dataset of one version; ``"train+train-v2"`` after an append.

    Raises:
      DatasetError: no manifest, no such version, or no such split at that version.
    """
    return tfds_metadata.split_spec(load_info(path), split, version)
