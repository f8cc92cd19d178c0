"""Which command-line flags exist, so a misspelled one fails before any work.

Beam parses each options class on its own and drops flags no class defines with
only a warning ("Discarding unparseable args"): ``--image_sise 64`` would run a
whole job at the default size. Here every flag of every ``PipelineOptions``
subclass (Beam's and ours) is put in one parser, as Beam's ``get_all_options``
does, and whatever that parser does not know is an error. ``--image-size`` is
``--image_size`` (``spelled_as_known``), as in the other commands.
"""
from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import NoReturn

from apache_beam.options.pipeline_options import PipelineOptions

from beam_prep.cli.spelling import (
    PATH_FLAGS,
    flag_value,
    known_spelling,
    nearest_flag,
    positionals_message,
    unknown_flags_message,
)
from beam_prep.errors import OptionsError
from beam_prep.write.plan.runners import LOCAL_WORKERS_FLAG, REMOTE_WORKER_FLAGS, check_runner, is_local_runner
from beam_prep.write.run.beam_compat import BeamArgumentParser, add_options_arguments

__all__ = ["PATH_FLAGS", "all_options_parser", "bare_flags", "check_flags", "check_positionals", "known_flags",
           "nearest_flag", "option_classes", "positional_arguments", "spelled_as_known", "unknown_flags"]

# argparse reads "-5" as a value, not a flag, when no flag looks like a number.
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
_HELP = ("-h", "--help")


class _RaisingParser(BeamArgumentParser):
    """Beam's parser (options classes call its ``add_value_provider_argument``), but where
    argparse would exit the process on a bad value, the library raises instead."""

    def error(self, message: str) -> NoReturn:
        raise OptionsError(message)


def option_classes() -> list[type[PipelineOptions]]:
    """Every options class defined so far, subclasses of subclasses too, each once."""
    found: list[type[PipelineOptions]] = []
    pending = list(PipelineOptions.__subclasses__())
    while pending:
        cls = pending.pop(0)
        if cls not in found:
            found.append(cls)
            pending.extend(cls.__subclasses__())
    return found


def all_options_parser() -> argparse.ArgumentParser:
    """One parser with every class's flags, like Beam's own (no abbreviations either).

    ``--help`` is left to Beam, so it behaves as it always has. A flag that two
    classes define is taken once: only its name matters here.
    """
    parser = _RaisingParser(allow_abbrev=False, add_help=False, conflict_handler="resolve")
    for cls in option_classes():
        add_options_arguments(cls, parser)
    return parser


def known_flags(parser: argparse.ArgumentParser | None = None) -> list[str]:
    """Every ``--flag`` name the command line accepts."""
    parser = parser or all_options_parser()
    names = {name for action in parser._actions for name in action.option_strings}
    return sorted(name for name in names if name.startswith("--"))


def unknown_flags(argv: Sequence[str]) -> list[str]:
    """The flags in ``argv`` no options class defines, by name (``--x=1`` gives ``--x``).

    Values are not flags: the ``64`` of ``--image-size 64`` is skipped, and so is
    everything after ``--``.

    Raises:
      OptionsError: when a known flag has a bad value (``--channels three``).
    """
    _, extras = all_options_parser().parse_known_args(list(argv))
    unknown: list[str] = []
    for token in extras:
        if token == "--":
            break
        if not token.startswith("-") or token == "-" or _NEGATIVE_NUMBER.match(token):
            continue
        name = token.split("=", 1)[0]
        if name not in _HELP and name not in unknown:
            unknown.append(name)
    return unknown


def bare_flags(parser: argparse.ArgumentParser | None = None) -> list[str]:
    """The flags that take no value (``--overwrite``): ``prepare(overwrite=True)`` gives them."""
    parser = parser or all_options_parser()
    return sorted(name for action in parser._actions if action.nargs == 0
                  for name in action.option_strings if name.startswith("--"))


def spelled_as_known(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--image-size`` written ``--image_size``: both spellings of every flag work."""
    return known_spelling(argv, known_flags())


def check_flags(argv: Sequence[str]) -> None:
    """Refuses flags that no options class defines, naming each and its nearest known flag.

    Raises:
      OptionsError: if any flag is unknown, or a known flag's value is malformed.
    """
    unknown = unknown_flags(argv)
    if not unknown:
        return
    known = known_flags()
    guesses = None
    if _runs_locally(argv):
        # A local run ignores Dataflow's worker counts: the flag that works is the direct runner's.
        guesses = {flag: LOCAL_WORKERS_FLAG for flag in unknown
                   if nearest_flag(flag, known) in REMOTE_WORKER_FLAGS
                   or (nearest_flag(flag, known) is None and "worker" in flag.lower())}
    raise OptionsError(unknown_flags_message(unknown, known, guesses))


def _runs_locally(argv: Sequence[str]) -> bool:
    """Whether ``argv``'s ``--runner`` (any spelling Beam takes) runs on this machine; a bad one does not."""
    try:
        return is_local_runner(check_runner(flag_value(argv, "--runner")))
    except OptionsError:
        return False


def positional_arguments(argv: Sequence[str]) -> list[str]:
    """The arguments in ``argv`` that no flag takes as its value (before ``--``): ``tree`` and
    ``out`` of ``prepare tree out``, or of ``--overwrite tree out``. Every option of prepare is a
    flag, and Beam drops what it cannot parse, so such an argument would be lost unsaid."""
    _, extras = all_options_parser().parse_known_args(list(argv))
    found: list[str] = []
    for token in extras:
        if token == "--":
            break
        if token == "-" or not token.startswith("-"):
            found.append(token)
    return found


def check_positionals(argv: Sequence[str]) -> None:
    """Refuses arguments given without a flag, with the command they most likely meant.

    Call it after ``check_flags``: the value of an unknown flag would look positional.

    Raises:
      OptionsError: ``did you mean --input tree --output out?`` for ``prepare tree out``
        (the path flags not given take the values, in order), or the unexpected
        arguments named where there are more than path flags missing.
    """
    values = positional_arguments(argv)
    if not values:
        return
    given = {token.split("=", 1)[0] for token in argv}
    missing = [flag for flag in PATH_FLAGS if flag not in given]
    raise OptionsError(positionals_message(values, missing, PATH_FLAGS))
