"""Paired A/B of the reader of two (or more) checkouts, on the same dataset, in alternating processes.

For a claim like "the reader got slower since commit X": make a worktree of X
(``git worktree add ../old X``), then

    python -m benchmarks.reader_ab DATASET --side old=../old --side new=. [--rounds 6] [--seconds 3] [--eval]

Each round runs every side once, each in a fresh process whose ``beam_prep``
is that checkout's (the order reverses every round, so neither side always
goes first). A process measures, in turn, the decode limit (``decode_jpeg``
of the dataset's own JPEG bytes held in memory, as ``bench_reader``'s (c)) and
the reader (``make_dataset(DATASET, "train", batch_size=256, repeat=True)``,
as (a)), ``--pairs`` times, taking turns at going first, each on a fresh
iterator after a warm-up, with ``beam_prep.tools.throughput.time_batches`` of this
checkout. The ratio reader ÷ limit is taken within a pair, seconds apart.

Printed per side: medians over all pairs of images/s, images per CPU-second of
the process, both ratios, and how many cores other processes kept busy while
it was timed (the machine's busy CPU time less the process's own, per second),
and how many nobody used (above 0: the process waited rather than computed);
then the same over the pairs timed while the others kept fewer than
``--quiet`` cores busy. On a shared machine trust the per-CPU-second ratio
over the wall-clock one: under load the two halves of a pair get different
shares of the cores.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import pathlib
import statistics
import subprocess
import sys
from collections.abc import Sequence

HERE = pathlib.Path(__file__).resolve()
THROUGHPUT = HERE.parents[1] / "beam_prep" / "tools" / "throughput.py"  # this checkout's timing loop
BATCH_SIZE = 256
WARMUP_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class Side:
    name: str
    checkout: pathlib.Path


@dataclasses.dataclass(frozen=True)
class Timed:
    images_per_s: float
    images_per_cpu_s: float
    others_busy: float  # cores other processes kept busy meanwhile
    idle: float  # cores nobody used meanwhile: above 0, the process was waiting, not computing


# --------------------------------------------------------------------------- #
# Child: one process, one checkout
# --------------------------------------------------------------------------- #


def _time_batches():
    """``time_batches`` from this checkout's file: the side under test may predate it."""
    spec = importlib.util.spec_from_file_location("_reader_ab_throughput", THROUGHPUT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module.time_batches


def _timed(make, seconds: float, time_batches) -> Timed:
    import psutil

    def machine() -> tuple[float, float]:
        """The machine's (busy, idle) CPU seconds so far, every core."""
        t = psutil.cpu_times()
        idle = t.idle + getattr(t, "iowait", 0)
        return sum(t) - idle - getattr(t, "guest", 0) - getattr(t, "guest_nice", 0), idle

    it = iter(make())
    time_batches(it, WARMUP_SECONDS, 0.0)  # the warm-up, apart: the machine's counters skip it
    before = machine()
    images, wall, cpu = time_batches(it, seconds, 0.0)
    after = machine()
    del it
    others = max(0.0, (after[0] - before[0] - cpu) / wall)
    return Timed(images / wall, images / cpu, others, (after[1] - before[1]) / wall)


def child(dataset: str, seconds: float, pairs: int, training: bool) -> dict:
    import tensorflow as tf

    import beam_prep
    from beam_prep.reader import load_info, make_dataset
    try:
        from beam_prep.model import features
    except ImportError:  # a side from before the package was grouped into rooms
        from beam_prep import features

    time_batches = _time_batches()
    info = load_info(dataset)
    compression = "" if info.compression == "NONE" else info.compression
    spec = {features.ENCODED: tf.io.FixedLenFeature([], tf.string)}
    records = tf.data.TFRecordDataset(list(info.splits["train"].files), compression)
    encoded = tf.concat([tf.io.parse_example(s, spec)[features.ENCODED] for s in records.batch(1024)], 0)

    def limit():
        ds = tf.data.Dataset.from_tensor_slices(encoded).repeat()
        ds = ds.map(lambda e: tf.io.decode_jpeg(e, channels=3, dct_method="INTEGER_ACCURATE"),
                    num_parallel_calls=tf.data.AUTOTUNE)
        return ds.batch(BATCH_SIZE).prefetch(tf.data.AUTOTUNE)

    def reader():
        return make_dataset(dataset, "train", batch_size=BATCH_SIZE, training=training, repeat=True)

    out = []
    for i in range(pairs):
        pair = {}
        # Either goes first in turn: what runs after the other's iterator has gone is not always the reader.
        for name, make in [("limit", limit), ("reader", reader)][::1 if i % 2 == 0 else -1]:
            pair[name] = dataclasses.asdict(_timed(make, seconds, time_batches))
        out.append(pair)
    return {"beam_prep": beam_prep.__file__, "pairs": out}


# --------------------------------------------------------------------------- #
# Parent: rounds of alternating processes
# --------------------------------------------------------------------------- #


def run_side(side: Side, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": str(side.checkout), "TF_CPP_MIN_LOG_LEVEL": "2"}
    # Run by path from the checkout: sys.path[0] is this file's folder, so `beam_prep` is the side's.
    command = [sys.executable, str(HERE), "--child", args.dataset, "--seconds", str(args.seconds),
               "--pairs", str(args.pairs)] + (["--eval"] if args.eval else [])
    result = subprocess.run(command, cwd=side.checkout, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"side {side.name} failed:\n{result.stderr[-3000:]}")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    expected = (side.checkout / "beam_prep").resolve()
    if not pathlib.Path(report["beam_prep"]).resolve().is_relative_to(expected):
        raise SystemExit(f"side {side.name} imported {report['beam_prep']}, not {side.checkout}'s beam_prep")
    return report


def summary(pairs: list[dict]) -> dict[str, float]:
    def med(f) -> float:
        return statistics.median(f(p) for p in pairs)

    return {
        "reader_images_per_s": med(lambda p: p["reader"]["images_per_s"]),
        "reader_images_per_cpu_s": med(lambda p: p["reader"]["images_per_cpu_s"]),
        "limit_images_per_s": med(lambda p: p["limit"]["images_per_s"]),
        "limit_images_per_cpu_s": med(lambda p: p["limit"]["images_per_cpu_s"]),
        "ratio_wall": med(lambda p: p["reader"]["images_per_s"] / p["limit"]["images_per_s"]),
        "ratio_cpu": med(lambda p: p["reader"]["images_per_cpu_s"] / p["limit"]["images_per_cpu_s"]),
        "others_busy": med(lambda p: (p["reader"]["others_busy"] + p["limit"]["others_busy"]) / 2),
        "reader_idle": med(lambda p: p["reader"]["idle"]),
        "limit_idle": med(lambda p: p["limit"]["idle"]),
    }


def _quiet(pairs: list[dict], cores: float) -> list[dict]:
    """The pairs during both halves of which other processes kept fewer than ``cores`` busy."""
    return [p for p in pairs if max(p["reader"]["others_busy"], p["limit"]["others_busy"]) < cores]


def table(results: dict[str, list[dict]], quiet: float) -> str:
    lines = ["| side | reader images/s | reader images/CPU-s | limit images/s | limit images/CPU-s "
             "| reader ÷ limit | per CPU-s | others' cores busy | idle cores: reader, limit |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rows = [(name, pairs) for name, pairs in results.items()]
    rows += [(f"{name}, the {len(q)} of {len(pairs)} pairs with others < {quiet:g} cores", q)
             for name, pairs in results.items() if (q := _quiet(pairs, quiet))]
    for name, pairs in rows:
        s = summary(pairs)
        lines.append(f"| {name} | {s['reader_images_per_s']:,.0f} | {s['reader_images_per_cpu_s']:,.0f} "
                     f"| {s['limit_images_per_s']:,.0f} | {s['limit_images_per_cpu_s']:,.0f} "
                     f"| {s['ratio_wall']:.2f} | {s['ratio_cpu']:.2f} | {s['others_busy']:.1f} "
                     f"| {s['reader_idle']:.2f}, {s['limit_idle']:.2f} |")
    return "\n".join(lines)


def _side(text: str) -> Side:
    name, sep, path = text.partition("=")
    checkout = pathlib.Path(path).resolve()
    if not sep or not (checkout / "beam_prep").is_dir():
        raise argparse.ArgumentTypeError(f"--side NAME=CHECKOUT, a folder holding beam_prep/, not {text!r}")
    return Side(name, checkout)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="a dataset folder written by beam-prep (JPEG), read by every side")
    parser.add_argument("--side", type=_side, action="append", default=[],
                        help="NAME=CHECKOUT (repeat; two or more)")
    parser.add_argument("--rounds", type=int, default=6, help="processes per side")
    parser.add_argument("--pairs", type=int, default=2, help="limit-then-reader pairs per process")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per measurement")
    parser.add_argument("--eval", action="store_true", help="the evaluation order (training=False)")
    parser.add_argument("--quiet", type=float, default=0.3,
                        help="also summarise the pairs timed while other processes kept fewer cores busy")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="also write every pair here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.child and len(args.side) < 2:
        parser.error("give two or more --side NAME=CHECKOUT")
    args.dataset = str(pathlib.Path(args.dataset).resolve())
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse_args(argv)
    if args.child:
        print(json.dumps(child(args.dataset, args.seconds, args.pairs, training=not args.eval)))
        return
    results: dict[str, list[dict]] = {side.name: [] for side in args.side}
    for round_ in range(args.rounds):
        order = args.side if round_ % 2 == 0 else args.side[::-1]
        for side in order:
            pairs = run_side(side, args)["pairs"]
            results[side.name].extend(pairs)
            s = summary(pairs)
            print(f"round {round_ + 1} {side.name}: reader {s['reader_images_per_s']:,.0f} images/s, "
                  f"{s['reader_images_per_cpu_s']:,.0f}/CPU-s; ÷ limit {s['ratio_wall']:.2f} "
                  f"({s['ratio_cpu']:.2f} per CPU-s); others {s['others_busy']:.1f} cores; "
                  f"idle {s['reader_idle']:.2f}, {s['limit_idle']:.2f}", flush=True)
    print()
    print(f"{args.dataset}, {'evaluation' if args.eval else 'training'} order, batch {BATCH_SIZE}; "
          f"medians of {args.rounds} processes x {args.pairs} pairs of {args.seconds:g} s")
    print(table(results, args.quiet))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
