"""How fast the reader delivers a dataset here: :func:`measure_reader`, for sizing a training input pipeline.

The number that matters for a training job is images per second out of
``make_dataset`` on the host that will train: decoded uint8 batches, with the
training order (file and record shuffle) or the evaluation order. This times
exactly that pipeline, repeated so that a small split can run for as long as
asked, after a warm-up that fills the shuffle buffer and the prefetch.

A dataset of another ``--file_format`` is timed with its own reader, in this
one process, as a worker of Grain or of a PyTorch ``DataLoader`` would read it:
``data_source`` (array_record: random indices in training order, in order
otherwise) or ``webdataset.WebDataset`` with its ``rgb8`` decoder (webdataset:
shards and records shuffled in training order).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator

from beam_prep.errors import DatasetError

__all__ = ["Throughput", "measure_reader", "time_batches"]


@dataclasses.dataclass(frozen=True)
class Throughput:
    """``images`` read in ``seconds`` of wall time (after the warm-up) and ``cpu_seconds`` of this
    process's CPU (every tf.data thread), from ``split`` of ``path`` in batches of ``batch_size``."""

    path: str
    split: str
    batch_size: int
    training: bool
    images: int
    seconds: float
    cpu_seconds: float

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0

    @property
    def images_per_cpu_second(self) -> float:
        return self.images / self.cpu_seconds if self.cpu_seconds > 0 else 0.0


def measure_reader(path: str, split: str = "train", *, batch_size: int = 256, training: bool = True,
                   seconds: float = 10.0, warmup_seconds: float = 1.0,
                   progress: Callable[[int], None] | None = None) -> Throughput:
    """Reads ``split`` of the dataset at ``path`` through ``make_dataset`` for ``seconds`` and counts images.

    Args:
      training: the training order (shuffled, any order) or evaluation's (fixed, no shuffle).
      seconds: how long to time, after ``warmup_seconds`` untimed; at least one batch is timed.
      progress: called with the images of each timed batch.

    Raises:
      DatasetError, OptionsError, StorageError: as ``make_dataset`` does (no dataset, no such
        split...); DatasetError also for a split without records.
    """
    try:
        images, wall, cpu = time_batches(_batches(path, split, batch_size, training), seconds, warmup_seconds,
                                         progress)
    except StopIteration:  # repeated, it ends only when empty
        raise DatasetError(f"split {split!r} of {path} holds no records: nothing to time") from None
    return Throughput(path=path, split=split, batch_size=batch_size, training=training,
                      images=images, seconds=wall, cpu_seconds=cpu)


def _batches(path: str, split: str, batch_size: int, training: bool) -> Iterator:
    """Endless ``(labels, ...)`` batches of decoded images from the reader of the dataset's format."""
    from beam_prep.reader.sources import load_info

    info = load_info(path)
    if info.file_format == "array_record":
        return _data_source_batches(path, split, batch_size, training)
    if info.file_format == "webdataset":
        return _webdataset_batches(info, split, batch_size, training)
    from beam_prep.reader import make_dataset

    return iter(make_dataset(path, split, batch_size=batch_size, training=training, repeat=True))


def _data_source_batches(path: str, split: str, batch_size: int, training: bool) -> Iterator:
    import random

    import numpy as np

    from beam_prep.reader.data_source import data_source

    source = data_source(path, split)
    if not len(source):
        return
    rng = random.Random(0)
    position = 0
    while True:
        if training:
            keys = [rng.randrange(len(source)) for _ in range(batch_size)]
        else:
            keys = [(position + i) % len(source) for i in range(batch_size)]
            position = (position + batch_size) % len(source)
        yield (np.asarray([record.get("label", -1) for record in source.__getitems__(keys)]),)  # -1: none


def _webdataset_batches(info, split: str, batch_size: int, training: bool) -> Iterator:
    import numpy as np

    from beam_prep.io.libraries import require

    webdataset = require("webdataset", "timing a webdataset dataset")
    if split not in info.splits:
        raise DatasetError(f"{info.root} has no split {split!r}; its splits: {', '.join(info.splits)}")
    urls = list(info.splits[split].files)
    if not urls:
        return iter(())
    image = {"jpeg": "jpg", "png": "png", "raw": "raw"}[info.image.format]
    dataset = webdataset.WebDataset(urls, shardshuffle=len(urls) if training else False, empty_check=False)
    if training:
        dataset = dataset.shuffle(1000)
    # Each sample has a json; a dataset without labels has no cls.
    dataset = dataset.decode("rgb8").to_tuple(image, "json").batched(batch_size, collation_fn=None).repeat()
    return ((np.asarray([meta.get("label", -1) for _, meta in batch]),) for batch in dataset)


def time_batches(batches: Iterator, seconds: float, warmup_seconds: float,
                 progress: Callable[[int], None] | None = None) -> tuple[int, float, float]:
    """Reads ``(images, ...)`` batches untimed for ``warmup_seconds``, then for ``seconds``
    (at least one batch): the images of the timed batches, their wall and CPU seconds.

    The one timing loop of ``beam-prep bench`` and of the reader benchmarks.

    Raises:
      StopIteration: ``batches`` ended.
    """
    start = time.perf_counter()
    while time.perf_counter() - start < warmup_seconds:
        next(batches)
    images = 0
    wall, cpu = time.perf_counter(), time.process_time()
    while images == 0 or time.perf_counter() - wall < seconds:
        batch = next(batches)
        # (images, ...) or (labels, ...), or the images alone (make_dataset on a dataset without labels)
        n = int((batch[0] if isinstance(batch, tuple) else batch).shape[0])
        images += n
        if progress is not None:
            progress(n)
    return images, time.perf_counter() - wall, time.process_time() - cpu
