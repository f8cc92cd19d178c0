"""How fast the reader delivers a dataset here: :func:`measure_reader`, for sizing a training input pipeline.

The number that matters for a training job is images per second out of
``make_dataset`` on the host that will train: decoded uint8 batches, with the
training order (file and record shuffle) or the evaluation order. This times
exactly that pipeline, repeated so that a small split can run for as long as
asked, after a warm-up that fills the shuffle buffer and the prefetch.
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
    from beam_prep.reader import make_dataset

    dataset = make_dataset(path, split, batch_size=batch_size, training=training, repeat=True)
    try:
        images, wall, cpu = time_batches(iter(dataset), seconds, warmup_seconds, progress)
    except StopIteration:  # repeated, it ends only when empty
        raise DatasetError(f"split {split!r} of {path} holds no records: nothing to time") from None
    return Throughput(path=path, split=split, batch_size=batch_size, training=training,
                      images=images, seconds=wall, cpu_seconds=cpu)


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
        n = int(next(batches)[0].shape[0])
        images += n
        if progress is not None:
            progress(n)
    return images, time.perf_counter() - wall, time.process_time() - cpu
