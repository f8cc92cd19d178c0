"""The writers a user would pick instead of beam-prep, run on the benchmark's corpus and spec.

* the hand-written writer (``benchmarks/handwritten_writer.py``): a process pool,
  Pillow and TensorFlow's TFRecordWriter, about 30 lines;
* img2dataset, when its command is installed (``pip install -e '.[peers]'``):
  a list of ``file://`` paths, ``center_crop`` 224, JPEG q90, tfrecord output,
  one process per core.

Also the image quality of any writer's records: PSNR of a sample of decoded
records against the reference of the same crop (``bench_resize.reference``).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Callable

import numpy as np

from benchmarks import IMAGE_SIZE, JPEG_QUALITY, REPO_ROOT
from benchmarks.corpus import Corpus
from benchmarks.measure import Measured, run_measured

QUALITY_SAMPLE = 200

# A record's image bytes and the name of its source file, for each writer's schema.
ImageAndSource = Callable[[dict], tuple[bytes, str]]


def run_handwritten(corpus: Corpus, out: pathlib.Path) -> tuple[Measured, dict]:
    measured = run_measured(
        [sys.executable, "-m", "benchmarks.handwritten_writer", "--input", str(corpus.root),
         "--output", str(out), "--image_size", str(IMAGE_SIZE), "--jpeg_quality", str(JPEG_QUALITY)],
        cwd=REPO_ROOT)
    report = json.loads(measured.stdout.strip().splitlines()[-1]) if measured.returncode == 0 else {}
    return measured, report


def img2dataset_command() -> str | None:
    """The img2dataset command beside this interpreter or on PATH; None if not installed."""
    beside = pathlib.Path(sys.executable).with_name("img2dataset")
    return str(beside) if beside.exists() else shutil.which("img2dataset")


def img2dataset_version(command: str) -> str | None:
    """The version of the img2dataset that ``command`` runs, from the metadata of the environment it sits in."""
    python = pathlib.Path(command).with_name("python")
    if not python.exists():
        return None
    done = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('img2dataset'))"],
                          capture_output=True, text=True)
    return done.stdout.strip() or None


def run_img2dataset(command: str, corpus: Corpus, out: pathlib.Path) -> tuple[Measured, dict]:
    urls = out.with_suffix(".urls.txt")
    urls.write_text("".join(f"file://{path}\n" for path in corpus.files()))
    measured = run_measured(
        [command, "--url_list", str(urls), "--input_format", "txt", "--output_folder", str(out),
         "--output_format", "tfrecord", "--image_size", str(IMAGE_SIZE), "--resize_mode", "center_crop",
         "--encode_quality", str(JPEG_QUALITY), "--processes_count", str(os.cpu_count() or 1),
         "--thread_count", "16", "--number_sample_per_shard", "2000", "--disable_all_reencoding", "False",
         "--enable_wandb", "False"],
        cwd=REPO_ROOT)
    urls.unlink()
    written = 0
    for stats in out.glob("*_stats.json"):
        written += json.loads(stats.read_text()).get("successes", 0)
    return measured, {"written": written}


def ours_record(features: dict) -> tuple[bytes, str]:
    return features["image/encoded"][0], features["image/filename"][0].decode()


def img2dataset_record(features: dict) -> tuple[bytes, str]:
    return features["jpg"][0], features["url"][0].decode().removeprefix("file://")


def record_quality(files: list[pathlib.Path], corpus: Corpus, image_and_source: ImageAndSource) -> float:
    """Mean PSNR (dB) of the first ``QUALITY_SAMPLE`` records of ``files`` against the reference crop."""
    import tensorflow as tf

    from benchmarks.bench_resize import psnr, reference

    by_name = {path.name: path for path in corpus.files()}
    scores = []
    compression = "GZIP" if files and files[0].name.endswith(".gz") else ""
    for raw in tf.data.TFRecordDataset([str(f) for f in files], compression_type=compression).take(QUALITY_SAMPLE):
        example = tf.train.Example.FromString(raw.numpy())
        features = {key: list(value.bytes_list.value) for key, value in example.features.feature.items()}
        data, source = image_and_source(features)
        got = tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_ACCURATE").numpy()
        scores.append(psnr(got, reference(by_name[pathlib.PurePath(source).name].read_bytes())))
    return float(np.mean(scores))
