"""The writers a user would pick instead of beam-prep, run on the benchmark's corpus and spec.

* the hand-written writer (``benchmarks/handwritten_writer.py``): a process pool,
  Pillow and TensorFlow's TFRecordWriter, about 30 lines;
* img2dataset: a list of ``file://`` paths, ``center_crop`` 224, JPEG q90,
  tfrecord output, one process per core;
* MosaicML Streaming (``benchmarks/peer_mds.py``), LitData
  (``benchmarks/peer_litdata.py``) and Ray Data (``benchmarks/peer_ray.py``), each
  the same job through that tool's documented API and its own format.

img2dataset, MosaicML Streaming and LitData pin versions of numpy, pandas, OpenCV
and others that the project's own environment cannot hold: they live in a
virtualenv of their own, ``.venv-peers`` at the repository's root (another with
``--peers_python``), made with::

    python3.11 -m venv .venv-peers && .venv-peers/bin/pip install -r benchmarks/peers-requirements.txt

Ray Data runs in the project's environment (``ray[data]`` is in its ``test``
extra). A peer whose package its interpreter cannot import is skipped.

Also the image quality of any writer's records: PSNR of a sample of decoded
records against the reference of the same crop (``bench_resize.reference``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable

import numpy as np

from benchmarks import IMAGE_SIZE, JPEG_QUALITY, PEERS_INSTALL, REPO_ROOT
from benchmarks.corpus import Corpus
from benchmarks.measure import Measured, run_measured

PEERS_PYTHON = REPO_ROOT / ".venv-peers" / "bin" / "python"
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


def img2dataset_command(peers_python: pathlib.Path = PEERS_PYTHON) -> str | None:
    """The img2dataset command of the peers' virtualenv, else beside this interpreter or on PATH; None if
    not installed."""
    for beside in (pathlib.Path(peers_python).with_name("img2dataset"), pathlib.Path(sys.executable).with_name(
            "img2dataset")):
        if beside.exists():
            return str(beside)
    return shutil.which("img2dataset")


def img2dataset_version(command: str) -> str | None:
    """The version of the img2dataset that ``command`` runs, from the metadata of the environment it sits in."""
    python = pathlib.Path(command).with_name("python")
    return distribution_version(python, "img2dataset") if python.exists() else None


def run_img2dataset(command: str, corpus: Corpus, out: pathlib.Path) -> tuple[Measured, dict]:
    urls = out.with_suffix(".urls.txt")
    urls.write_text("".join(f"file://{path}\n" for path in corpus.files()))
    measured = run_measured(
        [command, "--url_list", str(urls), "--input_format", "txt", "--output_folder", str(out),
         "--output_format", "tfrecord", "--image_size", str(IMAGE_SIZE), "--resize_mode", "center_crop",
         "--encode_quality", str(JPEG_QUALITY), "--processes_count", str(os.cpu_count() or 1),
         "--thread_count", "16", "--number_sample_per_shard", "2000", "--disable_all_reencoding", "False",
         "--enable_wandb", "False"],
        cwd=REPO_ROOT, escaping=True)
    urls.unlink()
    written = 0
    for stats in out.glob("*_stats.json"):
        written += json.loads(stats.read_text()).get("successes", 0)
    return measured, {"written": written}


def distribution_version(python: pathlib.Path | str, distribution: str) -> str | None:
    """The version of ``distribution`` installed for the interpreter ``python``; None if it is not."""
    done = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({distribution!r}))"],
                          capture_output=True, text=True)
    return done.stdout.strip() or None


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A peer written as a module of this package, run by the interpreter that has its tool."""

    key: str
    module: str  # run with ``python -m``
    package: str  # the import name whose absence skips the peer
    distribution: str  # whose version the results record
    project_env: bool = False  # run by this interpreter rather than the peers'

    def python(self, peers_python: pathlib.Path) -> pathlib.Path:
        return pathlib.Path(sys.executable) if self.project_env else pathlib.Path(peers_python)

    def install_hint(self) -> str:
        if self.project_env:
            return f"pip install -e '.[test]' (it has {self.distribution})"
        return PEERS_INSTALL


# Every peer tool but the hand-written script is measured with ``escaping`` (measure.run_measured): some
# of their processes' CPU escapes RUSAGE_CHILDREN. Ray's raylet ignores SIGCHLD, so that the kernel
# reaps its workers and adds their time to no one's, and its workers and daemons may outlive the
# processes that start them; img2dataset and LitData each leave a process behind as they exit.
RECIPES = {
    "mds": Recipe("mds", "benchmarks.peer_mds", "streaming", "mosaicml-streaming"),
    "litdata": Recipe("litdata", "benchmarks.peer_litdata", "litdata", "litdata"),
    "ray": Recipe("ray", "benchmarks.peer_ray", "ray", "ray", project_env=True),
}


