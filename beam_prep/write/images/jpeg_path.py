"""The JPEG fast path: a plain JPEG to its record's image in one native call, the Pillow path's bytes.

``imaging.process_image`` tries it first for every file when records store JPEG: the kernel
(``_jpeg_path.h``) reads the markers as Pillow does, decodes with the libjpeg Pillow loaded at
Pillow's draft scale, turns the image upright, resizes and hashes as the kernel does, and encodes as
``Image.save`` does, with the GIL released. It declines what it does not mirror (``REASONS``), and
that file goes down the Pillow path as before: same bytes either way, so a dataset and its resume
may mix them. Each JPEG is counted by the path that made it (the manifest's ``jpeg_path``).
docs/design/jpeg-path.md says why and how the two are held equal.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from typing import Any, NamedTuple

from PIL import Image

from beam_prep.errors import OptionsError
from beam_prep.write.images import resample, resample_loader
from beam_prep.write.images.phash import dct_rows

__all__ = ["NATIVE", "REASONS", "VARIABLE", "Made", "available", "check_choice", "make", "summary"]

# Which path makes JPEG records, where a user sets it: unset (or empty), the fast path where it runs;
# "pillow", Pillow's path for every file (to compare, or to rule the fast path out). The bytes are the
# same either way.
VARIABLE = "BEAM_PREP_JPEG_PATH"
PILLOW = "pillow"
NATIVE = "native"
# The Pillow versions whose JPEG reading the fast path mirrors (tests/write/test_jpeg_path.py on each).
CHECKED_PILLOW = ("12.3.0",)
_PREFIX = "jpeg "
# Why a JPEG went down the Pillow path, the key counted and what it means.
REASONS = {
    "markers": "markers Pillow reads by rules of its own (junk or fill bytes between them, a marker out "
               "of place, a segment cut short)",
    "coding": "a coding other than 8-bit Huffman DCT (12-bit, arithmetic, lossless, hierarchical)",
    "channels": "a JPEG of 4 channels (CMYK) or another count",
    "mpo": "a multi-picture file (MPO): Pillow reads it as one",
    "exif": "EXIF that Pillow reads by rules of its own (an orientation of another type, a header it "
            "refuses, EXIF in several segments)",
    "damaged": "data libjpeg warns about or fails on: Pillow's path reports it as before",
    "too_large": "over --max_pixels: Pillow's path reports it",
    "geometry": "a resize Pillow makes another way (an image over 100 times taller than wide), or an image "
                "too large for a JPEG (over 65,500 pixels a side: Pillow's path reports it)",
    "memory": "memory for the image ran short",
    "unavailable": "the fast path does not run in this process: BEAM_PREP_JPEG_PATH=pillow, the resize kernel "
                   "not running, or a Pillow or system it was not checked with (jpeg_path.available() says which)",
}
_MODES = {"center_crop": 0, "stretch": 1, "pad": 2, "shorter_side": 3, "none": 4}
_JPEG = b"\xff\xd8\xff"
# More pixels than a JPEG can have (65,535 a side): a larger --max_pixels limits nothing more, and is
# passed as this (the kernel takes a 64-bit count).
_ANY_JPEG = 1 << 32


class Made(NamedTuple):
    """A JPEG the fast path made: ``encoded`` with its ``width`` and ``height``; ``phash``, and ``flat``
    (the colour ``#rrggbb`` of an image of one colour, else None) as ``imaging`` computes them;
    ``upright``: the source's (width, height) turned upright; ``source_mode``: ``L`` or ``RGB``."""

    encoded: bytes
    width: int
    height: int
    phash: int | None
    flat: str | None
    upright: tuple[int, int]
    source_mode: str


def choice() -> str | None:
    """``BEAM_PREP_JPEG_PATH``'s value, None where unset or empty.

    Raises:
      OptionsError: a value other than ``pillow``.
    """
    value = os.environ.get(VARIABLE) or None
    if value is not None and value != PILLOW:
        raise OptionsError(f"{VARIABLE} must be {PILLOW} (or unset: the JPEG fast path where it runs), "
                           f"not {value!r}")
    return value


def check_choice() -> None:
    """Refuses a run before any work where ``BEAM_PREP_JPEG_PATH`` holds a value it does not take.

    Raises:
      OptionsError: naming the value and what to do.
    """
    choice()


@functools.cache
def _why_not() -> str | None:
    """Why the fast path cannot run in this process (found once), or None where it can."""
    loaded = resample_loader.load()
    if loaded.kernel is None or loaded.rules is None:
        return "the resize kernel does not run here"
    version = resample_loader.pillow_build().split()[-1]
    if version not in CHECKED_PILLOW:
        return f"Pillow {version} is not a version the JPEG fast path was checked against ({', '.join(CHECKED_PILLOW)})"
    if not hasattr(loaded.kernel, "jpeg_image"):
        return "the kernel was built without the JPEG fast path (not a Unix system)"
    from PIL import _imaging  # the module whose libjpeg decodes Pillow's JPEGs

    return loaded.kernel.find_jpeg_library(_imaging.__file__)


def available() -> str | None:
    """Why JPEG records are made by Pillow's path alone here, or None where the fast path runs.

    Raises:
      OptionsError: ``BEAM_PREP_JPEG_PATH`` holds a value it does not take.
    """
    if choice() == PILLOW:
        return f"{VARIABLE}={PILLOW}"
    if resample_loader.choice() == resample_loader.PILLOW:
        return f"{resample_loader.KERNEL_VARIABLE}={resample_loader.PILLOW}"
    return _why_not()


def make(data: bytes, spec: Any, draft_gap: float) -> Made | None:
    """``data``'s JPEG record image as ``imaging.process_image`` makes it for ``spec`` (an
    ``ImageSpec`` storing JPEG) and its ``draft_gap`` (``imaging.DRAFT_GAP``), or None where this
    file must go down the Pillow path: not a JPEG, or one the fast path declines (counted with its
    reason).
    """
    if not data.startswith(_JPEG):
        return None
    if resample._BROKEN.reason is not None or Image.core.get_alignment() != 1 or available() is not None:
        resample.tally(f"{_PREFIX}{PILLOW}: unavailable")
        return None
    kernel = resample_loader.load()
    rules = kernel.rules
    try:
        out = kernel.kernel.jpeg_image(
            data, dct_rows(), _MODES[spec.resize_mode], spec.width or 0, spec.height or 0, spec.channels,
            spec.jpeg_quality, min(spec.max_pixels, _ANY_JPEG), spec.no_upscale, draft_gap, spec.perceptual_hash,
            rules.tall_first, rules.horizontal_always, Image.core.get_block_size())
    except MemoryError:  # planning the image's memory: Pillow's path tries with its own (or reports it)
        out = "memory"
    if isinstance(out, str):
        if out != "not_jpeg":
            resample.tally(f"{_PREFIX}{PILLOW}: {out}")
        return None
    encoded, width, height, phash, flat, upright_w, upright_h, layers, resized = out
    if resized:
        resample.tally(resample.KERNEL if resized == 1 else resample.PILLOW)
    resample.tally(f"{_PREFIX}{NATIVE}")
    return Made(encoded, width, height, phash, flat, (upright_w, upright_h), "L" if layers == 1 else "RGB")


def summary(rows: Iterable[tuple[str, int]]) -> dict[str, Any]:
    """The manifest's ``jpeg_path`` from ``resample.counting``'s rows: how many JPEGs each path made,
    and why the Pillow path made those it did (``REASONS``' keys); nothing where no JPEG was counted."""
    native, declined = 0, {}
    for key, n in rows:
        if key == f"{_PREFIX}{NATIVE}":
            native += n
        elif key.startswith(f"{_PREFIX}{PILLOW}: "):
            reason = key[len(f"{_PREFIX}{PILLOW}: "):]
            declined[reason] = declined.get(reason, 0) + n
    if not native and not declined:
        return {}
    return {"jpeg_path": {NATIVE: native, PILLOW: sum(declined.values()), "reasons": dict(sorted(declined.items()))}}

