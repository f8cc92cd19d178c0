"""One HTML page of a prepared dataset, to look at or send: ``beam-prep report OUT``.

    python -m pipelines.report_output OUT [--to PAGE.html] [--per-class 6] [--max-mb 20]

Writes ``OUT/report.html`` (or ``--to``): the overview, class balance, a gallery decoded from the
shards, duplicates and leaks across splits, failures and skipped files, the source images' sizes.
Exit codes: 0 written, 2 bad options, an output folder that is not a finished dataset (a damaged
manifest included) or a report.html there that beam-prep did not write, 1 the page could not be
written, or was written with a section incomplete (each named on stderr).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from beam_prep.errors import BeamPrepError, DatasetError, UnsafeName
from beam_prep.wording import for_terminal
from pipelines.cli import CommandParser, console_logging
from pipelines.inspect_output import _positive
from pipelines.native_log import native_log_to_file
from pipelines.tensorflow_import import import_tensorflow

EPILOG = """\
examples:
  beam-prep report records                       # writes records/report.html
  beam-prep report gs://bucket/records --to report.html

The page holds everything (pictures as data: URIs, no script, no fonts or styles from elsewhere):
open it in a browser, mail it, attach it to a review. Counts are exact; pictures and file names are
capped (--per-class, --max-mb), and the page says where. OUT/report.html is the dataset's: a later
prepare --overwrite or --append takes it away; a report.html there that beam-prep did not write is
left as it is (exit 2: use --to).
"""


def parser() -> argparse.ArgumentParser:
    from beam_prep.tools.report.gather import Limits

    defaults = Limits()
    p = CommandParser(
        prog="beam-prep report",
        description="Write one self-contained HTML page of a beam-prep output folder (local or gs://).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("output", metavar="OUT", help="the output folder of a beam-prep run (holds manifest.json)")
    p.add_argument("--to", metavar="PAGE.html", help="where to write the page (local or gs://; default OUT/report.html)")
    p.add_argument("--per-class", dest="per_class", type=_positive, default=defaults.per_class, metavar="N",
                   help=f"gallery images per class (default {defaults.per_class}; fewer for many classes, "
                        f"{defaults.max_gallery} in all)")
    p.add_argument("--max-mb", dest="max_mb", type=_positive, default=defaults.max_bytes >> 20, metavar="MB",
                   help=f"the pictures' size in the page at most, in MiB (default {defaults.max_bytes >> 20})")
    return p


@native_log_to_file
def main(argv: Sequence[str] | None = None) -> int:
    console_logging()
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    import_tensorflow()  # the gallery decodes records as the reader does

    from beam_prep.tools.report import Limits, make_report
    from beam_prep.wording import count

    try:
        report = make_report(args.output, args.to, Limits(per_class=args.per_class, max_bytes=args.max_mb << 20))
    except (UnsafeName, DatasetError) as e:
        print(f"error: {for_terminal(str(e), one_line=True)}", file=sys.stderr)
        return 2
    except BeamPrepError as e:
        print(f"error: {for_terminal(str(e), one_line=True)}", file=sys.stderr)
        return 1
    shown = sum(len(images) for images in report.data.gallery.images)
    print(f"report: {report.path} ({report.size / (1 << 20):.1f} MiB, {count(shown, 'image')} in the gallery)")
    for section, why in report.data.notes:
        print(f"warning: {section}: {for_terminal(why, one_line=True)}", file=sys.stderr)
    return 1 if any(why.startswith("incomplete") for _, why in report.data.notes) else 0


if __name__ == "__main__":
    sys.exit(main())
