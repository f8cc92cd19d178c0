"""Counts as a person reads them: ``1 file``, ``2 files``, ``1,500 images``; one style for every message."""
from __future__ import annotations

__all__ = ["count"]


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` with thousands separators and ``noun``, made plural (``noun + "s"`` unless given) unless ``n`` is 1."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
