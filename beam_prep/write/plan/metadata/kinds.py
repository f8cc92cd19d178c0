"""Each extra column's one type, decided over every row: bytes (a string), int64 (an integer or
a boolean) or float (a number), as Hugging Face's pandas reads a CSV/TSV cell.
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from beam_prep.errors import OptionsError
from beam_prep.model.features import FeatureKind

__all__ = ["KIND_WORDS", "ColumnKinds", "kind_of", "parse_cell"]

# Booleans as a CSV/TSV cell may spell them (pandas' defaults, which Hugging Face reads with).
_BOOLEANS = {"True": True, "TRUE": True, "true": True, "False": False, "FALSE": False, "false": False}
_INT = re.compile(r"[+-]?\d+")
_INT64_RANGE = (-(2**63), 2**63 - 1)
KIND_WORDS = {FeatureKind.BYTES: "a string column", FeatureKind.INT64: "an integer column",
              FeatureKind.FLOAT: "a number column"}  # a type, as messages say it


class ColumnKinds:
    """The extra columns' types so far, each with the cell that decided it: a cell that does
    not fit its column's type is refused, naming both lines.

    Args:
      path: the table, for messages.
      fmt: its format (``formats.FORMATS``): a CSV/TSV cell is text until read as a number.
    """

    def __init__(self, path: str, fmt: str) -> None:
        self._path = path
        self._fmt = fmt
        self._kinds: dict[str, FeatureKind] = {}
        self._first: dict[str, tuple[int, Any]] = {}  # column -> (line, value) that decided its type
        self._empty: dict[str, int] = {}  # column -> first line with an empty string (CSV/TSV)

    def final(self, columns: Sequence[str]) -> dict[str, FeatureKind]:
        """Each column's type once every row is read (bytes where no cell said otherwise).

        Raises:
          OptionsError: an empty CSV/TSV cell in a column of numbers.
        """
        kinds = {name: self._kinds.get(name, FeatureKind.BYTES) for name in columns}
        for name, line in self._empty.items():
            if kinds[name] is not FeatureKind.BYTES:
                self._misfit(name, line, "", kinds[name])
        return kinds

    def value(self, name: str, value: Any, line: int) -> Any:
        """A cell as a bytes, int64 or float value, checked against its column's type so far.

        A CSV/TSV cell is a number where it reads as one, but a column that holds text
        keeps every cell's text as written (ids like 007 stay strings there).
        """
        text = None
        if self._fmt != "jsonl" and self._kinds.get(name) is FeatureKind.BYTES:
            return value  # the common case first: a text column keeps every cell as written
        if isinstance(value, str) and self._fmt != "jsonl":
            if not value.strip():
                self._empty.setdefault(name, line)
                return value
            text, value = value, parse_cell(value)
        kind = kind_of(value)
        if kind is None:
            advice = ("give every row a value (NaN for a missing number)" if value is None
                      else "a feature holds a string, an integer, a number or a boolean: store it as a string")
            raise OptionsError(f"--metadata {self._path} line {line}: column {name!r} holds "
                               f"{json.dumps(value)}: {advice}")
        if isinstance(value, bool):
            value = int(value)  # stored as int64 0/1
        known = self._kinds.get(name)
        if text is not None and known is FeatureKind.BYTES:
            return text
        if known is None or (known is FeatureKind.INT64 and kind is FeatureKind.FLOAT):
            self._kinds[name] = kind
            self._first.setdefault(name, (line, text if text is not None else value))
        elif not (known is kind or (known is FeatureKind.FLOAT and kind is FeatureKind.INT64)):
            self._misfit(name, line, text if text is not None else value, known)
        return value

    def _misfit(self, name: str, line: int, value: Any, kind: FeatureKind) -> None:
        first_line, first = self._first[name]
        advice = "give a column values of one type"
        if value == "" and kind is not FeatureKind.BYTES:
            advice = "fill the cell (NaN for a missing number, which makes the column a number column)"
        raise OptionsError(f"--metadata {self._path} line {line}: column {name!r} holds {json.dumps(value)}, "
                           f"but line {first_line} made it {KIND_WORDS[kind]} ({json.dumps(first)}): {advice}")


def parse_cell(text: str) -> Any:
    """A CSV/TSV cell as an int, a float, a bool (``True``, ``false``, ... as pandas reads them)
    or the text itself, as it reads."""
    stripped = text.strip()
    if stripped in _BOOLEANS:
        return _BOOLEANS[stripped]
    if _INT.fullmatch(stripped):
        number = int(stripped)
        return number if _INT64_RANGE[0] <= number <= _INT64_RANGE[1] else text
    try:
        return float(stripped)
    except ValueError:
        return text


def kind_of(value: Any) -> FeatureKind | None:
    """A value's type as a feature, or None where no feature holds it (None, a list, an integer past int64)."""
    if isinstance(value, bool):
        return FeatureKind.INT64
    if isinstance(value, int):
        return FeatureKind.INT64 if _INT64_RANGE[0] <= value <= _INT64_RANGE[1] else None
    if isinstance(value, float):
        return FeatureKind.FLOAT
    if isinstance(value, str):
        return FeatureKind.BYTES
    return None

