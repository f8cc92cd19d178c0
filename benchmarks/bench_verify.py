"""``beam-prep verify`` against the reader it must keep up with, on the reader benchmark's dataset.

On the records ``benchmarks/bench_reader.py`` reads (the cached corpus written
by the pipeline at 224x224, JPEG q90), repeated into ``--shards`` shards of
``--shard_records`` records (default 8 of 8,000, about 125 MB each, near the
writer's 150 MB target), so that the fixed costs of a run (tracing the check,
opening each shard) weigh on ``verify`` as they do on a real dataset. In one
process, taking turns for ``--rounds`` rounds:

  (a) the reader as ``beam-prep bench`` times it (:func:`beam_prep.tools.throughput.measure_reader`):
      ``make_dataset`` with training defaults, batch 256, repeated, ``--seconds`` after a warm-up;
  (a') the same in evaluation order (fixed, no shuffle);
  (e) the reader over every record once, in evaluation order, timed from
      ``make_dataset`` to the last batch, as ``verify`` is timed;
  (v) ``verify`` (:func:`beam_prep.tools.verification.verify`): every record of every
      split, parsed, decoded and checked, once.

Each figure is images per second of wall time and per CPU-second of this
process; medians over rounds. The second hardly moves when other programs
share the machine, the first does.

``verify``'s figure includes its fixed costs; the reader's excludes its
warm-up (a second).

    python -m benchmarks.bench_verify [--images 2000] [--shards 8] [--shard_records 8000] [--seconds 3] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import shutil
import time
from collections.abc import Sequence

from benchmarks import CACHE_DIR, machine
from benchmarks.corpus import ensure_corpus
from benchmarks.reading import BATCH_SIZE, DEFAULT_IMAGES, ensure_dataset
from benchmarks.report import tables
from benchmarks.results import Recording

log = logging.getLogger(__name__)

DATASET_VERSION = 3  # 3: the manifest's run counts match the copies, as verify checks


def ensure_copies(source: pathlib.Path, shards: int, shard_records: int) -> pathlib.Path:
    """``source``'s train split repeated into ``shards`` shards of ``shard_records`` records, cached.

    Written with the pipeline's own shard writer; the manifest is ``source``'s
    with the split's shards and counts made to match.
    """
    import tensorflow as tf

    from beam_prep.io.tfrecord import shard_writer, write_record
    from beam_prep.model import features

    out = CACHE_DIR / f"verify-v{DATASET_VERSION}-{source.name}-{shards}x{shard_records}"
    if (out / "manifest.json").exists():
        log.info("reusing %s", out)
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    manifest = json.loads((source / "manifest.json").read_text())
    train = manifest["splits"]["train"]
    records = [r.numpy() for r in tf.data.TFRecordDataset(
        [str(source / name) for name in train["shards"]], "GZIP")]
    labels = manifest["labels"]
    class_counts = {label: 0 for label in labels}
    names = [f"train-{i:05d}-of-{shards:05d}.tfrecord.gz" for i in range(shards)]
    for name in names:
        with shard_writer(str(out / name), "gzip") as f:
            for i in range(shard_records):
                record = records[i % len(records)]
                write_record(f, record)
                class_counts[labels[features.decode_example(record)[features.LABEL]]] += 1
    manifest["splits"] = {"train": {
        "num_examples": shards * shard_records, "shards": names, "class_counts": class_counts,
        "shard_num_examples": [shard_records] * shards}}
    total = shards * shard_records
    manifest["counts"] = {**manifest.get("counts", {}), "listed": total, "written": total, "failed": 0, "skipped": 0}
    shutil.copy(source / "labels.txt", out / "labels.txt")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out


def _time_one_pass(path: str) -> tuple[float, float]:
    """The reader over every record once, as verify reads them: from making the dataset to its end."""
    from beam_prep.reader import make_dataset

    wall, cpu = time.perf_counter(), time.process_time()
    images = sum(int(images.shape[0])
                 for images, _ in make_dataset(path, "train", batch_size=BATCH_SIZE, training=False))
    return images / (time.perf_counter() - wall), images / (time.process_time() - cpu)


def _time_verify(path: str) -> tuple[float, float]:
    from beam_prep.reader import checks
    from beam_prep.tools.verification import verify

    checks._batch_checker.cache_clear()  # traced in every round, as the command traces it once
    wall, cpu = time.perf_counter(), time.process_time()
    report = verify(path)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if not report.ok:
        raise SystemExit(f"the benchmark dataset does not verify: {report.problems[:3]}")
    return report.records / wall, report.records / cpu


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=DEFAULT_IMAGES)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard_records", type=int, default=8000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    recording = Recording("verify", argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("beam_prep").setLevel(logging.WARNING)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from beam_prep.tools.throughput import measure_reader

    path = str(ensure_copies(ensure_dataset(ensure_corpus(args.images, CACHE_DIR).root, args.images, "jpeg"),
                             args.shards, args.shard_records))
    runs = {
        "(a) reader, training order (beam-prep bench)":
            lambda: _rates(measure_reader(path, "train", batch_size=BATCH_SIZE, seconds=args.seconds)),
        "(a') reader, evaluation order (beam-prep bench --eval)":
            lambda: _rates(measure_reader(path, "train", batch_size=BATCH_SIZE, training=False,
                                          seconds=args.seconds)),
        "(e) reader, one pass in evaluation order, its start included":
            lambda: _time_one_pass(path),
        "(v) verify, every record once (beam-prep verify)": lambda: _time_verify(path),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for round_ in range(args.rounds):
        for name, run in runs.items():
            results[name].append(run())
            log.info("round %d %s: %.0f images/s, %.0f per CPU-s", round_ + 1, name, *results[name][-1])
    record = {
        "settings": {"images": args.images, "shards": args.shards, "shard_records": args.shard_records,
                     "seconds": args.seconds, "rounds": args.rounds, "batch_size": BATCH_SIZE},
        "runs": {name: {"images_per_s": [r[0] for r in rates], "images_per_cpu_s": [r[1] for r in rates]}
                 for name, rates in results.items()},
    }
    print(tables.verify(record))
    print()
    print(f"Machine: {machine.describe(machine.machine_info())}")
    recording.write(args.json, record)


def _rates(result) -> tuple[float, float]:
    return result.images_per_second, result.images_per_cpu_second


if __name__ == "__main__":
    main()
