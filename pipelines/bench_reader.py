"""Reader throughput on a prepared dataset: ``python -m pipelines.bench_reader OUT``.

    python -m pipelines.bench_reader OUT [--split train] [--batch_size 256] [--seconds 10] [--eval]
    beam-prep bench OUT

Times ``make_dataset`` (decoded uint8 batches, training order unless
``--eval``) on this machine, with a progress bar on stderr, and prints the
images per second: what one host's input pipeline can feed an accelerator.
An array_record or webdataset dataset is timed with its own reader, in one
process (``data_source``, ``webdataset.WebDataset``).
See :mod:`beam_prep.tools.throughput`. (``benchmarks/bench_reader.py`` compares
readers on a corpus of its own; this measures one dataset.)

Exit codes: 0 measured, 2 bad usage, no dataset at OUT or no such split.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from beam_prep.errors import BeamPrepError
from beam_prep.tools.throughput import Throughput, measure_reader
from pipelines.cli import CommandParser, console_logging
from pipelines.native_log import native_log_to_file
from pipelines.progress_display import bar
from pipelines.tensorflow_import import import_tensorflow


def parser() -> CommandParser:
    """The command's flags: what it parses, and what its --help and the site's reference show."""
    p = CommandParser(
        prog="beam-prep bench", description="Time the reader of a beam-prep dataset's format (make_dataset, "
        "data_source or webdataset.WebDataset): decoded images per second on this machine.")
    p.add_argument("output", metavar="OUT", help="the dataset folder (local or gs://)")
    p.add_argument("--split", default="train", help="the split to read (default train)")
    p.add_argument("--batch_size", type=int, default=256, help="images per batch (default 256)")
    p.add_argument("--seconds", type=float, default=10.0,
                   help="how long to time, after a warm-up (default 10)")
    p.add_argument("--warmup_seconds", type=float, default=1.0,
                   help="read untimed first: shuffle buffer, prefetch (default 1)")
    p.add_argument("--eval", action="store_true",
                   help="the evaluation order (fixed, no shuffle) instead of training's")
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.batch_size < 1:
        p.error(f"--batch_size must be at least 1, not {args.batch_size}")
    if args.seconds <= 0 or args.warmup_seconds < 0:
        p.error("--seconds must be positive and --warmup_seconds not negative")
    return args


def describe(result: Throughput) -> str:
    order = "training order" if result.training else "evaluation order"
    return (f"{result.images_per_second:,.0f} images/s reading split {result.split!r} of {result.path} "
            f"({result.images:,} images in {result.seconds:.1f} s, batch {result.batch_size}, {order}; "
            f"{result.images_per_cpu_second:,.0f} images per CPU-second)")


@native_log_to_file
def main(argv: Sequence[str] | None = None) -> int:
    console_logging()
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    import_tensorflow()  # it times make_dataset
    # On stderr, and only on a terminal (disable=None): a log or a pipe gets the result line alone.
    with bar(sys.stderr, unit="img", desc="bench", disable=None) as progress_bar:
        timing = False

        def progress(images: int) -> None:
            nonlocal timing
            if not timing:  # the bar's clock starts with the timed batches, as the measurement does
                progress_bar.reset()
                timing = True
            progress_bar.update(images)

        try:
            result = measure_reader(args.output, args.split, batch_size=args.batch_size,
                                    training=not args.eval, seconds=args.seconds,
                                    warmup_seconds=args.warmup_seconds, progress=progress)
        except BeamPrepError as e:
            progress_bar.close()
            print(f"error: {e}", file=sys.stderr)
            return 2
    print(describe(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
