"""``python -m benchmarks.report [--check]``: renders docs/performance/ and every page's figure markers.

Without ``--check`` it writes the pages that differ from a render; with it,
it writes nothing and exits 1 naming every page that differs.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence

from benchmarks import REPO_ROOT
from benchmarks.report import figures, render


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page differs from a render")
    parser.add_argument("--results", type=pathlib.Path, help="the results folder (default docs/performance/results)")
    parser.add_argument("--root", type=pathlib.Path, default=REPO_ROOT, help="the repository (default this one)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        expected = render.expected_files(root, args.results)
    except (render.ReportError, figures.FigureError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    changed = render.differing(root, expected)
    if args.check:
        for path in changed:
            print(f"{path.relative_to(root)} differs from a render: run python -m benchmarks.report", file=sys.stderr)
        return 1 if changed else 0
    for path in changed:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(expected[path])
        print(f"wrote {path.relative_to(root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
