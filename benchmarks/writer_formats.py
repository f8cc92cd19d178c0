"""``bench_writer --formats``: the same command in every ``--file_format``, and each format's read rate.

On the cached corpus and (c)'s settings (224x224 centre crops, JPEG q90), in
rounds that take turns so that a shared machine's drift falls on every row:

  * ``tfrecord`` as the default writes it (GZIP), and with ``--compression none``:
    the same image work as the other formats, which are never GZIP-compressed;
  * ``array_record`` and ``webdataset``.

Each row gives images/s (command start to manifest.json written), CPU ms per
image of the whole process tree, output size, and the median over rounds of
each round's ratio to uncompressed TFRecord, of images/s and of images per
CPU-second (the bar: within 5%; on a shared machine the CPU ratio is the one
that holds still).

Then, in this process, from the last round's output: ``make_dataset``'s
sequential rate over the TFRecord dataset (decoded uint8 batches of 256, in
order), ``data_source``'s random reads (decoded examples, 256 random indices
a call, ``__getitems__``) and its random lookups undecoded (the array_record
library's ``ArrayRecordDataSource``, one index a call), each as a median of rounds.

Last, the ArrayRecord writer options ``io.array_record.WRITER_OPTIONS`` was
chosen from: the TFRecord run's records (and 400 of them decoded to raw
pixels) written with each candidate, with the file size over the payload, the
writing time per record and the mean time of a random lookup.

    python -m benchmarks.bench_writer --formats [--images 2000] [--repeat 3] [--json formats.json]
"""
from __future__ import annotations

import argparse
import logging
import os
import pathlib
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence

from benchmarks import CACHE_DIR, machine
from benchmarks.corpus import ensure_corpus
from benchmarks.results import Recording
from benchmarks.writer_runs import DEFAULT_FLAGS, RunResult, fmt, median_run, paired_ratio, run_ours

log = logging.getLogger(__name__)

BASELINE = "tfrecord-none"
FORMAT_RUNS = {
    "tfrecord": ("`--file_format tfrecord` (GZIP, the default)", ("--file_format", "tfrecord")),
    BASELINE: ("`--file_format tfrecord --compression none`", ("--file_format", "tfrecord", "--compression", "none")),
    "array_record": ("`--file_format array_record`", ("--file_format", "array_record")),
    "webdataset": ("`--file_format webdataset`", ("--file_format", "webdataset")),
}
BATCH = 256
READ_SECONDS = 3.0


