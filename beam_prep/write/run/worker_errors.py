"""The exception a Beam worker raised, found in the error the launcher gets instead.

Beam reports a worker's exception as a RuntimeError whose text is the worker's
traceback; the cause, e.g. beam-prep's ``StorageError`` for a shard that finds no
room, is that traceback's last ``<ExceptionType>: <message>`` line. The console's
one line (``cli.joblog.root_cause``) and a library run's typed error (``typed_errors``)
both come from it.
"""
from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from beam_prep import errors

__all__ = ["STEP_SUFFIX", "raised_in_worker", "typed_errors"]

# Beam appends the step to an exception raised in a DoFn; the message ends there.
STEP_SUFFIX = re.compile(r"\s*\[while running '.*$")
# A traceback's "<ExceptionType>: <message>" line: starts at column 0, no space in the type.
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*): (.*\S)")
_TRACEBACK = "Traceback (most recent call last):"


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions it was raised from, outermost first."""
    found = [error]
    while True:
        inner = found[-1].__cause__ or (None if found[-1].__suppress_context__ else found[-1].__context__)
        if inner is None or inner in found:
            return found
        found.append(inner)


def raised_in_worker(error: BaseException) -> tuple[str, str] | None:
    """The type and message of the exception a worker raised, where ``error`` or one it was raised from
    carries its traceback as text (the innermost that does): its last exception line; else None."""
    for inner in reversed(_chain(error)):
        text = str(inner)
        if _TRACEBACK in text:
            found = None
            for line in text[text.index(_TRACEBACK):].splitlines():
                match = _EXCEPTION_LINE.match(line)
                if match:
                    found = (match.group(1), match.group(2))
            if found:
                return found
    return None


def _as_raised(error: BaseException) -> errors.BeamPrepError | None:
    """The beam-prep error a worker raised, made again here from its text (its message without
    Beam's step); None where the worker raised another type, or one made with more than a message."""
    found = raised_in_worker(error)
    if found is None:
        return None
    module, _, name = found[0].rpartition(".")
    kind = getattr(errors, name, None) if module == errors.__name__ else None
    if not (isinstance(kind, type) and issubclass(kind, errors.BeamPrepError)):
        return None
    try:
        return kind(STEP_SUFFIX.sub("", found[1]).strip())
    except TypeError:
        return None


@contextlib.contextmanager
def typed_errors() -> Iterator[None]:
    """While inside, a job's failure that carries a beam-prep error a worker raised is raised as
    that error (its type, its message), chained to Beam's: what the caller's docs promise."""
    try:
        yield
    except Exception as e:
        typed = _as_raised(e)
        if typed is None:
            raise
        raise typed from e
