"""The reader benchmark's PyTorch and Grain mode: images/s into a training loop that is not TensorFlow.

``python -m benchmarks.bench_reader --pytorch`` writes the benchmark's corpus
(``benchmarks/corpus.py``) as ``--file_format array_record`` and ``webdataset``
(224x224 JPEG q90, 8 shards, as the TFRecord reader's), and times, each with the
same number of worker processes and batch 256, uint8 images and int64 labels:

  (p) a torch ``DataLoader`` over ``beam_prep.data_source(..., pairs=True)``, shuffled;
  (w) a torch ``DataLoader`` over ``beam_prep.webdataset_pipeline`` (shards and a
      1,000-sample buffer shuffled);
  (g) Grain: ``MapDataset.source(data_source)`` shuffled, batched, ``mp_prefetch``;
  (i) torchvision's ``ImageFolder`` on the corpus's source JPEGs (what one trains
      from without preparing a dataset), with ``Resize(224)``, ``CenterCrop(224)``
      and ``PILToTensor``: the same 224x224 uint8 images, decoded from the originals;
  (x) NVIDIA DALI's CPU pipeline over the same WebDataset shards as (w)
      (``benchmarks/dali_pipelines.py``: ``beam_prep.dali_reader``, ``fn.decoders.image``
      on the CPU), with as many threads as the others have workers; left out, and
      said, when DALI (the ``dali`` extra) is not installed.

Each reader runs epochs back to back (the loaders' workers persist between
them), gets a warm-up, then a timed stretch, in several rounds. Images/s is wall
clock; CPU-s per 1,000 images counts this process and its workers.

    python -m benchmarks.bench_reader --pytorch [--images 2000] [--workers 2] [--seconds 3] [--rounds 3] [--json out.json]

``--tree DIR`` reads a labelled tree of your own instead of the corpus (its datasets
written into a temporary folder): a quick check that needs no scikit-image.
"""
from __future__ import annotations

import argparse
import itertools
import logging
import pathlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence

from benchmarks import CACHE_DIR, IMAGE_SIZE, JPEG_QUALITY, dali_pipelines, machine
from benchmarks.corpus import ensure_corpus
from benchmarks.reading import BATCH_SIZE, DEFAULT_IMAGES, NUM_SHARDS, WARMUP_SECONDS, ensure_dataset
from benchmarks.report import tables
from benchmarks.results import Recording

log = logging.getLogger(__name__)

LABELS = {
    "p": "(p) torch DataLoader over beam_prep.data_source (array_record)",
    "w": "(w) torch DataLoader over beam_prep.webdataset_pipeline (webdataset)",
    "g": "(g) Grain MapDataset over beam_prep.data_source, mp_prefetch",
    "i": "(i) torchvision ImageFolder on the source JPEGs, Resize + CenterCrop 224",
    "x": "(x) NVIDIA DALI CPU pipeline over beam_prep.dali_reader (webdataset)",
}


def _grain_flags() -> None:
    # Grain 0.2.18 with jax installed reads an absl flag when mp_prefetch starts, and raises
    # UnparsedFlagAccessError unless flags were parsed (docs/guides/grain-pytorch.md): defaults.
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def _pair(record: dict) -> tuple:
    import numpy as np

    return record["image"], np.int64(record["label"])


def _epochs(make_epoch: Callable[[], Iterator]) -> Iterator:
    """Batches of one epoch after another, without end."""
    while True:
        yield from make_epoch()


