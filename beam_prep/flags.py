"""Which command-line flags exist, so a misspelled one fails before any work.

Beam parses each options class on its own and drops flags no class defines with
only a warning ("Discarding unparseable args"): ``--image-size 64`` would run a
whole job at the default size. Here every flag of every ``PipelineOptions``
subclass (Beam's and ours) is put in one parser, as Beam's ``get_all_options``
does, and whatever that parser does not know is an error.
"""
from __future__ import annotations

import argparse
import difflib
import re
from typing import NoReturn, Sequence

from apache_beam.options.pipeline_options import PipelineOptions

from beam_prep.beam_compat import BeamArgumentParser, add_options_arguments
from beam_prep.errors import OptionsError

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
    names = {name for action in parser._actions for name in action.option_strings}  # noqa: SLF001
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


def _key(flag: str) -> str:
    """``--image-size`` and ``--Image_Size`` are both ``image_size`` to compare."""
    return flag.lstrip("-").replace("-", "_").lower()


def nearest_flag(flag: str, known: Sequence[str]) -> str | None:
    """The known flag closest to ``flag``, treating ``-`` and ``_`` alike; None if none is close."""
    by_key = {_key(k): k for k in known}
    match = difflib.get_close_matches(_key(flag), list(by_key), n=1)
    return by_key[match[0]] if match else None


def check_flags(argv: Sequence[str]) -> None:
    """Refuses flags that no options class defines, naming each and its nearest known flag.

    Raises:
      OptionsError: if any flag is unknown, or a known flag's value is malformed.
    """
    unknown = unknown_flags(argv)
    if not unknown:
        return
    known = known_flags()
    described = []
    for flag in unknown:
        guess = nearest_flag(flag, known)
        described.append((flag, guess))
    if len(described) == 1:
        flag, guess = described[0]
        raise OptionsError(f"unknown option {flag}" + (f"; did you mean {guess}?" if guess else ""))
    raise OptionsError("unknown options " + ", ".join(
        flag + (f" (did you mean {guess}?)" if guess else "") for flag, guess in described))
