"""Counts as a person reads them: ``1 file``, ``2 files``, ``1,500 images``; one style for every message.
And text from a dataset's own files made safe for a terminal (``for_terminal``)."""
from __future__ import annotations

import re

__all__ = ["count", "for_terminal"]

# C0 and C1 control characters but the line break and the tab: ESC starts a terminal's escape sequences.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Every one, and Unicode's line and paragraph separators: one value, kept on its line.
_ANY_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` with thousands separators and ``noun``, made plural (``noun + "s"`` unless given) unless ``n`` is 1."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def for_terminal(text: str, one_line: bool = False) -> str:
    """``text`` with its control characters (but line breaks and tabs) written as ``\\x1b``: a report that
    shows names from a manifest (labels, splits, paths: data, from a bucket someone else may control)
    cannot move the cursor, clear the screen or retitle the window of the terminal it is printed to.
    ``one_line``: line breaks and tabs too (``\\x0a``), for a line of a report, or one value in it, which
    a value holding a line break would otherwise end, and the next line it forged follow."""
    return (_ANY_CONTROL if one_line else _CONTROL).sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", text)
