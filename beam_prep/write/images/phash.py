"""A 64-bit perceptual hash of an image: near-identical pictures get hashes a few bits apart.

The DCT hash ("pHash", after Neal Krawetz, "Looks Like It", hackerfactor.com,
2011) as the ``imagehash`` library's ``phash`` computes it, of the image in
greyscale (``L``) box-shrunk to 32x32: its 2-D DCT-II (scipy's unnormalised
``dct``), the top-left 8x8 coefficients (the lowest frequencies, the DC term
included), and one bit each: above their median or not, row by row, the first
the highest bit. A re-encode, a rescale or a colour shift moves few
coefficients across the median; an unrelated picture moves about half.

``imagehash`` shrinks with Lanczos; a box filter (Pillow's ``BOX``: each
thumbnail pixel the mean of its area) costs a sixth as much on a 224x224 image
and averages away the same detail, so ``phash(image)`` is
``imagehash.phash(image.convert("L").resize((32, 32), BOX))`` bit for bit.
Computed with numpy (two 8x32 matrix products), so the workers need no scipy;
tests/write/test_phash.py checks it against ``imagehash``. Where the resize
kernel runs, the whole hash is one call of it on the image's own pixels
(``_phash.h``: Pillow's grey and BOX thumbnail byte for byte, the same DCT),
a tenth of the cost of Pillow's steps and numpy's here. Why this hash, which
image a run hashes and how its distance threshold was chosen:
docs/design/duplicates.md.
"""
from __future__ import annotations

import numpy as np
from PIL import Image

from beam_prep.write.images import resample

__all__ = ["BITS", "DEFAULT_DISTANCE", "THUMBNAIL", "dct_rows", "distance", "phash"]

BITS = 64
DEFAULT_DISTANCE = 6  # the near-duplicate threshold in bits, chosen on docs/performance/near-duplicates.md
THUMBNAIL = 32  # the greyscale thumbnail's side (a reduced decode no smaller hashes near its full decode)
_KEPT = 8  # the DCT coefficients kept per axis
# Rows k < 8 of scipy's DCT-II for 32 points: y[k] = 2 * sum_n x[n] cos(pi k (2n + 1) / 64).
_DCT = 2.0 * np.cos(np.pi * np.arange(_KEPT)[:, None] * (2 * np.arange(THUMBNAIL)[None, :] + 1) / (2 * THUMBNAIL))


def dct_rows() -> np.ndarray:
    """The DCT's rows the hash keeps (float64, 8 x 32): the kernel's argument (the JPEG fast path's too)."""
    return _DCT


def phash(image: Image.Image, just_resized: bool = False) -> int:
    """The image's 64-bit DCT hash, as an unsigned int.

    Args:
      image: any Pillow image, upright as it is shown; its alpha is ignored, as
        ``convert("L")`` ignores it.
      just_resized: ``image`` is what ``resample.resize`` has just returned on
        this thread, not changed since: the kernel's rows are hashed where it
        left them (``resample.kernel_pixels``). The same hash either way.
    """
    if image.height <= image.width * resample.TALL:  # Image.resize's own rule for taller ones: its code
        by_kernel = resample.kernel_pixels(image, just_made=just_resized)
        if by_kernel is not None:
            kernel, pixels, pixelsize, keep_alive = by_kernel
            hashed = kernel.phash(pixels, image.width, image.height, pixelsize, _DCT)
            del keep_alive  # Pillow's memory is read until here
            return hashed
    grey = image if image.mode == "L" else image.convert("L")
    pixels = np.asarray(grey.resize((THUMBNAIL, THUMBNAIL), Image.Resampling.BOX), dtype=np.float64)
    # The 8x8 lowest frequencies of the 2-D DCT, rounded: a symmetric image has coefficients that are
    # zero but for float noise, which would otherwise fall either side of the median by machine.
    low = np.round(_DCT @ pixels @ _DCT.T, 6).ravel()
    middle = np.sort(low)[BITS // 2 - 1:BITS // 2 + 1]  # np.median's two middle values, a third of its cost
    return int.from_bytes(np.packbits(low > (middle[0] + middle[1]) / 2).tobytes(), "big")


def distance(a: int | np.ndarray, b: int | np.ndarray) -> int | np.ndarray:
    """The number of bits in which two hashes differ (Hamming distance): of two ints, an int; of
    uint64 arrays (or an array and an int), elementwise, broadcast as numpy does. The one
    definition every near-duplicate step uses (the search, the groups' report, the drop)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return _bit_count(np.asarray(a, dtype=np.uint64) ^ np.asarray(b, dtype=np.uint64))
    return (a ^ b).bit_count()


_BYTE_BITS = np.array([i.bit_count() for i in range(256)], dtype=np.uint8)


def _bit_count(words: np.ndarray) -> np.ndarray:
    """The set bits of each uint64: numpy's ``bitwise_count`` (numpy 2), else a byte table (numpy
    1.26, which setup.py allows)."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(words)
    as_bytes = np.ascontiguousarray(words).view(np.uint8).reshape(*words.shape, 8)
    return _BYTE_BITS[as_bytes].sum(axis=-1, dtype=np.uint8)
