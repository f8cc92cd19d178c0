"""The dataset and split a reader reads: one resolution for ``make_dataset``, ``data_source``,
``shard_urls`` and ``webdataset_pipeline``.

One function, so that every reader checks in one order (the manifest, read and its
names checked, or the ``gs://`` shard cache filled; then the format; then the split)
and words each failure alike.
"""
from __future__ import annotations

import os
from typing import NamedTuple

from beam_prep.errors import DatasetError, OptionsError
from beam_prep.io.storage import is_local
from beam_prep.model.dataset import FILE_FORMATS, DatasetInfo, SplitInfo
from beam_prep.reader.manifest_file import normalise_root, read_manifest_info

__all__ = ["Resolved", "resolve_split"]


class Resolved(NamedTuple):
    """What a reader reads: the dataset (rooted at its local copy for a cached ``gs://`` one),
    the split, and the folder asked for (``gs://...`` for a cached copy)."""

    info: DatasetInfo
    split: SplitInfo
    origin: str


def resolve_split(path: str | os.PathLike, split: str, file_format: str, reader: str, *, cache: bool = True,
                  cache_dir: str | os.PathLike | None = None, max_bytes: int | None = None,
                  version: int | None = None) -> Resolved:
    """The dataset at ``path`` and its split ``split``, checked to be of ``file_format``: what every
    reader (``make_dataset``, ``data_source``, ``shard_urls``, ``webdataset_pipeline``) starts from.

    Args:
      path: the dataset folder, local or ``gs://``.
      split: a split in the manifest.
      file_format: the format the reader reads (a key of ``FILE_FORMATS``).
      reader: the reader, as messages name it.
      cache: read a ``gs://`` dataset through the local shard cache (``shard_cache``);
        False: read its manifest alone, the shards staying ``gs://`` URLs.
      cache_dir: the cache's folder (``shard_cache.cache_root``).
      max_bytes: the cache's bound.
      version: the dataset's version to read (``DatasetInfo.at_version``); None: the latest.

    Raises:
      OptionsError: an unknown ``file_format``, or a cache for a URL other than ``gs://``.
      DatasetError: no dataset there, one of another format (naming its reader), no such version or split;
        UnsafeName for a manifest naming a shard outside its folder, before anything is fetched.
      StorageError: the manifest or a shard cannot be read or fetched.
    """
    if file_format not in FILE_FORMATS:
        raise OptionsError(f"file_format must be one of {', '.join(FILE_FORMATS)}, not {file_format!r}")
    origin = normalise_root(path)
    if is_local(origin) or not cache:
        info = read_manifest_info(origin)[0]
    elif origin.startswith("gs://"):
        from beam_prep.reader import shard_cache

        info = shard_cache.cached_split(origin, split, file_format, reader, cache_dir=cache_dir, max_bytes=max_bytes,
                                        version=version)
    else:
        raise OptionsError(f"{reader} reads local folders and gs://, not {origin}")
    info.require_format(file_format, reader)
    info = info.at_version(version)
    if split not in info.splits:
        when = f" at version {version}" if version is not None else ""
        raise DatasetError(f"{origin} has no split {split!r}{when}; its splits: {', '.join(info.splits) or 'none'}")
    return Resolved(info, info.splits[split], origin)
