"""Reader benchmark: beam-prep's ``make_dataset`` against the seed notebook's reader and the decode limit.

On the same shards, written by ``python -m pipelines.prepare_images`` from the
cached realistic corpus (``benchmarks/corpus.py``) at 224x224, JPEG q90, and
read from local disk (the page cache, after the first round):

  (a) beam-prep's reader with typical training settings: ``make_dataset(path,
      "train", batch_size=256, training=True, repeat=True)``, i.e. file and
      record shuffle, any order, uint8 images, int64 labels, no augmentation;
      (a') the same with ``ReaderConfig(dct_method="INTEGER_FAST")``, TensorFlow's default
      JPEG decode; also with ``augment="crop_flip"`` and in evaluation mode;
  (b) the seed notebook's reader (``benchmarks.seed_notebook.seed_read``):
      interleave of GZIP TFRecordDatasets, ``parse_single_example``,
      ``decode_jpeg``, ``convert_image_dtype`` to float32, ``batch(1)``;
  (c) the limit: ``decode_jpeg`` of the same records' JPEG bytes held in memory
      (``from_tensor_slices(encoded).map(decode_jpeg, AUTOTUNE).batch(256)
      .prefetch``), with (a)'s decode; (c') with TensorFlow's default decode;
  (d) beam-prep's reader on the same corpus written as raw pixels
      (``--image_format raw``), against (b); (d') the same records written
      with ``--compression none``: inflating raw
      pixels costs more CPU than decoding the JPEG they came from.

Every reader runs in this one process, one after another, in several rounds;
each run gets a fresh iterator, a warm-up, then a timed stretch. The table
shows the median over rounds of images/s (wall clock) and of images per
CPU-second of this process (every tf.data thread included). The second number
hardly moves when other programs share the machine, the first does: compare
wall-clock numbers only from a quiet machine.

    python -m benchmarks.bench_reader [--images 2000] [--seconds 3] [--rounds 3] [--json out.json]

``--gcs`` runs the gs:// mode instead (``benchmarks/reader_gcs.py``): reader (a)
from local disk and from the test GCS server at 0 and 30 ms per request.
``--pytorch`` runs the PyTorch and Grain mode (``benchmarks/reader_pytorch.py``):
torch DataLoaders over ``data_source`` and the WebDataset recipe, Grain, and
torchvision's ``ImageFolder`` on the source JPEGs.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import pathlib
import statistics
import sys
from collections.abc import Sequence

from benchmarks import CACHE_DIR, IMAGE_SIZE, JPEG_QUALITY, machine
from benchmarks.corpus import ensure_corpus
from benchmarks.reading import BATCH_SIZE, DEFAULT_IMAGES, NUM_SHARDS, Reader, ensure_dataset, time_reader
from benchmarks.results import Recording

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Result:
    key: str
    label: str
    wall: list[float] = dataclasses.field(default_factory=list)  # images/s per round
    cpu: list[float] = dataclasses.field(default_factory=list)  # images per CPU-second per round

    @property
    def images_per_s(self) -> float:
        return statistics.median(self.wall)

    @property
    def images_per_cpu_s(self) -> float:
        return statistics.median(self.cpu)


def readers(jpeg_dir: pathlib.Path, raw_dir: pathlib.Path, raw_plain_dir: pathlib.Path) -> list[Reader]:
    import tensorflow as tf

    from beam_prep.model import features
    from beam_prep.reader import ReaderConfig, load_info, make_dataset
    from benchmarks.seed_notebook import seed_read

    jpeg_files = list(load_info(str(jpeg_dir)).splits["train"].files)
    encoded = _encoded_images(jpeg_files)

    def limit(dct_method: str):
        def make():
            ds = tf.data.Dataset.from_tensor_slices(encoded).repeat()
            ds = ds.map(lambda e: tf.io.decode_jpeg(e, channels=3, dct_method=dct_method),
                        num_parallel_calls=tf.data.AUTOTUNE)
            return ds.batch(BATCH_SIZE).prefetch(tf.data.AUTOTUNE)
        return make

    def ours(path: pathlib.Path, **kwargs):
        return lambda: make_dataset(str(path), "train", batch_size=BATCH_SIZE, repeat=True, **kwargs)

    return [
        Reader("a", "(a) beam-prep reader: JPEG, training defaults", ours(jpeg_dir, training=True)),
        Reader("a_fast", "(a′) beam-prep reader: JPEG, training defaults, dct INTEGER_FAST",
               ours(jpeg_dir, training=True, config=ReaderConfig(dct_method="INTEGER_FAST"))),
        Reader("a_eval", "(a) in evaluation mode (fixed order, no shuffle)", ours(jpeg_dir, training=False)),
        Reader("a_crop", "(a) with augment=\"crop_flip\"", ours(jpeg_dir, training=True, augment="crop_flip")),
        Reader("b", "(b) seed notebook reader: JPEG, batch(1), float32",
               lambda: seed_read(jpeg_files, batch_size=1, image_key=features.ENCODED,
                                 label_key=features.LABEL)),
        Reader("c", "(c) limit: decode_jpeg from memory, dct INTEGER_ACCURATE as (a)", limit("INTEGER_ACCURATE")),
        Reader("c_fast", "(c′) limit: decode_jpeg from memory, TF default dct (INTEGER_FAST)", limit("")),
        Reader("d", "(d) beam-prep reader: raw pixels, training defaults", ours(raw_dir, training=True)),
        Reader("d_plain", "(d′) raw pixels written with --compression none",
               ours(raw_plain_dir, training=True)),
    ]


def _encoded_images(files: Sequence[str]):
    """Every record's JPEG bytes, in one string tensor: what the limit decodes."""
    import tensorflow as tf

    from beam_prep.model import features

    spec = features.tf_parse_spec((features.ENCODED,))
    batches = [tf.io.parse_example(s, spec)[features.ENCODED]
               for s in tf.data.TFRecordDataset(list(files), "GZIP").batch(1024)]
    return tf.concat(batches, 0)


