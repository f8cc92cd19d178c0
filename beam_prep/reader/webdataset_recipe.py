"""A ``--file_format webdataset`` dataset for PyTorch: its shards listed and checked, and a
``webdataset`` pipeline that reads every sample once an epoch at any size, in an order drawn
from a seed and the epoch.

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
import random
import shlex
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from beam_prep.errors import OptionsError
from beam_prep.model.dataset import DatasetInfo
from beam_prep.reader.images import stored_image
from beam_prep.reader.resolve import resolve_split

__all__ = ["shard_urls", "webdataset_pipeline"]

_FORMAT = "webdataset"
_READER = "beam_prep.webdataset_pipeline"
_EXTENSIONS = {"jpeg": "jpg", "png": "png", "raw": "raw"}


def shard_urls(path: str | os.PathLike, split: str = "train", file_format: str = _FORMAT, *,
               cache_dir: str | os.PathLike | bool | None = None, cache_max_bytes: int | None = None,
               pipe: str | None = None, version: int | None = None) -> list[str]:
    """The shard files of split ``split``, in order, once the dataset is checked to be of ``file_format``.

    For any reader that takes a list of files (``webdataset.WebDataset``, Grain's
    ``ArrayRecordDataSource``, ``tf.data``).

    Args:
      path: the dataset folder, local or ``gs://``.
      split: a split in the manifest.
      file_format: the format the caller reads: ``webdataset``, ``array_record`` or ``tfrecord``.
      cache_dir: for ``gs://``: where the shards are cached (``data_source``'s cache),
        or False for the ``gs://`` URLs themselves (to stream them: see ``pipe``).
      cache_max_bytes: the cache's bound, as ``data_source``'s.
      pipe: a command that writes the file its last argument names to its output
        (``"gcloud storage cat"``): each path is returned as WebDataset's ``pipe:`` URL of the
        command, ``pipe:gcloud storage cat 'gs://bucket/ds/train-00000-of-00004.tar'``, the path
        quoted for the shell (``shlex.quote``) so that nothing in a folder's name is run. The
        command itself is yours, as written. None: the paths themselves.
      version: the dataset's version to read (``load_info(path).history``): exactly the records it held,
        whatever was appended since; None: the latest.

    Returns:
      The shards' paths: local files, or ``gs://`` URLs with ``cache_dir=False``; as ``pipe:``
      URLs with ``pipe``.

    Raises:
      DatasetError: no dataset there, a dataset of another format (naming it and its
        reader), or no such split.
      UnsafeName: a shard name beam-prep does not write (``model.names``), before anything is read.
      OptionsError: ``pipe`` is empty.
      StorageError: a ``gs://`` shard cannot be fetched.
    """
    if pipe is not None and (not isinstance(pipe, str) or not pipe.strip()):
        raise OptionsError(f"pipe is a command that writes a file to its output (gcloud storage cat), not {pipe!r}")
    chosen = resolve_split(path, split, file_format, f"a {file_format} reader", cache=cache_dir is not False,
                           cache_dir=cache_dir or None, max_bytes=cache_max_bytes, version=version).split
    if pipe is None:
        return list(chosen.files)
    return [f"pipe:{pipe} {shlex.quote(file)}" for file in chosen.files]


def webdataset_pipeline(path: str | os.PathLike, split: str = "train", *, shuffle: bool | None = None,
                        shuffle_buffer: int = 1000, resampled: bool = False, seed: int = 0,
                        pil_images: bool = False, with_meta: bool = False,
                        transform: Callable[[Any], Any] | None = None,
                        target_transform: Callable[[int], Any] | None = None,
                        cache_dir: str | os.PathLike | None = None, cache_max_bytes: int | None = None,
                        version: int | None = None) -> Any:
    """A ``webdataset`` pipeline of split ``split``'s ``(image, label)`` samples, for a ``DataLoader``.

    Each epoch yields every sample exactly once over all ``DataLoader`` workers and
    ``torch.distributed`` ranks (unless ``resampled``), whatever the number of shards,
    workers and samples; batch in the ``DataLoader`` (``batch_size=``). A dataset without
    labels yields images alone (``(image, meta)`` with ``with_meta``).

    The order is drawn from ``seed`` and the epoch alone: epoch ``e`` shuffles each worker's
    shards with a generator seeded by ``(seed, e)`` and its samples by ``(seed, e, rank,
    worker)``, the same on every run. The epoch is the one given to the pipeline's
    ``set_epoch(e)`` (0 until then), as with ``DistributedSampler.set_epoch``, plus the passes
    each worker has made over the pipeline since: workers started before ``set_epoch``
    (persistent ones) see it too. So epochs go 0, 1, 2... with or without ``set_epoch``, with
    persistent workers, workers started anew each epoch, or none.

    Args:
      path: the dataset folder, local or ``gs://`` (read through ``data_source``'s cache).
      split: a split in the manifest.
      shuffle: shuffle shards and samples; default True for ``train``, False otherwise.
      shuffle_buffer: samples held to shuffle from (per worker).
      resampled: draw shards with replacement, endlessly (WebDataset's recipe for
        many nodes, where shards do not divide evenly), each worker by ``(seed, epoch,
        rank, worker)``: bound each worker's epoch with ``.with_epoch(n)``.
      seed: the shuffles' seed.
      pil_images: images as PIL images (for torchvision's transforms), not uint8 arrays.
      with_meta: samples are ``(image, label, meta)``, ``meta`` the sample's json (file
        name, label text, source sha256 and size).
      transform: called on each image.
      target_transform: called on each label.
      cache_dir: for ``gs://``, as ``data_source``'s.
      cache_max_bytes: for ``gs://``, as ``data_source``'s.
      version: the dataset's version to read (``load_info(path).history``): exactly the records it held,
        whatever was appended since; None: the latest.

    Returns:
      A ``webdataset.DataPipeline`` (an ``IterableDataset``) with ``set_epoch(epoch)``, and
      WebDataset's ``with_epoch``, ``repeat``, ``map``, ``batched`` and the rest.

    Raises:
      DatasetError: no dataset there, another format (naming its reader), no such split.
      OptionsError: the webdataset library is not installed (with its install command).
    """
    from beam_prep.io.libraries import require

    require(_FORMAT, _READER)
    import webdataset as wds

    info, chosen, origin = resolve_split(path, split, _FORMAT, _READER, cache_dir=cache_dir,
                                         max_bytes=cache_max_bytes, version=version)
    cache_folder = None
    if origin != info.root:  # a cached copy: a worker the pipeline is pickled into checks its folder first
        from beam_prep.reader.shard_cache import folder_check

        cache_folder = folder_check(info.root)
    if shuffle is None:
        shuffle = split == "train"
    epochs = _Epochs()
    stages = [_Shards(list(chosen.files), epochs, seed, shuffle, resampled, cache_folder), wds.tarfile_to_samples()]
    if shuffle:
        stages.append(_SampleShuffle(shuffle_buffer, epochs, seed))
    stages.append(wds.map(_Sample(info, pil_images, with_meta, transform, target_transform)))
    dataset = wds.FluidWrapper(stages[0])  # a DataPipeline with WebDataset's map, batched, ...
    for stage in stages[1:]:
        dataset.append(stage)
    dataset.set_epoch = epochs.set_epoch
    return dataset


def _worker() -> tuple[int, int, int, int]:
    """This process's ``(rank, world_size, worker, num_workers)``, as WebDataset's splitters see them."""
    from webdataset.utils import pytorch_worker_info

    return pytorch_worker_info()


class _Epochs:
    """The epoch of each pass over a pipeline: ``set_epoch``'s, plus the passes made since.

    Kept in shared memory, made when the pipeline is: a ``DataLoader``'s workers, forked or
    spawned, persistent or started each epoch, read what the main process set, and count
    their passes in it, a slot per ``(num_workers, worker)``, so that a worker started anew
    each epoch goes on from its predecessor's count. Pickled other than into a new process
    (a copy for another machine), it becomes a copy of its own.
    """

    # Slots for up to this many workers a loader. Beyond, workers share slots by their id's remainder,
    # and their epochs advance faster: the orders are other ones, each sample still read once.
    _WORKERS = 128

    def __init__(self) -> None:
        import multiprocessing

        size = 1 + self._WORKERS * (self._WORKERS + 1) // 2
        self._counts = multiprocessing.RawArray("q", size)  # [0]: set_epoch's; then passes a slot
        self.current = 0  # this copy's epoch for its pass under way

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch of every worker's next pass (``DistributedSampler.set_epoch``'s meaning).

        Args:
          epoch: the epoch, 0 or more.
        """
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int, 0 or more, not {epoch!r}")
        self._counts[0] = epoch
        self._counts[1:] = [0] * (len(self._counts) - 1)

    def begin(self, worker: int, num_workers: int) -> int:
        """This copy's epoch for the pass it begins, as its worker sees it; counts the pass."""
        n = min(max(num_workers, 1), self._WORKERS)
        slot = 1 + n * (n - 1) // 2 + worker % n
        self.current = self._counts[0] + self._counts[slot]
        self._counts[slot] += 1
        return self.current

    def __getstate__(self) -> dict[str, Any]:
        from multiprocessing.context import get_spawning_popen

        if get_spawning_popen() is not None:  # into a worker: the same memory
            return {"counts": self._counts, "current": self.current}
        return {"counts": list(self._counts), "current": self.current}  # elsewhere: a copy of its own

    def __setstate__(self, state: dict[str, Any]) -> None:
        counts = state["counts"]
        if isinstance(counts, list):
            import multiprocessing

            counts = multiprocessing.RawArray("q", counts)
        self._counts, self.current = counts, state["current"]


