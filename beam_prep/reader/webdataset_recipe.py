"""A ``--file_format webdataset`` dataset for PyTorch: its shards listed and checked, and a
``webdataset.WebDataset`` pipeline that reads every sample once an epoch at any size.

The recipe on the page it replaces lost samples: batching in each worker with
``partial=False`` dropped each worker's remainder (every sample, with 2,000 images
over 8 workers and batches of 256), and an empty worker failed with "No samples
found". Here each worker yields single samples and the ``DataLoader`` batches them;
workers and nodes share the shards out (``split_by_node``, ``split_by_worker``), and
one that gets none yields nothing instead of failing. With ``resampled``, each worker
draws shards with replacement forever, as WebDataset's recipe for many nodes does:
bound an epoch with ``with_epoch``.

Labels are what ``data_source`` and ``make_dataset`` give: the index in
``labels.txt`` (the stored ``cls`` less ``--label_offset``); images are decoded as
``data_source`` decodes them.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from beam_prep.model.dataset import DatasetInfo
from beam_prep.reader.images import stored_image
from beam_prep.reader.resolve import resolve_split

__all__ = ["shard_urls", "webdataset_pipeline"]

_FORMAT = "webdataset"
_READER = "beam_prep.webdataset_pipeline"
_EXTENSIONS = {"jpeg": "jpg", "png": "png", "raw": "raw"}


def shard_urls(path: str | os.PathLike, split: str = "train", file_format: str = _FORMAT, *,
               cache_dir: str | os.PathLike | bool | None = None, cache_max_bytes: int | None = None) -> list[str]:
    """The shard files of split ``split``, in order, once the dataset is checked to be of ``file_format``.

    For any reader that takes a list of files (``webdataset.WebDataset``, Grain's
    ``ArrayRecordDataSource``, ``tf.data``).

    Args:
      path: the dataset folder, local or ``gs://``.
      split: a split in the manifest.
      file_format: the format the caller reads: ``webdataset``, ``array_record`` or ``tfrecord``.
      cache_dir: for ``gs://``: where the shards are cached (``data_source``'s cache),
        or False for the ``gs://`` URLs themselves (to stream them, e.g. as
        ``pipe:gcloud storage cat URL``).
      cache_max_bytes: the cache's bound, as ``data_source``'s.

    Returns:
      The shards' paths: local files, or ``gs://`` URLs with ``cache_dir=False``.

    Raises:
      DatasetError: no dataset there, a dataset of another format (naming it and its
        reader), or no such split.
      StorageError: a ``gs://`` shard cannot be fetched.
    """
    chosen = resolve_split(path, split, file_format, f"a {file_format} reader", cache=cache_dir is not False,
                           cache_dir=cache_dir or None, max_bytes=cache_max_bytes).split
    return list(chosen.files)


def webdataset_pipeline(path: str | os.PathLike, split: str = "train", *, shuffle: bool | None = None,
                        shuffle_buffer: int = 1000, resampled: bool = False, seed: int = 0,
                        pil_images: bool = False, with_meta: bool = False,
                        transform: Callable[[Any], Any] | None = None,
                        target_transform: Callable[[int], Any] | None = None,
                        cache_dir: str | os.PathLike | None = None, cache_max_bytes: int | None = None) -> Any:
    """A ``webdataset.WebDataset`` of split ``split``'s ``(image, label)`` samples, for a ``DataLoader``.

    Each epoch yields every sample exactly once over all ``DataLoader`` workers and
    ``torch.distributed`` ranks (unless ``resampled``), whatever the number of shards,
    workers and samples; batch in the ``DataLoader`` (``batch_size=``).

    Args:
      path: the dataset folder, local or ``gs://`` (read through ``data_source``'s cache).
      split: a split in the manifest.
      shuffle: shuffle shards and samples; default True for ``train``, False otherwise.
      shuffle_buffer: samples held to shuffle from (per worker).
      resampled: draw shards with replacement, endlessly (WebDataset's recipe for
        many nodes, where shards do not divide evenly): bound each worker's epoch
        with ``.with_epoch(n)``.
      seed: the shuffles' seed; epoch ``e`` shuffles shards with ``seed + e``.
      pil_images: images as PIL images (for torchvision's transforms), not uint8 arrays.
      with_meta: samples are ``(image, label, meta)``, ``meta`` the sample's json (file
        name, label text, source sha256 and size).
      transform: called on each image.
      target_transform: called on each label.
      cache_dir: for ``gs://``, as ``data_source``'s.
      cache_max_bytes: for ``gs://``, as ``data_source``'s.

    Returns:
      A ``webdataset.WebDataset`` (an ``IterableDataset``).

    Raises:
      DatasetError: no dataset there, another format (naming its reader), no such split.
      OptionsError: the webdataset library is not installed (with its install command).
    """
    from beam_prep.io.libraries import require

    require(_FORMAT, _READER)
    import webdataset as wds

    info, chosen, _ = resolve_split(path, split, _FORMAT, _READER, cache_dir=cache_dir, max_bytes=cache_max_bytes)
    urls = list(chosen.files)
    if shuffle is None:
        shuffle = split == "train"
    sample = _Sample(info, pil_images, with_meta, transform, target_transform)
    dataset = wds.WebDataset(urls, resampled=resampled, shardshuffle=len(urls) if shuffle and not resampled else False,
                             detshuffle=True, seed=seed, nodesplitter=wds.split_by_node,
                             workersplitter=wds.split_by_worker, empty_check=False)
    if shuffle:
        dataset = dataset.shuffle(shuffle_buffer)
    return dataset.map(sample)


class _Sample:
    """A WebDataset sample dict to ``(image, label[, meta])``: a class, so that it pickles into workers."""

    def __init__(self, info: DatasetInfo, pil: bool, with_meta: bool, transform: Callable[[Any], Any] | None,
                 target_transform: Callable[[int], Any] | None) -> None:
        self.extension = _EXTENSIONS[info.image.format]
        self.image_format = info.image.format
        self.offset = info.label_offset
        self.pil = pil
        self.with_meta = with_meta
        self.transform = transform
        self.target_transform = target_transform

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, ...]:
        meta = json.loads(sample["json"])
        image = stored_image(sample[self.extension], self.image_format, meta["height"], meta["width"],
                             meta["channels"], self.pil)
        label = int(sample["cls"]) - self.offset
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return (image, label, meta) if self.with_meta else (image, label)