def write_table(rounds: dict[str, list[RunResult]]) -> str:
    """Each format's median run, and its paired ratio to uncompressed TFRecord."""
    lines = ["| run | images | wall s | images/s | ÷ tfrecord none | CPU ms per image | ÷ tfrecord none per CPU-s "
             "| output MB |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key, (label, _) in FORMAT_RUNS.items():
        chosen = median_run(rounds[key])
        ratios = ["—" if key == BASELINE else fmt(paired_ratio(rounds[BASELINE], rounds[key], per_cpu), 3) + "×"
                  for per_cpu in (False, True)]
        lines.append(f"| {label} | {chosen.images:,} | {fmt(chosen.seconds)} "
                     f"| {'failed' if chosen.error else fmt(chosen.images_per_s)} | {ratios[0]} "
                     f"| {fmt(chosen.cpu_ms_per_image)} | {ratios[1]} | {fmt(chosen.output_bytes / 1e6)} |")
    return "\n".join(lines)


def _rate(step: Callable[[], int], seconds: float) -> float:
    """Items per second of ``step`` (which returns the items it did), over ``seconds`` after one warm-up call."""
    step()
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        done += step()
    return done / elapsed


def read_rates(tfrecord: pathlib.Path, array_record: pathlib.Path, rounds: int) -> dict[str, float]:
    """Median images/s of the three reads the module docstring names."""
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    import beam_prep

    dataset = beam_prep.make_dataset(str(tfrecord), "train", batch_size=BATCH, training=False, repeat=True)
    batches = iter(dataset)
    source = beam_prep.data_source(array_record, "train")
    lookups = ArrayRecordDataSource(list(source.split.files))
    rng = random.Random(0)
    n = len(source)

    def sequential() -> int:
        images, _ = next(batches)
        return int(images.shape[0])

    def decoded() -> int:
        return len(source.__getitems__([rng.randrange(n) for _ in range(BATCH)]))

    def undecoded() -> int:
        for _ in range(BATCH):
            lookups[rng.randrange(n)]
        return BATCH

    rates: dict[str, list[float]] = {"make_dataset sequential": [], "data_source random, decoded": [],
                                     "ArrayRecordDataSource random lookups, undecoded": []}
    for _ in range(rounds):
        for (name, values), step in zip(rates.items(), (sequential, decoded, undecoded)):
            values.append(_rate(step, READ_SECONDS))
    return {name: statistics.median(values) for name, values in rates.items()}


CANDIDATE_OPTIONS = ("group_size:1,uncompressed", "group_size:1,snappy", "group_size:1,zstd:1",
                     "group_size:1,zstd:3", "group_size:16,zstd:3", "group_size:65536,zstd:3")
LOOKUPS = 3000
LOOKUP_SECONDS = 5.0


def _records(tfrecord: pathlib.Path) -> list[bytes]:
    import tensorflow as tf

    return [r.numpy() for path in sorted(tfrecord.glob("train-*.tfrecord*"))
            for r in tf.data.TFRecordDataset(str(path), compression_type="GZIP" if path.suffix == ".gz" else "")]


def _raw(records: list[bytes], n: int = 400) -> list[bytes]:
    import io

    import numpy as np
    from PIL import Image

    from beam_prep.model.features import ENCODED, decode_example

    return [np.asarray(Image.open(io.BytesIO(decode_example(r)[ENCODED])).convert("RGB")).tobytes()
            for r in records[:n]]


def options_rows(records: list[bytes], workdir: pathlib.Path) -> list[dict[str, float | str]]:
    """Each candidate's size over the payload, write us per record and random lookup us."""
    from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

    rows = []
    rng = random.Random(0)
    payload = sum(map(len, records))
    warm_up = ArrayRecordWriter(str(workdir / "warm-up.array_record"), "group_size:1,uncompressed")
    for record in records:  # untimed: the first candidate would otherwise pay for the page cache
        warm_up.write(record)
    warm_up.close()
    for options in CANDIDATE_OPTIONS:
        path = str(workdir / "options.array_record")
        start = time.perf_counter()
        writer = ArrayRecordWriter(path, f"{options},max_parallelism:1")
        for record in records:
            writer.write(record)
        writer.close()
        write = time.perf_counter() - start
        reader = ArrayRecordReader(path, "readahead_buffer_size:0", file_reader_buffer_size=32768)
        lookups, start = 0, time.perf_counter()
        while lookups < LOOKUPS and time.perf_counter() - start < LOOKUP_SECONDS:  # big groups: seconds a lookup
            reader.read([rng.randrange(len(records))])
            lookups += 1
        lookup = time.perf_counter() - start
        reader.close()
        rows.append({"options": options, "size_over_payload": os.path.getsize(path) / payload,
                     "write_us": write / len(records) * 1e6, "lookup_us": lookup / lookups * 1e6})
    return rows


def _options_table(rows: list[dict[str, float | str]]) -> str:
    return "\n".join(["| options | size ÷ payload | write µs/record | random lookup µs |", "|---|---:|---:|---:|"] + [
        f"| `{r['options']}` | {r['size_over_payload']:.4f} | {r['write_us']:,.0f} | {r['lookup_us']:,.1f} |"
        for r in rows])


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", action="store_true", help="this mode (bench_writer passes it on)")
    parser.add_argument("--images", type=int, default=2000, help="corpus size (default 2000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each row is the median (default 3)")
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here as JSON")
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> None:
    args = _parse_args(argv)
    recording = Recording("writer-formats", argv, module="benchmarks.bench_writer")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    info = machine.machine_info()
    info["busy_percent_before"] = machine.busy_percent()
    corpus = ensure_corpus(args.images, CACHE_DIR)
    rounds: dict[str, list[RunResult]] = {key: [] for key in FORMAT_RUNS}
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="formats-", dir=CACHE_DIR))
    load = []
    try:
        keys = list(FORMAT_RUNS)
        for i in range(args.repeat):
            for key in keys[i % len(keys):] + keys[:i % len(keys)]:  # each round starts with the next
                result = run_ours(corpus, workdir / key, (*DEFAULT_FLAGS, *FORMAT_RUNS[key][1]))
                rounds[key].append(result)
                load.append(os.getloadavg()[0])
                log.info("%s: %s images/s%s", key, fmt(result.images_per_s),
                         f" FAILED {result.error}" if result.error else "")
        reads = read_rates(workdir / "tfrecord" / "ours", workdir / "array_record" / "ours", args.repeat)
        records = _records(workdir / BASELINE / "ours")
        options = {"jpeg": options_rows(records, workdir), "raw": options_rows(_raw(records), workdir)}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(f"Corpus: {corpus.images:,} images; settings of (c); medians of {args.repeat} rounds taking turns.")
    print()
    print(write_table(rounds))
    print()
    for name, rate in reads.items():
        print(f"- {name}: {rate:,.0f} images/s (one process)")
    for kind, rows in options.items():
        print()
        print(f"ArrayRecord writer options, the TFRecord run's records ({kind}):")
        print()
        print(_options_table(rows))
    print()
    print(f"Machine: {machine.describe(info)}")
    print(f"Load average (1 min) after each run: min {min(load):.1f}, median {statistics.median(load):.1f}, "
          f"max {max(load):.1f} on {os.cpu_count()} cores")
    if args.json:
        recording.write(args.json, {
            "busy_percent_before": info["busy_percent_before"], "corpus": corpus.summary(),
            "labels": {key: label for key, (label, _) in FORMAT_RUNS.items()},
            "runs": {key: [r.to_json() for r in results] for key, results in rounds.items()},
            "ratio_to_tfrecord_none": {key: paired_ratio(rounds[BASELINE], rounds[key]) for key in FORMAT_RUNS},
            "ratio_to_tfrecord_none_per_cpu": {key: paired_ratio(rounds[BASELINE], rounds[key], per_cpu=True)
                                               for key in FORMAT_RUNS},
            "reads_per_second": reads, "array_record_options": options, "load_average": load,
        })
