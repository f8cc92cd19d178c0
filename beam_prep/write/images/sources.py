"""What the source images were like, counted as they are made into records: their sizes and aspect
ratios in fixed bins, and how many were upscaled, cropped, padded or converted.

Each image adds its keys to the thread's ``resample.counting`` counter, which both sinks already
carry from every worker (and a resumed run from each kept shard's record) to the manifest; there
``summary`` turns the keys into the manifest's ``sources``. Fixed bins add up across workers and
across an append's versions, key by key.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from beam_prep.write.images import resample

__all__ = ["ASPECT_BINS", "SIZE_BINS", "record", "summary"]

PREFIX = "source "  # of every key this module counts under
# Lower bounds of the bins, in pixels (a side) and width / height; the last bin is open.
SIZE_BINS = (0, 64, 128, 256, 512, 1024, 2048, 4096)
ASPECT_BINS = (0, 0.5, 0.75, 0.9, 1.12, 1.34, 2.0)
DONE = ("upscaled", "cropped", "padded", "converted")


def record(width: int, height: int, done: Iterable[str]) -> None:
    """Counts one source image: its upright size, and what was ``done`` to it (names of ``DONE``)."""
    resample.tally(f"{PREFIX}images")
    resample.tally(f"{PREFIX}width {_bin(width, SIZE_BINS)}")
    resample.tally(f"{PREFIX}height {_bin(height, SIZE_BINS)}")
    resample.tally(f"{PREFIX}aspect {_bin(width / height, ASPECT_BINS)}")
    for what in done:
        resample.tally(f"{PREFIX}{what}")


def summary(rows: Iterable[tuple[str, int]]) -> dict[str, Any]:
    """The manifest's ``{"sources": ...}`` from ``counting``'s rows; nothing where no image was counted
    (a run whose kept shards were written before sources were counted counts the others only)."""
    counts: dict[str, int] = {}
    for key, n in rows:
        if key.startswith(PREFIX):
            counts[key[len(PREFIX):]] = counts.get(key[len(PREFIX):], 0) + n
    if not counts:
        return {}
    out: dict[str, Any] = {"images": counts.get("images", 0)}
    for name, bins in (("width", SIZE_BINS), ("height", SIZE_BINS), ("aspect", ASPECT_BINS)):
        out[name] = {_name(edge): counts.get(f"{name} {_name(edge)}", 0) for edge in bins}
    out.update({what: counts.get(what, 0) for what in DONE})
    return {"sources": out}


def _bin(value: float, bins: tuple[float, ...]) -> str:
    return _name(max(edge for edge in bins if value >= edge))


def _name(edge: float) -> str:
    return f"{edge:g}"
