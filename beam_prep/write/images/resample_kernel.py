"""The compiled loops of ``resample``: Pillow's bicubic resampling, one pass over contiguous rows.

Imported only by ``resample``, which falls back to Pillow where this module
cannot load (numba missing, or unable to compile for this machine). The
functions are compiled for fixed argument types when this module is imported,
and cached by numba beside the source (``__pycache__``) or, where that cannot
be written, in the user's cache folder: a machine pays the compile (about two
seconds) once, later processes load it.

What Pillow computes (``libImaging/Resample.c``), and why the result is the
same byte for byte on every CPU: the weights are a few double-precision
operations in Pillow's order (no fused multiply-add: numba does not contract
without ``fastmath``), rounded to 22-bit integers; the rest is integer
arithmetic that no instruction set rounds differently.
"""
from __future__ import annotations

import numba
import numpy as np

# Pillow's PRECISION_BITS for 8-bit images: 32 - 8 bits of result - 2 bits of headroom.
PRECISION_BITS = 22
_HALF = 1 << (PRECISION_BITS - 1)
_ONE = float(1 << PRECISION_BITS)

_JIT = {"cache": True, "nogil": True, "error_model": "numpy", "boundscheck": False}


@numba.njit("float64(float64)", **_JIT)
def _bicubic(x: float) -> float:
    """Pillow's bicubic filter (a = -0.5), operations in its order."""
    if x < 0.0:
        x = -x
    if x < 1.0:
        return (1.5 * x - 2.5) * x * x + 1.0
    if x < 2.0:
        return (((x - 5.0) * x + 8.0) * x - 4.0) * -0.5
    return 0.0


@numba.njit("void(int64, float32, float32, int64, int32[:, ::1], int32[:, ::1])", **_JIT)
def fill_coefficients(in_size, in0, in1, out_size, bounds, weights) -> None:
    """Pillow's ``precompute_coeffs`` and ``normalize_coeffs_8bpc`` for one axis.

    Args:
      in_size: the source's pixels along this axis.
      in0: where the box starts, as the float32 Pillow's C code receives.
      in1: where it ends, likewise.
      out_size: the output's pixels along this axis.
      bounds: (out_size, 2), filled: each output pixel's first source pixel and tap count.
      weights: (out_size, ``resample_loader.taps()``), filled: its integer weights (past its count: unused).
    """
    scale = np.float64(in1 - in0) / out_size  # the difference in float32, as Pillow takes it
    filterscale = max(scale, 1.0)
    support = 2.0 * filterscale
    inv_filterscale = 1.0 / filterscale
    start = np.float64(in0)
    for xx in range(out_size):
        center = start + (xx + 0.5) * scale
        xmin = int(center - support + 0.5)  # C's (int): towards zero
        xmin = max(xmin, 0)
        xmax = int(center + support + 0.5)
        xmax = min(xmax, in_size)
        xmax -= xmin
        total = 0.0
        for x in range(xmax):
            total += _bicubic((np.float64(x + xmin) - center + 0.5) * inv_filterscale)
        for x in range(xmax):  # each weight again, rather than an array to allocate: the same double
            w = _bicubic((np.float64(x + xmin) - center + 0.5) * inv_filterscale)
            w = w / total if total != 0.0 else w
            weights[xx, x] = int(-0.5 + w * _ONE) if w < 0 else int(0.5 + w * _ONE)
        for x in range(xmax, weights.shape[1]):
            weights[xx, x] = 0
        bounds[xx, 0] = xmin
        bounds[xx, 1] = xmax


@numba.njit("void(uint8[:, ::1], int32[:, ::1], int32[:, ::1], uint8[:, ::1], int32[::1])", **_JIT)
def filter_rows(src, bounds, weights, out, acc) -> None:
    """Each row of ``out`` is the weighted sum of the rows of ``src`` its bounds name, clipped to 8 bits.

    A row is a whole image row (all its channels), so the inner loops run over
    contiguous bytes and vectorise. Integer sums in any order are Pillow's exactly (the
    total fits in 32 bits, which is why Pillow keeps 2 bits of headroom). The horizontal pass runs here too, on the
    transposed image. ``acc``: scratch of one row, reused.
    """
    width = src.shape[1]
    for yy in range(out.shape[0]):
        first = bounds[yy, 0]
        for i in range(width):
            acc[i] = _HALF
        taps = bounds[yy, 1]
        y = 0
        while y + 4 <= taps:  # four rows a pass: a quarter of the trips through acc
            w0, w1, w2, w3 = weights[yy, y], weights[yy, y + 1], weights[yy, y + 2], weights[yy, y + 3]
            r0, r1, r2, r3 = src[first + y], src[first + y + 1], src[first + y + 2], src[first + y + 3]
            for i in range(width):
                acc[i] += (np.int32(r0[i]) * w0 + np.int32(r1[i]) * w1
                           + np.int32(r2[i]) * w2 + np.int32(r3[i]) * w3)
            y += 4
        while y < taps:
            w = weights[yy, y]
            row = src[first + y]
            for i in range(width):
                acc[i] += np.int32(row[i]) * w
            y += 1
        line = out[yy]
        for i in range(width):
            v = acc[i] >> PRECISION_BITS
            line[i] = 0 if v < 0 else (min(v, 255))


@numba.njit(["void(uint32[:, :], uint32[:, ::1])", "void(uint8[:, :], uint8[:, ::1])"], **_JIT)
def transpose(src, out) -> None:
    """``out`` = ``src`` transposed (pixels: uint32 for RGBX, uint8 for L), in 4x4 tiles whose
    fixed-size loops the compiler unrolls: faster than numpy's strided copy, and cache-friendly."""
    rows, cols = src.shape
    tile = 4
    whole_rows, whole_cols = rows - rows % tile, cols - cols % tile
    for r0 in range(0, whole_rows, tile):
        for c0 in range(0, whole_cols, tile):
            for i in range(tile):
                for j in range(tile):
                    out[c0 + j, r0 + i] = src[r0 + i, c0 + j]
        for c in range(whole_cols, cols):
            for i in range(tile):
                out[c, r0 + i] = src[r0 + i, c]
    for r in range(whole_rows, rows):
        for c in range(cols):
            out[c, r] = src[r, c]