def readers(array_record: pathlib.Path, webdataset: pathlib.Path, jpegs: pathlib.Path,
            workers: int) -> dict[str, Callable[[], Iterator]]:
    """Each reader as a maker of an endless iterator of ``(images, labels)`` batches."""
    import grain
    import torch
    import torchvision
    from torchvision.transforms import v2

    import beam_prep

    def torch_loader(dataset, **kwargs) -> Callable[[], Iterator]:
        def make() -> Iterator:
            loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=workers,
                                                 persistent_workers=True, **kwargs)
            return _epochs(lambda: iter(loader))
        return make

    def grain_loader() -> Iterator:
        _grain_flags()
        source = beam_prep.data_source(array_record, "train")
        dataset = (grain.MapDataset.source(source).seed(0).shuffle().repeat().map(_pair).batch(BATCH_SIZE)
                   .to_iter_dataset(grain.ReadOptions(num_threads=16, prefetch_buffer_size=500))
                   .mp_prefetch(grain.MultiprocessingOptions(num_workers=workers)))
        return iter(dataset)

    folder = torchvision.datasets.ImageFolder(
        str(jpegs), transform=v2.Compose([v2.Resize(IMAGE_SIZE, antialias=True), v2.CenterCrop(IMAGE_SIZE),
                                          v2.PILToTensor()]))
    found = {
        "p": torch_loader(beam_prep.data_source(array_record, "train", pairs=True), shuffle=True),
        "w": torch_loader(beam_prep.webdataset_pipeline(webdataset, "train")),
        "g": grain_loader,
        "i": torch_loader(folder, shuffle=True),
    }
    if dali_pipelines.available():
        found["x"] = lambda: dali_pipelines.dali_batches(webdataset, threads=workers)
    else:
        log.warning("NVIDIA DALI is not installed (pip install 'beam-prep[dali]'): reader x left out")
    return found


def _cpu_seconds() -> float:
    """CPU seconds of this process and every live child (the loaders' workers)."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            continue
    return total


def time_reader(make: Callable[[], Iterator], seconds: float) -> tuple[float, float]:
    """(images/s, CPU-s per 1,000 images) over ``seconds`` after a warm-up, on a fresh iterator."""
    batches = make()
    start = time.perf_counter()
    while time.perf_counter() - start < WARMUP_SECONDS:
        next(batches)
    images, wall, cpu = 0, time.perf_counter(), _cpu_seconds()
    while images == 0 or time.perf_counter() - wall < seconds:
        images += int(next(batches)[0].shape[0])
    wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
    if hasattr(batches, "close"):
        batches.close()
    del batches
    return images / wall, cpu / images * 1000


def main(argv: Sequence[str] | None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pytorch", action="store_true")
    parser.add_argument("--images", type=int, default=DEFAULT_IMAGES)
    parser.add_argument("--workers", type=int, default=2, help="worker processes of every loader")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=None, help=f"comma-separated reader keys ({','.join(LABELS)})")
    parser.add_argument("--tree", type=pathlib.Path, default=None,
                        help="a labelled image tree to read instead of the corpus (ROOT/<label>/<image>)")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args(argv)
    recording = Recording("reader-pytorch", argv, module="benchmarks.bench_reader")
    if args.tree is not None:
        root, datasets = args.tree, pathlib.Path(tempfile.mkdtemp(prefix="bench-reader-pytorch-"))
        args.images = sum(1 for p in root.rglob("*") if p.is_file())
    else:
        root, datasets = ensure_corpus(args.images, CACHE_DIR).root, CACHE_DIR
    array_record = ensure_dataset(root, args.images, "jpeg", "none", "array_record", datasets)
    webdataset = ensure_dataset(root, args.images, "jpeg", "none", "webdataset", datasets)
    makers = readers(array_record, webdataset, root, args.workers)
    keys = [k for k in args.only.split(",") if k in makers] if args.only else list(makers)
    rates: dict[str, list[float]] = {key: [] for key in keys}
    cpu: dict[str, list[float]] = {key: [] for key in keys}
    for round_, key in itertools.product(range(args.rounds), keys):
        wall_rate, cpu_per_k = time_reader(makers[key], args.seconds)
        rates[key].append(wall_rate)
        cpu[key].append(cpu_per_k)
        log.info("round %d %s %8.0f images/s %6.2f CPU-s per 1,000", round_ + 1, key, wall_rate, cpu_per_k)
    results = {"images": args.images, "workers": args.workers, "batch_size": BATCH_SIZE, "seconds": args.seconds,
               "rounds": args.rounds, "image_size": IMAGE_SIZE, "jpeg_quality": JPEG_QUALITY,
               "num_shards": NUM_SHARDS,
               "readers": {key: {"label": LABELS[key], "images_per_s": rates[key],
                                 "cpu_s_per_1000": cpu[key]} for key in keys}}
    print()
    print(tables.reader_pytorch(results))
    print()
    print(f"Machine: {machine.describe(machine.machine_info())}")
    log.info("medians: %s", {key: round(statistics.median(r)) for key, r in rates.items()})
    if args.json:
        recording.write(args.json, results)
    if args.tree is not None:
        shutil.rmtree(datasets, ignore_errors=True)