class _Shards:
    """A pipeline's source: this worker's shards for one pass, as ``{"url": path}`` items.

    The rank's share, then the worker's (WebDataset's ``split_by_node`` and
    ``split_by_worker``), shuffled by ``(seed, epoch)``; or, ``resampled``, shards drawn with
    replacement without end by ``(seed, epoch, rank, worker)``.
    """

    def __init__(self, urls: list[str], epochs: _Epochs, seed: int, shuffle: bool, resampled: bool,
                 cache_folder: Any = None) -> None:
        self.cache_folder = cache_folder  # the shard cache's ``FolderCheck``, for a cached gs:// dataset
        self.urls = urls
        self.epochs = epochs
        self.seed = seed
        self.shuffle = shuffle
        self.resampled = resampled

    def __call__(self) -> Iterator[dict[str, str]]:
        rank, world_size, worker, num_workers = _worker()
        epoch = self.epochs.begin(worker, num_workers)  # now, not at the first item: the next stages read it
        if self.resampled:
            return _draws(self.urls, random.Random(f"{self.seed}/{epoch}/{rank}/{worker}"))
        mine = self.urls[rank::world_size][worker::num_workers]
        if self.shuffle:
            random.Random(f"{self.seed}/{epoch}").shuffle(mine)
        return iter([{"url": url} for url in mine])


