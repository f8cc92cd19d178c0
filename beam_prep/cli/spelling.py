"""Flag names as people type them: ``--max-per-kind`` and ``--max_per_kind`` alike, and the
nearest known flag for one that is neither.

Shared by every command (``prepare``'s Beam-aware ``flags`` and the argparse
parsers of ``inspect``, ``verify`` and ``bench``) and by ``prepare()``, whose
messages name keywords instead of flags. Imports nothing heavy: ``inspect``
must not pay for Beam.
"""
from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["PATH_FLAGS", "as_keywords", "as_positional_message", "flag_value", "known_spelling", "nearest_flag", "positionals_message",
           "unknown_flags_message"]

# prepare's path flags, which a user often types as positional arguments (``prepare tree out``),
# in order, each with the placeholder its usage line gives it; the other commands take the
# dataset folder as their one positional argument, and these flags there.
PATH_FLAGS = {"--input": "ROOT", "--output": "OUT"}
_FLAG = re.compile(r"(?<![\w-])--([A-Za-z][\w-]*)")


def _key(flag: str) -> str:
    """``--image-size`` and ``--Image_Size`` are both ``image_size`` to compare."""
    return flag.lstrip("-").replace("-", "_").lower()


def known_spelling(argv: Sequence[str], known: Iterable[str]) -> list[str]:
    """``argv`` with each flag spelled as a known one where only ``-`` and ``_`` differ:
    ``--max-per-kind 5`` becomes ``--max_per_kind 5`` when that is the flag declared.

    A flag known as typed is kept (Beam has ``--job-server-timeout``), values
    and everything after ``--`` are left alone.
    """
    known = set(known)
    by_key: dict[str, str] = {}
    for flag in sorted(known):
        by_key.setdefault(_underscored(flag), flag)
    out: list[str] = []
    for i, token in enumerate(argv):
        if token == "--":
            return out + list(argv[i:])
        name, eq, value = token.partition("=")
        if name.startswith("--") and name not in known:
            name = by_key.get(_underscored(name), name)
        out.append(name + eq + value)
    return out


def _underscored(flag: str) -> str:
    return "--" + flag[2:].replace("-", "_")


def nearest_flag(flag: str, known: Sequence[str]) -> str | None:
    """The known flag closest to ``flag``, treating ``-`` and ``_`` alike; None if none is close."""
    by_key = {_key(k): k for k in known}
    match = difflib.get_close_matches(_key(flag), list(by_key), n=1)
    return by_key[match[0]] if match else None


def unknown_flags_message(unknown: Sequence[str], known: Sequence[str],
                          guesses: Mapping[str, str] | None = None) -> str:
    """``unknown option --image_sise; did you mean --image_size?``, or every one of several.

    ``guesses`` gives the flag to suggest for some unknown ones, instead of the nearest
    by spelling (``--workers`` on a local run: ``--direct_num_workers``).
    """
    guesses = guesses or {}
    described = [(flag, guesses.get(flag) or nearest_flag(flag, known)) for flag in unknown]
    if len(described) == 1:
        flag, guess = described[0]
        return f"unknown option {flag}" + (f"; did you mean {guess}?" if guess else "")
    return "unknown options " + ", ".join(
        flag + (f" (did you mean {guess}?)" if guess else "") for flag, guess in described)


def positionals_message(values: Sequence[str], missing: Sequence[str], placeholders: dict[str, str]) -> str:
    """What to say of arguments given without a flag, to a command whose every option is a flag.

    ``values`` are those arguments, in order; ``missing`` the flags they most likely
    stand for (the path flags not given, in order), each with the placeholder that
    ``placeholders`` gives it for a value not typed. ``prepare tree out`` gives
    ``... did you mean --input tree --output out?``, ``prepare tree`` ``... --input tree
    --output OUT?``; more values than missing flags are named as unexpected.
    """
    if values and len(values) <= len(missing):
        parts = [f"{flag} {shlex.quote(value)}" for flag, value in zip(missing, values)]
        parts += [f"{flag} {placeholders[flag]}" for flag in missing[len(values):]]
        return f"paths are given as flags, not positional arguments: did you mean {' '.join(parts)}?"
    named = " ".join(shlex.quote(value) for value in values)
    usage = " ".join(f"{flag} {placeholders[flag]}" for flag in placeholders)
    return (f"unexpected argument{'s' if len(values) > 1 else ''} {named}: every option is a flag "
            f"({usage} [options]), and a flag's value follows it")


def as_positional_message(prog: str, argv: Sequence[str], metavar: str) -> str | None:
    """For a command whose folder is positional (``beam-prep verify OUT``) given it as a flag
    (``--output out``, ``--input=out``): ``OUT is positional: did you mean beam-prep verify out?``,
    the rest of ``argv`` kept. None when no path flag holds a value."""
    for i, token in enumerate(argv):
        name, eq, value = token.partition("=")
        if name not in PATH_FLAGS:
            continue
        if eq:
            rest = [*argv[:i], value, *argv[i + 1:]]
        elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            rest = [*argv[:i], *argv[i + 1:]]
        else:
            return None
        return f"{metavar} is a positional argument, not {name}: did you mean {prog} {shlex.join(rest)}?"
    return None


def as_keywords(message: str, bare_flags: Iterable[str] = ()) -> str:
    """A command's message as ``prepare()``'s caller reads it: ``--image_size`` is the keyword
    ``image_size``, and a bare flag (``--overwrite``, in ``bare_flags``) is ``overwrite=True``.

    ``pass --overwrite to replace it`` becomes ``pass overwrite=True to replace it``.
    """
    bare = {flag.lstrip("-") for flag in bare_flags}
    return _FLAG.sub(lambda m: f"{m[1]}=True" if m[1] in bare else m[1], message)


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value given to ``flag`` (``--flag v`` or ``--flag=v``), None if it is not given."""
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name == flag:
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
    return None