def _megabytes(folder: pathlib.Path, pattern: str) -> float:
    return sum(p.stat().st_size for p in folder.glob(pattern)) / 1e6


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×"


def table(results: dict[str, Result]) -> str:
    r = results
    compare = {"a": "c", "a_fast": "c_fast", "a_eval": "c", "a_crop": "c"}
    lines = [
        "| reader | images/s | images per CPU-s | vs (c) limit | vs (b) seed |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, res in r.items():
        limit_key = compare.get(key)
        vs_limit = "—"
        if limit_key in ("c", "c_fast"):
            vs_limit = (f"{_ratio(res.images_per_s, r[limit_key].images_per_s)} "
                        f"({_ratio(res.images_per_cpu_s, r[limit_key].images_per_cpu_s)} per CPU-s)")
        vs_seed = "—" if key == "b" else (
            f"{_ratio(res.images_per_s, r['b'].images_per_s)} "
            f"({_ratio(res.images_per_cpu_s, r['b'].images_per_cpu_s)} per CPU-s)")
        lines.append(f"| {res.label} | {res.images_per_s:,.0f} | {res.images_per_cpu_s:,.0f} "
                     f"| {vs_limit} | {vs_seed} |")
    return "\n".join(lines)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=DEFAULT_IMAGES,
                        help=f"corpus size (default {DEFAULT_IMAGES}); readers repeat it while timed")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per reader per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (the median is reported)")
    parser.add_argument("--only", default=None,
                        help="comma-separated reader keys (a,a_fast,a_eval,a_crop,b,c,c_fast,d,d_plain)")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="also write the numbers here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--gcs" in argv:
        from benchmarks import reader_gcs

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        reader_gcs.main(argv)
        return
    if "--pytorch" in argv:
        from benchmarks import reader_pytorch

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        logging.getLogger("beam_prep").setLevel(logging.WARNING)
        reader_pytorch.main(argv)
        return
    args = _parse_args(argv)
    recording = Recording("reader", argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("beam_prep").setLevel(logging.WARNING)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    corpus = ensure_corpus(args.images, CACHE_DIR)
    jpeg_dir = ensure_dataset(corpus.root, args.images, "jpeg")
    raw_dir = ensure_dataset(corpus.root, args.images, "raw")
    raw_plain_dir = ensure_dataset(corpus.root, args.images, "raw", compression="none")
    all_readers = readers(jpeg_dir, raw_dir, raw_plain_dir)
    if args.only:
        keep = set(args.only.split(","))
        all_readers = [r for r in all_readers if r.key in keep]
    results = {r.key: Result(r.key, r.label) for r in all_readers}
    for round_ in range(args.rounds):
        for reader in all_readers:
            wall, cpu = time_reader(reader, args.seconds)
            results[reader.key].wall.append(wall)
            results[reader.key].cpu.append(cpu)
            log.info("round %d %-8s %8.0f images/s %8.0f per CPU-s", round_ + 1, reader.key, wall, cpu)

    info = machine.machine_info()
    jpeg_mb = _megabytes(jpeg_dir, "*.tfrecord.gz")
    raw_mb = _megabytes(raw_dir, "*.tfrecord.gz")
    raw_plain_mb = _megabytes(raw_plain_dir, "*.tfrecord")
    print()
    print(f"Reader benchmark: {args.images:,} records of {IMAGE_SIZE}x{IMAGE_SIZE} JPEG q{JPEG_QUALITY} "
          f"({jpeg_mb:.0f} MB in {NUM_SHARDS} GZIP shards; raw pixels: {raw_mb:.0f} MB GZIP, "
          f"{raw_plain_mb:.0f} MB uncompressed) from local disk, batch {BATCH_SIZE}; "
          f"median of {args.rounds} rounds of {args.seconds:g} s")
    print()
    if set(results) >= {"a", "a_fast", "a_eval", "a_crop", "b", "c", "c_fast", "d", "d_plain"}:
        print(table(results))
    else:
        for res in results.values():
            print(f"{res.label}: {res.images_per_s:,.0f} images/s, {res.images_per_cpu_s:,.0f} per CPU-s")
    print()
    print(f"Machine: {machine.describe(info)}")
    if args.json:
        recording.write(args.json, {
            "sizes_mb": {"jpeg_gzip": jpeg_mb, "raw_gzip": raw_mb, "raw_none": raw_plain_mb},
            "settings": {"images": args.images, "image_size": IMAGE_SIZE, "jpeg_quality": JPEG_QUALITY,
                         "num_shards": NUM_SHARDS, "batch_size": BATCH_SIZE, "seconds": args.seconds,
                         "rounds": args.rounds},
            "results": {k: {"label": v.label, "images_per_s": v.wall, "images_per_cpu_s": v.cpu}
                        for k, v in results.items()},
        })


if __name__ == "__main__":
    main()
