"""The throughput limit of any writer on this machine: beam-prep's per-image kernel alone.

Every writer must decode, resize and encode each image; ``process_image`` does
exactly that, so its rate on images already in memory (no disk, no pipeline,
no serialisation) bounds what a pipeline can reach. Three numbers:

* per core × cores: the rate of one process times ``os.cpu_count()``, the
  ceiling if the cores scaled perfectly;
* measured in parallel: one process per core at once. On shared or
  overcommitted virtual machines the cores do not scale perfectly, and this is
  the ceiling a pipeline can actually hit;
* with the record, per core × cores: the work no writer of these records can
  skip, in a tight loop in one process: each file read (page cache warm),
  ``process_image``, its SHA-256, the ``tf.train.Example``, and the record framed
  into a GZIP shard as the workers write it (``examples.make_example`` and the
  shard format's writer). The command is held to it.
"""
from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import pathlib
import tempfile
import threading
import time
from collections.abc import Sequence

from beam_prep.errors import ImageError
from beam_prep.write.images import resample
from beam_prep.write.images.examples import make_example
from beam_prep.write.images.imaging import ImageSpec, process_image
from beam_prep.write.shared.entry import FileEntry
from beam_prep.write.shared.shard_formats import ShardFormat, shard_format

log = logging.getLogger(__name__)

WARMUP_IMAGES = 20
TASK_IMAGES = 10


@dataclasses.dataclass(frozen=True)
class LimitResult:
    """Kernel timings on ``sample`` in-memory images; ``failed`` images the kernel rejected."""

    sample: int
    cores: int
    serial_seconds: float
    parallel_seconds: float
    serial_cpu_seconds: float
    failed: int
    first_error: str | None
    record_seconds: float
    record_cpu_seconds: float

    @property
    def per_core(self) -> float:
        return self.sample / self.serial_seconds

    @property
    def images_per_s(self) -> float:
        """Per-core rate × cores: the ceiling with perfect scaling."""
        return self.per_core * self.cores

    @property
    def parallel_images_per_s(self) -> float:
        return self.sample / self.parallel_seconds

    @property
    def record_per_core(self) -> float:
        return self.sample / self.record_seconds

    @property
    def record_images_per_s(self) -> float:
        """The record's limit: its per-core rate × cores."""
        return self.record_per_core * self.cores

    def to_json(self) -> dict[str, object]:
        return {
            **dataclasses.asdict(self),
            "per_core": self.per_core,
            "images_per_s": self.images_per_s,
            "parallel_images_per_s": self.parallel_images_per_s,
            "record_per_core": self.record_per_core,
            "record_images_per_s": self.record_images_per_s,
        }


def measure_limit(files: Sequence[pathlib.Path], sample: int, spec: ImageSpec) -> LimitResult:
    """Times ``process_image`` on an even spread of ``files``, read into memory first.

    Reading first keeps disk and page cache out of the number.
    """
    step = max(1, len(files) // sample)
    chosen = files[::step][:sample]
    blobs = [path.read_bytes() for path in chosen]
    cores = os.cpu_count() or 1

    _init(blobs, spec, None)
    start, cpu_start = time.perf_counter(), time.process_time()
    errors = _run_slice(0, len(blobs))
    serial, serial_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    if errors:
        log.warning("process_image rejected %d of %d sample images, e.g. %s", len(errors), len(blobs), errors[0])

    # Small slices, handed to whichever process is free, so no core idles at the end.
    slices = [(i, i + TASK_IMAGES) for i in range(0, len(blobs), TASK_IMAGES)]
    # The workers and this process meet here once every worker is warm.
    ready = multiprocessing.Barrier(cores + 1)
    with multiprocessing.Pool(cores, initializer=_init, initargs=(blobs, spec, ready)) as pool:
        ready.wait()
        start = time.perf_counter()
        pool.starmap(_run_slice, slices, chunksize=1)
        parallel = time.perf_counter() - start
    record, record_cpu = _record_pass(chosen, spec)
    return LimitResult(len(blobs), cores, serial, parallel, serial_cpu, len(errors), errors[0] if errors else None,
                       record, record_cpu)


def _record_pass(files: Sequence[pathlib.Path], spec: ImageSpec) -> tuple[float, float]:
    """Seconds and CPU seconds of one process turning ``files`` into records framed in a GZIP TFRecord
    shard, as a worker does (after a warm-up on the first few)."""
    fmt = shard_format("tfrecord")
    entries = [FileEntry(str(path), path.name, "train", "label", 0, path.stat().st_size) for path in files]
    with tempfile.TemporaryDirectory(prefix="limit-") as folder:
        _write_records(entries[:WARMUP_IMAGES], spec, fmt, os.path.join(folder, "warm.tfrecord.gz"))
        start, cpu_start = time.perf_counter(), time.process_time()
        _write_records(entries, spec, fmt, os.path.join(folder, "shard.tfrecord.gz"))
        return time.perf_counter() - start, time.process_time() - cpu_start


def _write_records(entries: Sequence[FileEntry], spec: ImageSpec, fmt: ShardFormat, path: str) -> None:
    with fmt.records(path, "gzip") as write:
        for entry in entries:
            payload = make_example(entry, spec, None, fmt).example
            if payload is not None:
                write(payload)


# Per process: the sample and the spec, set once so each task sends only indices.
_BLOBS: list[bytes] = []
_SPEC: list[ImageSpec] = []


def _init(blobs: list[bytes], spec: ImageSpec, ready: threading.Barrier | None) -> None:
    """Keeps the sample and warms the kernel (imports, codec tables, the resize kernel loaded as a
    large run's workers have it) before any timing."""
    _BLOBS[:] = blobs
    _SPEC[:] = [spec]
    resample.available()  # the kernel's import, before any timing
    _run_slice(0, WARMUP_IMAGES)
    if ready is not None:
        ready.wait()


def _run_slice(start: int, stop: int) -> list[str]:
    """Processes sample images ``start:stop``; returns the errors.

    A rejected image is reported, not fatal, so the benchmark's other runs still happen.
    """
    errors = []
    for data in _BLOBS[start:stop]:
        try:
            process_image(data, _SPEC[0])
        except ImageError as e:
            errors.append(str(e))
    return errors
