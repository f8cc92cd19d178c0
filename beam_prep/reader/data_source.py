"""``data_source``: an array_record dataset as a random-access source of decoded examples.

For Grain (``grain.MapDataset.source``) and PyTorch (a map-style ``Dataset``, with
torchvision's ``ImageFolder`` surface: ``classes``, ``class_to_idx``, ``targets``,
``transform=``, ``(image, label)`` items, PIL images on request).

It imports neither TensorFlow nor Beam: a JAX or PyTorch training host should
not pay for either. Records are the writer's ``tf.train.Example``, parsed with
protobuf alone (``features.decode_example``); images are decoded with Pillow,
as the writer encoded them, so the pixels are the writer's own. Lookups go
through the ``array_record`` library's ``ArrayRecordDataSource``, which Grain
itself uses: it opens each shard on first use, and pickles without its open
files, so a source can be handed to worker processes. A ``gs://`` dataset is read
from a local copy of its shards (``shard_cache``): the array_record library opens
local files only.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, SupportsIndex

from beam_prep.errors import DatasetError
from beam_prep.io.libraries import require
from beam_prep.model import features
from beam_prep.model.dataset import DatasetInfo, SplitInfo
from beam_prep.reader.images import stored_image
from beam_prep.reader.resolve import resolve_split

__all__ = ["ArrayRecordSource", "data_source"]

_FORMAT = "array_record"
_READER = "beam_prep.data_source"
_LABELS_AT_ONCE = 1024  # records read at a time for ``targets``: memory bounded, one call per chunk


class ArrayRecordSource:
    """A split's records by index: ``len(source)``, ``source[i]`` and ``source.__getitems__(keys)``.

    Each item is a dict: ``image`` (a writable uint8 array, height x width x
    channels, or a PIL image with ``pil_images``), ``label`` (the label's index
    in ``labels.txt``: the stored id less ``label_offset``, as ``make_dataset``
    gives it), ``label_text``, ``filename`` and ``sha256`` (of the source file);
    or, with ``pairs``, the tuple ``(image, label)`` that torchvision's
    ``ImageFolder`` gives. ``transform`` applies to the image and
    ``target_transform`` to the label, in either form. Made by ``data_source``.

    ``classes``, ``class_to_idx``, ``targets`` and ``samples`` are ``ImageFolder``'s
    names; none decodes an image. A dataset without labels (a table of images and
    their columns) gives dicts without ``label`` and ``label_text``, and refuses
    ``pairs`` and ``targets``.
    """

    def __init__(self, info: DatasetInfo, split: SplitInfo, *, pairs: bool = False, pil_images: bool = False,
                 transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[int], Any] | None = None, origin: str | None = None) -> None:
        require(_FORMAT, _READER)  # the C++ module, with its install command if missing
        from array_record.python.array_record_data_source import ArrayRecordDataSource

        self.info = info
        self.split = split
        self.pairs = pairs
        self.pil_images = pil_images
        self.transform = transform
        self.target_transform = target_transform
        self.origin = origin or info.root  # the folder asked for: gs://... for a cached copy
        self._cache_folder = None
        if self.origin != info.root:  # a cached copy: a worker this source is pickled into checks its folder first
            from beam_prep.reader.shard_cache import folder_check

            self._cache_folder = folder_check(info.root)
        if pairs and not info.labels:
            raise DatasetError(f"{self.origin} is a dataset without labels: read its items as dicts, without pairs")
        self._index: tuple[list[int], list[str]] | None = None
        self._records = ArrayRecordDataSource(list(split.files)) if split.shards else None
        if len(self) != split.num_examples:
            raise DatasetError(f"split {split.name!r} of {self.origin} holds {len(self)} records but its "
                               f"manifest says {split.num_examples}: the dataset is damaged")

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (into a data loader's worker) without its open shards: ``__setstate__`` reopens them."""
        return {**self.__dict__, "_records": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled: a cached copy's folder checked first, then the shards reopened.

        The check is made here (as well as by the ``FolderCheck`` unpickled): the state's order is not what
        keeps a worker from reading another folder's shards.
        """
        from array_record.python.array_record_data_source import ArrayRecordDataSource

        self.__dict__.update(state)
        if self._cache_folder is not None:
            self._cache_folder.check()
        self._records = ArrayRecordDataSource(list(self.split.files)) if self.split.shards else None

    def __len__(self) -> int:
        return len(self._records) if self._records is not None else 0

    def __getitem__(self, index: SupportsIndex) -> Any:
        index = index.__index__()
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"record {index} of split {self.split.name!r}, which holds {len(self)}")
        return self._item(self._records[index])

    def __getitems__(self, indices: Sequence[SupportsIndex]) -> list[Any]:
        """Several records in one call, read in parallel by shard (what Grain and PyTorch batch with)."""
        return [self._item(record) for record in self._records.__getitems__(list(indices))]

    @property
    def classes(self) -> list[str]:
        """The label names, in id order: ``labels.txt``'s lines (``ImageFolder.classes``)."""
        return list(self.info.labels)

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Label name -> the ``label`` this source gives (``ImageFolder.class_to_idx``)."""
        return {name: i for i, name in enumerate(self.info.labels)}

    @property
    def targets(self) -> list[int]:
        """Every record's ``label``, in index order (``ImageFolder.targets``), for samplers and class weights.

        Read from the records' label field once, on first use, without decoding an
        image (a read of the split's bytes: seconds for a million small records on
        local disk); kept, and pickled with the source.
        """
        return list(self._labels_and_names()[0])

    @property
    def samples(self) -> list[tuple[str, int]]:
        """``(filename, label)`` per record, in index order (``ImageFolder.samples``).

        The file name is relative to the tree the dataset was prepared from. Read as ``targets`` is.
        """
        labels, names = self._labels_and_names()
        return list(zip(names, labels))

    def decode(self, serialized: bytes) -> dict[str, Any]:
        """One stored record as a dict (whatever ``pairs`` and the transforms say)."""
        values = features.decode_example(serialized)
        record = {
            "image": stored_image(values[features.ENCODED], self.info.image.format, int(values[features.HEIGHT]),
                                  int(values[features.WIDTH]), int(values[features.CHANNELS]), self.pil_images),
            "filename": values[features.FILENAME].decode("utf-8", "surrogateescape"),
            "sha256": values[features.SHA256].decode("ascii"),
        }
        if features.LABEL in values:  # a dataset without labels has neither label key
            record["label"] = int(values[features.LABEL]) - self.info.label_offset
            record["label_text"] = values[features.LABEL_TEXT].decode("utf-8")
        return record

    def _item(self, serialized: bytes) -> Any:
        record = self.decode(serialized)
        if self.transform is not None:
            record["image"] = self.transform(record["image"])
        if self.target_transform is not None and "label" in record:
            record["label"] = self.target_transform(record["label"])
        if self.pairs:
            return record["image"], record["label"]
        return record

    def _labels_and_names(self) -> tuple[list[int], list[str]]:
        if not self.info.labels:
            raise DatasetError(f"{self.origin} is a dataset without labels: it has no targets or samples")
        if self._index is None:
            labels: list[int] = []
            names: list[str] = []
            for start in range(0, len(self), _LABELS_AT_ONCE):
                chunk = list(range(start, min(start + _LABELS_AT_ONCE, len(self))))
                for serialized in self._records.__getitems__(chunk):
                    label, name = features.label_and_filename(serialized)
                    labels.append(label - self.info.label_offset)
                    names.append(name)
            self._index = (labels, names)
        return self._index

    def __repr__(self) -> str:
        cached = f", cached from {self.origin!r}" if self.origin != self.info.root else ""
        return (f"ArrayRecordSource({self.info.root!r}, split={self.split.name!r}, "
                f"records={len(self)}, shards={len(self.split.shards)}{cached})")


def data_source(path: str | os.PathLike, split: str = "train", *, pairs: bool = False, pil_images: bool = False,
                transform: Callable[[Any], Any] | None = None,
                target_transform: Callable[[int], Any] | None = None,
                cache_dir: str | os.PathLike | None = None, cache_max_bytes: int | None = None,
                version: int | None = None) -> ArrayRecordSource:
    """A random-access source over split ``split`` of the array_record dataset at ``path``.

    Use it as Grain's source (``grain.MapDataset.source(data_source(path))``)
    or as a PyTorch map-style ``Dataset``; docs/guides/grain-pytorch.md shows
    both. It reads without TensorFlow or Beam.

    Args:
      path: the dataset folder, on local disk or ``gs://``. A ``gs://`` dataset's
        split is fetched once into a local cache (``cache_dir``), its shards in
        parallel, each checked, and reused by later runs and other processes.
      split: a split in the manifest.
      pairs: items are ``(image, label)`` tuples, as torchvision's ``ImageFolder``
        gives them, instead of dicts.
      pil_images: images are PIL images (RGB, or L for one channel), as torchvision's
        transforms take them, instead of uint8 arrays.
      transform: called on each image (after decoding), e.g. a torchvision transform.
      target_transform: called on each label id.
      cache_dir: where ``gs://`` datasets are cached; default ``$BEAM_PREP_CACHE``,
        else ``~/.cache/beam-prep``.
      cache_max_bytes: the most the cache may hold, the datasets in use included;
        least recently used datasets no process reads are evicted to make room.
        Default ``$BEAM_PREP_CACHE_MAX_BYTES``, else no bound: nothing is evicted,
        and a split that does not fit the disk's free space is refused.
      version: the dataset's version to read (``load_info(path).history``): exactly the records it held,
        whatever was appended since; None: the latest.

    Returns:
      An ``ArrayRecordSource``: ``len``, an item per index, ``classes``,
      ``class_to_idx`` and ``targets``.

    Raises:
      DatasetError: no dataset there (a folder that does not exist, a file given for
        the folder, no manifest), a dataset of another format (naming its reader),
        no such split, or shards that do not hold what the manifest says.
      StorageError: a ``gs://`` dataset cannot be fetched, or does not fit the cache.
      OptionsError: the array_record library is not installed (the message gives its
        install command; beam-prep's ``array_record`` extra installs it too).
    """
    info, chosen, origin = resolve_split(path, split, _FORMAT, _READER, cache_dir=cache_dir, max_bytes=cache_max_bytes,
                                         version=version)
    return ArrayRecordSource(info, chosen, pairs=pairs, pil_images=pil_images, transform=transform,
                             target_transform=target_transform, origin=origin)
