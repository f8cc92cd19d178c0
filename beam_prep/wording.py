"""Counts as a person reads them: ``1 file``, ``2 files``, ``1,500 images``; one style for every message.
And text from a dataset's own files made safe for a terminal (``for_terminal``)."""
from __future__ import annotations

import re

__all__ = ["count", "for_terminal"]

# C0 and C1 control characters but the line break and the tab: ESC starts a terminal's escape sequences.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` with thousands separators and ``noun``, made plural (``noun + "s"`` unless given) unless ``n`` is 1."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def for_terminal(text: str) -> str:
    """``text`` with its control characters (but line breaks and tabs) written as ``\\x1b``: a report that
    shows names from a manifest (labels, splits, paths: data, from a bucket someone else may control)
    cannot move the cursor, clear the screen or retitle the window of the terminal it is printed to."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
