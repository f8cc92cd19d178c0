"""Make a small sample image tree: ``python -m pipelines.make_sample DIR [--per_label N]``."""
from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence

from beam_prep.tools.sample import make_sample_tree


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("root", type=pathlib.Path, help="Folder to create the tree in.")
    parser.add_argument("--per_label", type=int, default=40, help="Images per label.")
    args = parser.parse_args(argv)
    count = make_sample_tree(args.root, args.per_label)
    print(f"wrote {count} image files under {args.root} (one of them broken on purpose)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
