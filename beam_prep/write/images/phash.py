"""A 64-bit perceptual hash of an image: near-identical pictures get hashes a few bits apart.

The DCT hash ("pHash") of the ``imagehash`` library's ``phash`` (after Neal
Krawetz, "Looks Like It", hackerfactor.com, 2011), bit for bit: the image in
greyscale (``L``), resized to 32x32 with Lanczos, its 2-D DCT-II (scipy's
unnormalised ``dct``), the top-left 8x8 coefficients (the lowest frequencies,
the DC term included), and one bit each: above their median or not, row by
row, the first the highest bit. A re-encode, a rescale or a colour shift moves
few coefficients across the median; an unrelated picture moves about half.

Computed with numpy (two 8x32 matrix products), so the workers need no scipy;
tests/write/test_phash.py checks it against ``imagehash.phash``. Why this hash
and how its distance threshold was chosen: docs/design/duplicates.md.
"""
from __future__ import annotations

import numpy as np
from PIL import Image

__all__ = ["BITS", "distance", "phash"]

BITS = 64
_SIDE = 32  # the greyscale thumbnail's side
_KEPT = 8  # the DCT coefficients kept per axis
# Rows k < 8 of scipy's DCT-II for 32 points: y[k] = 2 * sum_n x[n] cos(pi k (2n + 1) / 64).
_DCT = 2.0 * np.cos(np.pi * np.arange(_KEPT)[:, None] * (2 * np.arange(_SIDE)[None, :] + 1) / (2 * _SIDE))
_WEIGHTS = (1 << np.arange(BITS - 1, -1, -1, dtype=np.uint64))  # the first coefficient is the highest bit


def phash(image: Image.Image) -> int:
    """The image's 64-bit DCT hash, as an unsigned int (``imagehash.phash(image)`` as an int).

    Args:
      image: any Pillow image, upright as it is shown; its alpha is ignored, as
        ``convert("L")`` ignores it.
    """
    grey = image if image.mode == "L" else image.convert("L")
    pixels = np.asarray(grey.resize((_SIDE, _SIDE), Image.Resampling.LANCZOS), dtype=np.float64)
    # The 8x8 lowest frequencies of the 2-D DCT, rounded: a symmetric image has coefficients that are
    # zero but for float noise, which would otherwise fall either side of the median by machine.
    low = np.round(_DCT @ pixels @ _DCT.T, 6)
    bits = (low > np.median(low)).ravel()
    return int(_WEIGHTS[bits].sum(dtype=np.uint64))


def distance(a: int, b: int) -> int:
    """The number of bits in which two hashes differ (Hamming distance)."""
    return (a ^ b).bit_count()