def _draws(urls: list[str], rng: random.Random) -> Iterator[dict[str, str]]:
    while urls:
        yield {"url": rng.choice(urls)}


class _SampleShuffle:
    """Samples shuffled in a buffer of ``size``, by ``(seed, epoch, rank, worker)``."""

    def __init__(self, size: int, epochs: _Epochs, seed: int) -> None:
        self.size = size
        self.epochs = epochs
        self.seed = seed

    def __call__(self, samples: Iterable[Any]) -> Iterator[Any]:
        rank, _, worker, _ = _worker()
        return _buffer_shuffle(samples, self.size, random.Random(f"{self.seed}/{self.epochs.current}/{rank}/{worker}"))


def _buffer_shuffle(samples: Iterable[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """Each sample once: a random one of the ``size`` held goes out as each new one comes in."""
    held: list[Any] = []
    for sample in samples:
        held.append(sample)
        if len(held) >= size:
            i = rng.randrange(len(held))
            held[i], held[-1] = held[-1], held[i]
            yield held.pop()
    rng.shuffle(held)
    yield from held


class _Sample:
    """A WebDataset sample dict to ``(image, label[, meta])``, or ``image`` (``(image, meta)``) without
    labels: a class, so that it pickles into workers."""

    def __init__(self, info: DatasetInfo, pil: bool, with_meta: bool, transform: Callable[[Any], Any] | None,
                 target_transform: Callable[[int], Any] | None) -> None:
        self.extension = _EXTENSIONS[info.image.format]
        self.image_format = info.image.format
        self.offset = info.label_offset
        self.labelled = bool(info.labels)
        self.pil = pil
        self.with_meta = with_meta
        self.transform = transform
        self.target_transform = target_transform

    def __call__(self, sample: dict[str, Any]) -> Any:
        meta = json.loads(sample["json"])
        image = stored_image(sample[self.extension], self.image_format, meta["height"], meta["width"],
                             meta["channels"], self.pil)
        if self.transform is not None:
            image = self.transform(image)
        if not self.labelled:
            return (image, meta) if self.with_meta else image
        label = int(sample["cls"]) - self.offset
        if self.target_transform is not None:
            label = self.target_transform(label)
        return (image, label, meta) if self.with_meta else (image, label)
