"""``beam-prep``: the command setup.py installs, one subcommand a module.

    beam-prep prepare --input ROOT --output OUT [options]   # python -m pipelines.prepare_images
    beam-prep inspect OUT                                   # python -m pipelines.inspect_output
    beam-prep verify OUT                                    # python -m pipelines.verify_output
    beam-prep bench OUT                                     # python -m pipelines.bench_reader

Each subcommand's module has ``main(argv) -> int`` and runs alone with
``python -m``. They are imported only when named, so ``beam-prep inspect``
does not pay for Beam's import, nor ``beam-prep prepare`` for TensorFlow's.
"""
from __future__ import annotations

import importlib
import sys
from typing import Sequence

# How every command shows log records on the console.
CONSOLE_FORMAT = "%(levelname)s %(name)s: %(message)s"

# name -> (module, one-line purpose), in the order a user meets them.
COMMANDS: dict[str, tuple[str, str]] = {
    "prepare": ("pipelines.prepare_images", "turn ROOT/<label>/<image> into sharded TFRecords in OUT"),
    "inspect": ("pipelines.inspect_output", "summarise OUT (splits, shards, classes, failures); --grid draws a contact sheet"),
    "verify": ("pipelines.verify_output", "read every record of OUT and check it against its manifest"),
    "bench": ("pipelines.bench_reader", "time the tf.data reader on OUT: images/s, to size an input pipeline"),
}


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: beam-prep COMMAND [options]   (beam-prep COMMAND --help for its options)", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {purpose}" for name, (_, purpose) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return 0
    if not argv or argv[0] not in COMMANDS:
        if argv:
            print(f"error: unknown command {argv[0]!r}; one of: {', '.join(COMMANDS)}", file=sys.stderr)
        print(usage(), file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
