"""What the reader benchmarks share: the dataset they read, written once by the real
pipeline from the cached corpus and kept, the batch, and how one reader is timed.

``bench_reader`` and its gs:// mode (``reader_gcs``) use it, and ``bench_verify``
reads the same dataset.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import subprocess
from collections.abc import Callable

from beam_prep.tools.throughput import time_batches
from benchmarks import CACHE_DIR, IMAGE_SIZE, JPEG_QUALITY, REPO_ROOT

log = logging.getLogger(__name__)

# Bump when the way the benchmark datasets are written changes: cached ones are rebuilt.
# 2: GZIP shards store the chunks deflate hardly shrinks (beam_prep.io.gzip_stream).
DATASET_VERSION = 2
DEFAULT_IMAGES = 2000
NUM_SHARDS = 8
BATCH_SIZE = 256
WARMUP_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class Reader:
    key: str
    label: str
    make: Callable[[], object]  # () -> tf.data.Dataset of (images, ...) batches, repeated


def ensure_dataset(corpus_root: pathlib.Path, images: int, image_format: str,
                   compression: str = "gzip", file_format: str = "tfrecord",
                   cache_dir: pathlib.Path = CACHE_DIR) -> pathlib.Path:
    """The corpus written by the real pipeline, cached; rewritten if missing or incomplete."""
    shards = "" if file_format == "tfrecord" else f"-{file_format}"
    out = cache_dir / f"reader-v{DATASET_VERSION}-{images}-{image_format}-{compression}{shards}"
    return _ensure(out, images, image_format, (
        "--input", str(corpus_root), "--output", str(out), "--image_size", str(IMAGE_SIZE),
        "--image_format", image_format, "--jpeg_quality", str(JPEG_QUALITY),
        "--num_shards", str(NUM_SHARDS), "--compression", compression, "--file_format", file_format,
        "--overwrite"))


def ensure_default_dataset(corpus_root: pathlib.Path, images: int,
                           cache_dir: pathlib.Path = CACHE_DIR) -> pathlib.Path:
    """The corpus written by the default command (``beam-prep prepare --input --output``), cached:
    the shard count and sizes a user gets (224x224 JPEG q90 in GZIP shards, their number chosen
    from the data), not the benchmark's own 8."""
    out = cache_dir / f"reader-v{DATASET_VERSION}-{images}-default"
    return _ensure(out, images, "jpeg", ("--input", str(corpus_root), "--output", str(out), "--overwrite"))


def _ensure(out: pathlib.Path, images: int, image_format: str, args: tuple[str, ...]) -> pathlib.Path:
    manifest = out / "manifest.json"
    if manifest.exists():
        m = json.loads(manifest.read_text())
        if m["image"]["format"] == image_format and m["counts"]["listed"] == images:
            log.info("reusing %s", out)
            return out
    log.info("writing %s with pipelines.prepare_images (once; cached)", out)
    # Imported here: Beam stays out of the process that times the readers unless it must write.
    from pipelines import prepare_images

    command = prepare_images.command(*args)
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return out


def num_shards(path: pathlib.Path, split: str = "train") -> int:
    """The shard files of ``split`` in a written dataset."""
    return len(json.loads((path / "manifest.json").read_text())["splits"][split]["shards"])


def time_reader(reader: Reader, seconds: float) -> tuple[float, float]:
    """(images/s, images per CPU-second) over ``seconds`` after a warm-up, on a fresh iterator."""
    it = iter(reader.make())
    images, wall, cpu = time_batches(it, seconds, WARMUP_SECONDS)
    del it
    return images / wall, images / cpu
