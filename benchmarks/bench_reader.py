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
      pixels costs more CPU than decoding the JPEG they came from;
  (e) reader (a) on the corpus written by the default command (``beam-prep
      prepare --input --output``: the shard count and sizes a user gets, GZIP),
      against (c) on that dataset's own records (e_limit);
  (x) NVIDIA DALI's CPU pipeline (``benchmarks/dali_pipelines.py``: ``dali_reader``,
      ``fn.decoders.image(device="cpu")``) on the JPEG records written with
      ``--compression none`` (DALI reads no GZIP), against reader (a) on the same
      shards (a_none); (x_resize) with ``fn.resize`` to ``RESIZE`` x ``RESIZE``,
      against ``make_dataset(..., resize=RESIZE)`` (a_resize). Left out, and said,
      when DALI (the ``dali`` extra) is not installed.

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

from benchmarks import CACHE_DIR, IMAGE_SIZE, JPEG_QUALITY, dali_pipelines, machine
from benchmarks.corpus import ensure_corpus
from benchmarks.reading import (
    BATCH_SIZE,
    DEFAULT_IMAGES,
    NUM_SHARDS,
    Reader,
    ensure_dataset,
    ensure_default_dataset,
    num_shards,
    time_reader,
)
from benchmarks.report import tables
from benchmarks.results import Recording

log = logging.getLogger(__name__)

# decode + resize's output side: the reader's resize= and DALI's fn.resize, from the stored 224.
RESIZE = 192
# Every reader's key, in the table's order.
KEYS = ("a", "a_fast", "a_eval", "a_crop", "b", "c", "c_fast", "d", "d_plain", "e", "e_limit", "a_none",
        "x", "a_resize", "x_resize")


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


def readers(jpeg_dir: pathlib.Path, raw_dir: pathlib.Path, raw_plain_dir: pathlib.Path,
            default_dir: pathlib.Path, jpeg_plain_dir: pathlib.Path) -> list[Reader]:
    from beam_prep.model import features
    from beam_prep.reader import ReaderConfig, make_dataset
    from benchmarks.seed_notebook import seed_read

    def ours(path: pathlib.Path, **kwargs):
        return lambda: make_dataset(str(path), "train", batch_size=BATCH_SIZE, repeat=True, **kwargs)

    found = [
        Reader("a", "(a) beam-prep reader: JPEG, training defaults", ours(jpeg_dir, training=True)),
        Reader("a_fast", "(a′) beam-prep reader: JPEG, training defaults, dct INTEGER_FAST",
               ours(jpeg_dir, training=True, config=ReaderConfig(dct_method="INTEGER_FAST"))),
        Reader("a_eval", "(a) in evaluation mode (fixed order, no shuffle)", ours(jpeg_dir, training=False)),
        Reader("a_crop", "(a) with augment=\"crop_flip\"", ours(jpeg_dir, training=True, augment="crop_flip")),
        Reader("b", "(b) seed notebook reader: JPEG, batch(1), float32",
               lambda: seed_read(_files(jpeg_dir), batch_size=1, image_key=features.ENCODED,
                                 label_key=features.LABEL)),
        Reader("c", "(c) limit: decode_jpeg from memory, dct INTEGER_ACCURATE as (a)",
               _limit(jpeg_dir, "INTEGER_ACCURATE")),
        Reader("c_fast", "(c′) limit: decode_jpeg from memory, TF default dct (INTEGER_FAST)", _limit(jpeg_dir, "")),
        Reader("d", "(d) beam-prep reader: raw pixels, training defaults", ours(raw_dir, training=True)),
        Reader("d_plain", "(d′) raw pixels written with --compression none",
               ours(raw_plain_dir, training=True)),
        Reader("e", f"(e) reader (a) on the default command's dataset ({num_shards(default_dir)} GZIP shards)",
               ours(default_dir, training=True)),
        Reader("e_limit", "(e) limit: (c) on the default command's records", _limit(default_dir, "INTEGER_ACCURATE")),
        Reader("a_none", "(a) on JPEG records written with --compression none", ours(jpeg_plain_dir, training=True)),
        Reader("a_resize", f"(a) on them with resize={RESIZE}",
               ours(jpeg_plain_dir, training=True, resize=RESIZE)),
    ]
    if dali_pipelines.available():
        found += [
            Reader("x", "(x) DALI CPU pipeline: decode, on the same --compression none records",
                   lambda: dali_pipelines.dali_batches(jpeg_plain_dir)),
            Reader("x_resize", f"(x) with fn.resize to {RESIZE}x{RESIZE}",
                   lambda: dali_pipelines.dali_batches(jpeg_plain_dir, resize=RESIZE)),
        ]
    else:
        log.warning("NVIDIA DALI is not installed (pip install 'beam-prep[dali]'): readers x and x_resize left out")
    return sorted(found, key=lambda r: KEYS.index(r.key))


