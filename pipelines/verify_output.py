"""Check every record of a prepared dataset against its manifest: ``python -m pipelines.verify_output OUT``.

    python -m pipelines.verify_output OUT [--workers N] [--max_per_kind N]
    beam-prep verify OUT

Reads every shard (several at once) with a progress bar on stderr, and lists
what is wrong: shards missing, extra or damaged (by file), records that do not
decode to the manifest's shape or whose label id is out of range or disagrees
with its text (by file, record index and source file), counts per shard, split
and class that differ from the manifest. See :mod:`beam_prep.tools.verification`.

Exit codes: 0 the dataset is as its manifest says, 1 problems found (listed on
stdout), 2 bad usage or no dataset at OUT.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from beam_prep.errors import BeamPrepError
from beam_prep.tools.verification import verify
from beam_prep.tools.verify_report import MAX_PER_KIND, VerifyReport
from beam_prep.wording import for_terminal
from pipelines.cli import CommandParser, console_logging
from pipelines.native_log import native_log_to_file
from pipelines.progress_display import bar
from pipelines.tensorflow_import import import_tensorflow


def parser() -> CommandParser:
    """The command's flags: what it parses, and what its --help and the site's reference show."""
    p = CommandParser(
        prog="beam-prep verify", description="Read every record of a beam-prep dataset and check it "
        "against its manifest. Exit 0: verified; 1: problems (listed); 2: bad usage or no dataset.")
    p.add_argument("output", metavar="OUT", help="the dataset folder (local or gs://)")
    p.add_argument("--workers", type=int, default=None,
                   help="shards read at once (default: the core count, at least 2)")
    p.add_argument("--max_per_kind", type=int, default=MAX_PER_KIND,
                   help=f"problems listed per kind; the rest are counted (default {MAX_PER_KIND})")
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        p.error(f"--workers must be at least 1, not {args.workers}")
    if args.max_per_kind < 1:
        p.error(f"--max_per_kind must be at least 1, not {args.max_per_kind}")
    return args


def describe(report: VerifyReport) -> str:
    """The report as the command prints it: one line when verified, else a line per problem."""
    rate = f"{report.records:,} records in {report.shards} shards, {report.seconds:.1f} s " \
           f"({report.records_per_second:,.0f} records/s)"
    if report.ok:
        return f"verified {report.root}: {rate}; every record decodes and agrees with the manifest"
    lines = [f"{report.num_problems} problem{'s' if report.num_problems != 1 else ''} in {report.root} "
             f"({rate}; the manifest lists {report.expected_records:,} records):"]
    lines += [f"  {problem.kind}: {problem}" for problem in report.problems]
    lines += [f"  ... and {n} more {kind} problem{'s' if n != 1 else ''}" for kind, n in report.more.items()]
    return "\n".join(lines)


@native_log_to_file
def main(argv: Sequence[str] | None = None) -> int:
    console_logging()
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    import_tensorflow()  # it reads every record with tf.data
    try:
        from beam_prep.reader.sources import load_info

        total = sum(s.num_examples for s in load_info(args.output).splits.values())
    except BeamPrepError:
        total = None  # verify() says what is wrong
    # On stderr, and only on a terminal (disable=None): logs and pipes get the report alone.
    with bar(sys.stderr, total=total, unit="img", desc="verify", disable=None) as progress_bar:
        try:
            report = verify(args.output, workers=args.workers, max_per_kind=args.max_per_kind,
                            progress=progress_bar.update)
        except BeamPrepError as e:
            progress_bar.close()
            print(f"error: {e}", file=sys.stderr)
            return 2
    print(for_terminal(describe(report)))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
