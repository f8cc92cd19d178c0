"""NVIDIA DALI's CPU pipeline over a beam-prep dataset, as the reader benchmarks time it.

``beam_prep.dali_reader`` (the shards, their index files and the labels from the
manifest), DALI's CPU JPEG decoder (``fn.decoders.image(device="cpu")``, libjpeg-turbo)
and, for decode + resize, ``fn.resize`` (DALI's default: linear, antialiased when
shrinking), on ``device_id=None``: no GPU, every stage on this process's threads, so
the process's CPU time counts all of it. DALI is the ``dali`` extra
(``nvidia-dali-cuda120``); ``available()`` says whether it is installed.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
from collections.abc import Iterator

from benchmarks.reading import BATCH_SIZE


class _Batch:
    """What the timing loops read of a batch: ``batch[0].shape[0]``, the images in it."""

    def __init__(self, images: int):
        self.shape = (images,)


def available() -> bool:
    return importlib.util.find_spec("nvidia.dali") is not None


def dali_batches(path: pathlib.Path, resize: int | None = None, threads: int | None = None,
                 batch_size: int = BATCH_SIZE) -> Iterator[tuple[_Batch, object]]:
    """Endless ``(images, labels)`` batches of the train split, shuffled, decoded (and resized to
    ``resize`` x ``resize``) by DALI on the CPU with ``threads`` threads (default: every core)."""
    from nvidia.dali import fn, pipeline_def, types

    import beam_prep

    @pipeline_def(batch_size=batch_size, num_threads=threads or os.cpu_count() or 1, device_id=None,
                  prefetch_queue_depth=2)
    def pipeline():
        images, labels = beam_prep.dali_reader(str(path), "train", random_shuffle=True, seed=1)
        images = fn.decoders.image(images, device="cpu", output_type=types.RGB)
        if resize is not None:
            images = fn.resize(images, resize_x=resize, resize_y=resize)
        return images, labels

    pipe = pipeline()
    pipe.build()
    while True:
        images, labels = pipe.run()
        yield _Batch(len(images)), labels