def _files(path: pathlib.Path) -> list[str]:
    from beam_prep.reader import load_info

    return list(load_info(str(path)).splits["train"].files)


def _limit(path: pathlib.Path, dct_method: str):
    """The decode limit on ``path``'s records: ``decode_jpeg`` of their JPEG bytes held in memory."""
    import tensorflow as tf

    files = _files(path)
    state = {}

    def make():
        if "encoded" not in state:  # read once, when first timed
            state["encoded"] = _encoded_images(files)
        ds = tf.data.Dataset.from_tensor_slices(state["encoded"]).repeat()
        ds = ds.map(lambda e: tf.io.decode_jpeg(e, channels=3, dct_method=dct_method),
                    num_parallel_calls=tf.data.AUTOTUNE)
        return ds.batch(BATCH_SIZE).prefetch(tf.data.AUTOTUNE)
    return make


def _encoded_images(files: Sequence[str]):
    """Every record's JPEG bytes, in one string tensor: what the limit decodes."""
    import tensorflow as tf

    from beam_prep.model import features

    spec = features.tf_parse_spec((features.ENCODED,))
    compression = "GZIP" if files[0].endswith(".gz") else ""
    batches = [tf.io.parse_example(s, spec)[features.ENCODED]
               for s in tf.data.TFRecordDataset(list(files), compression).batch(1024)]
    return tf.concat(batches, 0)


def _megabytes(folder: pathlib.Path, pattern: str) -> float:
    return sum(p.stat().st_size for p in folder.glob(pattern)) / 1e6


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=DEFAULT_IMAGES,
                        help=f"corpus size (default {DEFAULT_IMAGES}); readers repeat it while timed")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per reader per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (the median is reported)")
    parser.add_argument("--only", default=None, help=f"comma-separated reader keys ({','.join(KEYS)})")
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
    default_dir = ensure_default_dataset(corpus.root, args.images)
    jpeg_plain_dir = ensure_dataset(corpus.root, args.images, "jpeg", compression="none")
    all_readers = readers(jpeg_dir, raw_dir, raw_plain_dir, default_dir, jpeg_plain_dir)
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
    record = {
        "sizes_mb": {"jpeg_gzip": jpeg_mb, "raw_gzip": raw_mb, "raw_none": raw_plain_mb},
        "settings": {"images": args.images, "image_size": IMAGE_SIZE, "jpeg_quality": JPEG_QUALITY,
                     "num_shards": NUM_SHARDS, "batch_size": BATCH_SIZE, "seconds": args.seconds,
                     "rounds": args.rounds, "default_num_shards": num_shards(default_dir),
                     "resize": RESIZE},
        "results": {k: {"label": v.label, "images_per_s": v.wall, "images_per_cpu_s": v.cpu}
                    for k, v in results.items()},
    }
    print()
    print(f"Reader benchmark: {args.images:,} records of {IMAGE_SIZE}x{IMAGE_SIZE} JPEG q{JPEG_QUALITY} "
          f"({jpeg_mb:.0f} MB in {NUM_SHARDS} GZIP shards; raw pixels: {raw_mb:.0f} MB GZIP, "
          f"{raw_plain_mb:.0f} MB uncompressed) from local disk, batch {BATCH_SIZE}; "
          f"median of {args.rounds} rounds of {args.seconds:g} s")
    print()
    if "b" in results:
        print(tables.reader(record))
    else:
        for res in results.values():
            print(f"{res.label}: {res.images_per_s:,.0f} images/s, {res.images_per_cpu_s:,.0f} per CPU-s")
    print()
    print(f"Machine: {machine.describe(info)}")
    if args.json:
        recording.write(args.json, record)


if __name__ == "__main__":
    main()
