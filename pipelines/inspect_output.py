"""Look at a prepared output folder before training: ``beam-prep inspect OUT``.

    python -m pipelines.inspect_output OUT [--json] [--grid SHEET.png [--per-class 8] [--split train] [--classes A,B]]

Prints a table of the splits, shards, classes (with the imbalance ratio),
image spec and failures; ``--json`` prints the same as one JSON object.
``--grid`` also draws a contact sheet PNG of images decoded from the shards,
a row per class. Exit codes: 0 done, 2 bad options or an output folder that
is missing or not a finished dataset (a manifest or duplicates.jsonl naming a
file outside its folder included; a run interrupted there is named, with the
command that resumes it), 1 a shard the manifest lists is missing
or the contact sheet could not be made or written.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from beam_prep.errors import BeamPrepError, UnsafeName
from beam_prep.io.storage import is_local
from beam_prep.wording import for_terminal
from pipelines.cli import CommandParser, console_logging
from pipelines.native_log import native_log_to_file
from pipelines.tensorflow_import import import_tensorflow

EPILOG = """\
examples:
  beam-prep inspect records
  beam-prep inspect gs://bucket/records --json > summary.json
  beam-prep inspect records --grid sheet.png --per-class 8 --split validation

The imbalance ratio is the largest class's count divided by the smallest's
(1.00: balanced). The contact sheet's images are decoded from the shards with
the reader's own decoding, so they are what training gets; each row is
captioned with the label name and the id stored in the records.
"""


def parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog="beam-prep inspect",
        description="Summarise a beam-prep output folder (local or gs://): splits, shards, classes,\n"
                    "image spec and failures; optionally draw a contact sheet of its records.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("output", metavar="OUT", help="the output folder of a beam-prep run (holds manifest.json)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object instead of a table")
    p.add_argument("--max-classes", dest="max_classes", type=_positive, metavar="N",
                   help="show only the N largest and N smallest classes in the table (default: all)")
    leaks = p.add_argument_group("leakage")
    leaks.add_argument("--leakage", metavar="SHEET.png",
                       help="write a PNG of the groups of copies or near copies under different labels, then the "
                            "closest across splits (duplicates.jsonl): a row per group, its source files side by "
                            "side with their splits and labels")
    leaks.add_argument("--leakage-groups", dest="leakage_groups", type=_positive, default=8, metavar="N",
                       help="groups on the leakage sheet (default 8)")
    grid = p.add_argument_group("contact sheet")
    grid.add_argument("--grid", metavar="SHEET.png",
                      help="write a PNG contact sheet (local path or gs://): a row per class")
    grid.add_argument("--per-class", dest="per_class", type=_positive, default=8, metavar="N",
                      help="images per class on the sheet (default: 8)")
    grid.add_argument("--split", help="the split the sheet's images come from (default: train, "
                      "or the first split when there is no train)")
    grid.add_argument("--classes", type=_names, metavar="NAME,NAME",
                      help="draw these classes' rows alone, in label order (default: every class)")
    grid.add_argument("--cell", type=_positive, metavar="PX",
                      help="side of each image's cell in pixels; larger images are shrunk to fit "
                      "(default: the largest image shown, up to 256: pixel for pixel)")
    return p


def _interrupted(output: str) -> str | None:
    """What a folder holding an interrupted run (no manifest yet) is, and the command that resumes it."""
    from beam_prep.reader.manifest_file import normalise_root
    from beam_prep.write.journal.interrupted import find_interrupted

    if not is_local(output) or os.path.exists(os.path.join(output, "manifest.json")):
        return None
    run = find_interrupted(normalise_root(output))
    return run.describe(normalise_root(output)) if run is not None else None


def _names(text: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    if not names:
        raise argparse.ArgumentTypeError(f"a comma-separated list of label names, not {text!r}")
    return names


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


@native_log_to_file
def main(argv: Sequence[str] | None = None) -> int:
    console_logging()
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.grid or not is_local(args.output):  # a contact sheet decodes records; gs:// reads through tf.io.gfile
        import_tensorflow()

    from beam_prep.tools import contact_sheet, inspection
    from beam_prep.tools.summary import summarize

    try:
        summary = summarize(args.output)
    except BeamPrepError as e:
        print(f"error: {_interrupted(args.output) or e}", file=sys.stderr)
        return 2
    splits = summary.info.splits
    split = args.split or ("train" if "train" in splits or not splits else next(iter(splits)))
    if args.grid and split not in splits:
        print(f"error: {summary.root} has no split {split!r}; its splits: {', '.join(splits) or 'none'}",
              file=sys.stderr)
        return 2
    if args.grid and args.classes:
        try:
            contact_sheet.row_indices(summary.info, args.classes)
        except BeamPrepError as e:
            print(f"error: --classes: {e}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(inspection.to_json(summary), indent=2, ensure_ascii=False))
    else:
        print(for_terminal(inspection.render_text(summary, args.max_classes)), end="")
    status = 0
    if summary.missing_shards:
        print(f"error: {len(summary.missing_shards)} shards the manifest lists are missing from "
              f"{summary.root}: the dataset is incomplete", file=sys.stderr)
        status = 1
    if args.leakage:
        from beam_prep.tools import leakage_sheet
        from beam_prep.wording import count
        try:
            leaks = leakage_sheet.make_leakage_sheet(summary.root, args.leakage_groups)
            if leaks is not None:
                leakage_sheet.save(leaks, args.leakage)
        except UnsafeName as e:  # bad data, refused before any image is opened or the sheet written
            print(f"error: {e}", file=sys.stderr)
            return 2
        except BeamPrepError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"leakage sheet: {args.leakage} ({count(len(leaks.rows), 'group')} across splits or labels)"
              if leaks is not None else "leakage sheet: no group of copies across splits or labels, none written",
              file=sys.stderr if args.json else sys.stdout)
    if args.grid:
        try:
            sheet = contact_sheet.make_contact_sheet(summary.info, split, args.per_class, args.cell,
                                                     args.classes)
            contact_sheet.save(sheet, args.grid)
        except BeamPrepError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        shown = sum(len(row.boxes) for row in sheet.rows)
        print(f"contact sheet: {args.grid} ({shown} images of {len(sheet.rows)} classes from {split}, "
              f"{sheet.image.width}x{sheet.image.height} px)", file=sys.stderr if args.json else sys.stdout)
    return status

if __name__ == "__main__":
    sys.exit(main())