def importable(python: pathlib.Path | str, package: str) -> bool:
    """Whether the interpreter ``python`` exists and finds ``package`` (without importing it)."""
    if not pathlib.Path(python).exists():
        return False
    done = subprocess.run([str(python), "-c", f"import importlib.util, sys; "
                           f"sys.exit(importlib.util.find_spec({package!r}) is None)"], capture_output=True)
    return done.returncode == 0


def _peer_env() -> dict[str, str]:
    """The repository on the path of a peer and of every worker it starts (spawned, or Ray's)."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}


def run_recipe(recipe: Recipe, peers_python: pathlib.Path, corpus: Corpus,
               out: pathlib.Path) -> tuple[Measured, dict]:
    """Runs ``recipe`` over ``corpus`` into ``out``; its JSON report, empty if it failed."""
    command = [str(recipe.python(peers_python)), "-m", recipe.module]
    if not recipe.project_env:
        command.append("write")
    measured = run_measured(
        [*command, "--input", str(corpus.root), "--output", str(out), "--image_size", str(IMAGE_SIZE),
         "--jpeg_quality", str(JPEG_QUALITY)],
        cwd=REPO_ROOT, env=_peer_env(), escaping=True)
    report = {}
    if measured.returncode == 0:
        try:
            report = json.loads(measured.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            report = {}
    return measured, report


def dumped_samples(recipe: Recipe, peers_python: pathlib.Path, out: pathlib.Path) -> list[tuple[bytes, str]]:
    """The first ``QUALITY_SAMPLE`` records of ``out`` as (image bytes, source file name), read back by the
    recipe's own ``read`` command with its tool's reader."""
    with tempfile.TemporaryDirectory(prefix="peer-read-") as folder:
        done = subprocess.run(
            [str(recipe.python(peers_python)), "-m", recipe.module, "read", "--output", str(out), "--dump", folder,
             "--samples", str(QUALITY_SAMPLE)],
            cwd=REPO_ROOT, env={**os.environ, **_peer_env()}, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{recipe.module} read failed: {done.stderr[-2000:]}")
        return [(path.read_bytes(), path.name) for path in sorted(pathlib.Path(folder).iterdir())]


def count_tfrecords(files: Iterable[pathlib.Path], compression: str) -> int:
    """The records in ``files``, counted by their framing (``compression``: ``gzip`` or ``none``)."""
    from beam_prep.io.tfrecord import count_records

    return sum(count_records(str(path), compression) for path in files)


def ours_record(features: dict) -> tuple[bytes, str]:
    return features["image/encoded"][0], features["image/filename"][0].decode()


def img2dataset_record(features: dict) -> tuple[bytes, str]:
    return features["jpg"][0], features["url"][0].decode().removeprefix("file://")


def ray_record(features: dict) -> tuple[bytes, str]:
    return features["image"][0], features["filename"][0].decode()


def record_quality(files: list[pathlib.Path], corpus: Corpus, image_and_source: ImageAndSource,
                   compression: str | None = None) -> float:
    """Mean PSNR (dB) of the first ``QUALITY_SAMPLE`` records of ``files`` against the reference crop;
    ``compression`` (``GZIP`` or ``""``) is TensorFlow's name for it, by default ``GZIP`` where the first
    name ends in ``.gz``."""
    import tensorflow as tf

    if compression is None:
        compression = "GZIP" if files and files[0].name.endswith(".gz") else ""

    def samples() -> Iterable[tuple[bytes, str]]:
        dataset = tf.data.TFRecordDataset([str(f) for f in files], compression_type=compression)
        for raw in dataset.take(QUALITY_SAMPLE):
            example = tf.train.Example.FromString(raw.numpy())
            yield image_and_source({key: list(value.bytes_list.value)
                                    for key, value in example.features.feature.items()})

    return samples_quality(samples(), corpus)


def samples_quality(samples: Iterable[tuple[bytes, str]], corpus: Corpus) -> float:
    """Mean PSNR (dB) of ``samples`` (JPEG bytes, source file name) against the reference crop of their source."""
    import tensorflow as tf

    from benchmarks.bench_resize import psnr, reference

    by_name = {path.name: path for path in corpus.files()}
    scores = []
    for data, source in samples:
        got = tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_ACCURATE").numpy()
        scores.append(psnr(got, reference(by_name[pathlib.PurePath(source).name].read_bytes())))
    return float(np.mean(scores))
