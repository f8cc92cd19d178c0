"""``beam-prep``: the command setup.py installs, one subcommand a module.

    beam-prep prepare --input ROOT --output OUT [options]   # python -m pipelines.prepare_images
    beam-prep inspect OUT                                   # python -m pipelines.inspect_output
    beam-prep verify OUT                                    # python -m pipelines.verify_output
    beam-prep bench OUT                                     # python -m pipelines.bench_reader
    beam-prep report OUT                                    # python -m pipelines.report_output

Each subcommand's module has ``main(argv) -> int`` and runs alone with
``python -m``. They are imported only when named, so ``beam-prep inspect``
does not pay for Beam's import, nor ``beam-prep prepare`` for TensorFlow's.

What every command shows is decided here: its result on stdout; on stderr,
``error: ...`` for what stopped it and ``warning: ...`` for what a user should
look at (``console_logging``). beam-prep's INFO records go to a failed job's
log file, or to stderr with ``prepare --verbose``.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import beam_prep
from beam_prep.cli.spelling import PATH_FLAGS, as_positional_message, known_spelling, unknown_flags_message
from beam_prep.doc_pages import doc_page
from beam_prep.errors import BeamPrepWarning

VERSION = f"beam-prep {beam_prep.__version__}"
VERSION_FLAG = "--version"

# name -> (module, one-line purpose), in the order a user meets them.
COMMANDS: dict[str, tuple[str, str]] = {
    "prepare": ("pipelines.prepare_images", "turn ROOT/<label>/<image> into sharded TFRecords in OUT"),
    "inspect": ("pipelines.inspect_output", "summarise OUT (splits, shards, classes, failures); --grid draws a contact sheet"),
    "verify": ("pipelines.verify_output", "read every record of OUT and check it against its manifest"),
    "bench": ("pipelines.bench_reader", "time the tf.data reader on OUT: images/s, to size an input pipeline"),
    "report": ("pipelines.report_output", "write OUT/report.html: one self-contained page of the dataset to look at"),
}


class ConsoleFormatter(logging.Formatter):
    """``warning: <message>``, as the commands' own ``error:`` lines: a person reads it, so no
    logger names or times (a log file has those)."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {super().format(record)}"


class _ConsoleHandler(logging.StreamHandler):
    """The one handler ``console_logging`` installs (a second call replaces it)."""


def console_logging(verbose: bool = False) -> None:
    """Warnings and errors on stderr as ``warning: ...`` (beam-prep's INFO records too with
    ``verbose``); a ``BeamPrepWarning`` (``warnings.warn``) is shown the same way."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _ConsoleHandler)]:
        root.removeHandler(old)
    handler = _ConsoleHandler(sys.stderr)
    handler.setFormatter(ConsoleFormatter())
    handler.setLevel(logging.INFO if verbose else logging.WARNING)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("beam_prep").setLevel(logging.INFO)  # kept in a job's log file
    if not getattr(warnings.showwarning, "shows_ours", False):
        warnings.showwarning = _show_ours_as_logged(warnings.showwarning)


def _show_ours_as_logged(shown_before: Callable[..., None]) -> Callable[..., None]:
    def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        if issubclass(category, BeamPrepWarning):
            logging.getLogger("beam_prep").warning("%s", message)
        else:
            shown_before(message, category, filename, lineno, file, line)

    show.shows_ours = True  # type: ignore[attr-defined]
    return show


class CommandParser(argparse.ArgumentParser):
    """The parser of ``inspect``, ``verify`` and ``bench``: every flag in both spellings
    (``--max-per-kind``, ``--max_per_kind``), an unknown one named with the nearest known
    one as ``prepare`` names it, a usage error as one ``error:`` line and exit code 2, and
    ``--version``."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # as prepare: --max_per_kin is a typo, not --max_per_kind
        super().__init__(**kwargs)
        self.add_argument(VERSION_FLAG, action="version", version=VERSION, help="print the version and exit")

    def _flags(self) -> list[str]:
        return sorted(name for action in self._actions for name in action.option_strings if name.startswith("--"))

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        argv = known_spelling(list(sys.argv[1:] if args is None else args), self._flags())
        hint = self._as_positional(argv)
        if hint:  # before parsing, which would only say that OUT is missing
            self.error(hint)
        parsed, extras = self.parse_known_args(argv, namespace)
        unknown = [token.split("=", 1)[0] for token in extras if token.startswith("-") and token != "-"]
        if unknown:
            self.error(unknown_flags_message(unknown, self._flags()))
        if extras:
            self.error(f"unexpected argument{'s' if len(extras) > 1 else ''}: {' '.join(extras)}")
        return parsed

    def _as_positional(self, argv: Sequence[str]) -> str | None:
        """``--output out`` where the folder is positional (and no such flag is declared): the
        command meant, or None."""
        positional = [action for action in self._actions if not action.option_strings]
        if len(positional) != 1 or any(flag in self._flags() for flag in PATH_FLAGS):
            return None
        return as_positional_message(self.prog, argv, positional[0].metavar or positional[0].dest)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} ({self.prog} --help lists its options)\n")


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: beam-prep COMMAND [options]   (beam-prep COMMAND --help for its options)", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {purpose}" for name, (_, purpose) in COMMANDS.items()]
    lines += ["", f"{VERSION_FLAG} prints the version ({VERSION}). Getting started: "
              f"{doc_page('guides/getting-started.md')}; every flag: {doc_page('reference/cli.md')}."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command ``argv`` names, ``sys.argv[1:]`` by default; returns its exit code.

    Called without ``argv`` (the ``beam-prep`` script, ``python -m pipelines.cli``), the
    process is the command's own: ``prepare`` imports Beam without what a run never uses and
    forks its first workers from it (``beam_prep.cli.early``). Given ``argv``, it runs in a
    caller's process, which it leaves as it found it: Beam imported whole, as
    ``beam_prep.prepare`` does, and no fork of the caller.
    """
    own_process = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return 0
    if argv[:1] == [VERSION_FLAG]:
        print(VERSION)
        return 0
    if not argv or argv[0] not in COMMANDS:
        if argv:
            print(f"error: unknown command {argv[0]!r}; one of: {', '.join(COMMANDS)}", file=sys.stderr)
        print(usage(), file=sys.stderr)
        return 2
    if argv[0] == "prepare" and own_process:  # Beam imported, then the run's first workers forked with it
        from beam_prep.cli.early import import_beam_then_start_workers
        import_beam_then_start_workers(argv[1:])
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
