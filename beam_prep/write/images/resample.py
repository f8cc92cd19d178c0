"""Pillow's bicubic resize, computed by a vectorised kernel of our own: the same pixels, faster.

``resize(img, size, box)`` returns what ``img.resize(size, BICUBIC, box=box)``
returns, byte for byte: the kernel (``resample_kernel``, compiled with numba)
computes Pillow's own integer weights and sums, horizontal pass first, each
8-bit result clipped as Pillow clips it. Pillow's scalar loops gather each
output pixel's taps one by one; here each pass runs over whole contiguous rows,
which the compiler vectorises: the horizontal pass on a transposed copy of the
rows it needs. Pixels come from Pillow's memory without a copy (its Arrow
export), and the scratch arrays are kept per thread, so a worker's images reuse
the same memory.

``resample_loader`` finds the kernel: machine code built once a machine and
mapped in milliseconds, or numba in process where that cannot run. Until it is
ready, and where it cannot be had (one warning), ``resize`` is Pillow's: the
images are the same either way. With pillow-simd in Pillow's place, its own
resize always runs: its rounding differs, and a rerun must give the same bytes.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import threading
from importlib import metadata

import numpy as np
from PIL import Image

from beam_prep.errors import KernelUnavailable
from beam_prep.write.images import resample_loader

RESAMPLE = Image.Resampling.BICUBIC
PILLOW = "pillow"
# Which code resizes, where a user sets it: unset, the kernel once it has loaded (Pillow's loops
# until then); "pillow", Pillow's loops (to compare, or to rule the kernel out); "numba", the
# kernel from the first image, and an error where it cannot load. The pixels are the same.
KERNEL_VARIABLE = "BEAM_PREP_RESIZE_KERNEL"
NUMBA = "numba"
_MODES = {"L": 1, "RGB": 4}  # bytes a pixel in Pillow's memory: RGB is stored as RGBX


class _ArrowArray(ctypes.Structure):
    """The Arrow C data interface's ``struct ArrowArray``: how Pillow hands over its pixels."""


_ArrowArray._fields_ = [
    ("length", ctypes.c_int64), ("null_count", ctypes.c_int64), ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64), ("n_children", ctypes.c_int64),
    ("buffers", ctypes.POINTER(ctypes.c_void_p)),
    ("children", ctypes.POINTER(ctypes.POINTER(_ArrowArray))),
    ("dictionary", ctypes.POINTER(_ArrowArray)),
    ("release", ctypes.c_void_p), ("private_data", ctypes.c_void_p),
]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


_LOADER = resample_loader.Loader()


def load() -> str:
    """Loads the kernel and waits for it, building it first where this machine has no build (tests,
    benchmarks, and the worker image's build); returns ``kernel()``."""
    _refuse_where_needed()
    _LOADER.wait()
    return kernel()


def kernel() -> str:
    """Which code resizes in this process once the kernel has loaded: ``numba 0.68.1`` (ours,
    compiled by that numba), or ``pillow`` where it cannot load."""
    return PILLOW if _LOADER.kernel is None else f"numba {metadata.version('numba')}"


def _refuse_where_needed() -> None:
    """Tells the loader not to load where the kernel must not run: the user chose Pillow's loops,
    or pillow-simd is installed, whose own resize rounds differently (reruns keep its bytes)."""
    if _LOADER.refusal is None:
        if os.environ.get(KERNEL_VARIABLE) == PILLOW:
            _LOADER.refusal = f"{KERNEL_VARIABLE}={PILLOW}"
        elif not _stock_pillow():
            _LOADER.refusal = f"{pillow_build()} resizes with its own rounding, kept for reruns"


def available() -> str:
    """The kernel this environment provides, found without loading it (the launcher's view, which
    the manifest records): ``numba 0.68.1``, or ``pillow`` where numba is not installed or the
    Pillow build is pillow-simd, whose own resize runs (its rounding differs from Pillow's)."""
    if (os.environ.get(KERNEL_VARIABLE) == PILLOW or not _stock_pillow()
            or importlib.util.find_spec("numba") is None):
        return PILLOW
    return f"numba {metadata.version('numba')}"


def _stock_pillow() -> bool:
    return pillow_build().startswith("pillow ")


@functools.cache
def pillow_build() -> str:
    """The Pillow build that decodes and resizes here: ``pillow 12.3.0``, or ``pillow-simd ...``
    where the opt-in accelerated build is installed in its place (docs/design/resizing.md).

    Their resized pixels differ by rounding, so the manifest records which made a dataset:
    reruns are byte-identical with the same build.
    """
    import PIL

    for name in ("pillow-simd", "pillow"):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if os.path.realpath(dist.locate_file("PIL/__init__.py")) == os.path.realpath(PIL.__file__):
            return f"{name} {dist.version}"
    return f"PIL {PIL.__version__}"


def resize(img: Image.Image, size: tuple[int, int], box: tuple[float, float, float, float]) -> Image.Image:
    """``img.resize(size, Image.Resampling.BICUBIC, box=box)``, by the compiled kernel where it runs.

    Args:
      img: an image in mode L or RGB (any other mode goes to Pillow).
      size: the output's (width, height).
      box: the source region to resize, in (fractional) source pixels.

    Returns:
      The resized image, equal to Pillow's pixel for pixel.

    Raises:
      ValueError: as Pillow raises it, for an empty or out-of-bounds box or a size under 1.
      KernelUnavailable: ``BEAM_PREP_RESIZE_KERNEL=numba`` and the kernel cannot load.
    """
    choice = os.environ.get(KERNEL_VARIABLE)
    if choice == PILLOW:
        return img.resize(size, RESAMPLE, box=box)
    compiled = _LOADER.kernel
    if compiled is None:
        _refuse_where_needed()
        if choice != NUMBA:
            _LOADER.on_pillow_resize()
            compiled = _LOADER.kernel
            if compiled is None:
                return img.resize(size, RESAMPLE, box=box)
        else:
            compiled = _LOADER.wait()
            if compiled is None:
                raise KernelUnavailable(
                    f"{KERNEL_VARIABLE}={NUMBA}, but the resize kernel cannot load: {_LOADER.error}")
    resized = _by_kernel(compiled, img, size, box)
    return img.resize(size, RESAMPLE, box=box) if resized is None else resized


def _by_kernel(kernel_module: resample_loader.Kernel, img: Image.Image, size: tuple[int, int],
               box: tuple[float, float, float, float]) -> Image.Image | None:
    """``resize`` by the kernel; None where Pillow's own code must run: another mode, the
    errors Pillow raises, its shortcuts for a box of the output's size (a crop, a copy), and
    pixels it cannot hand over without a copy."""
    width, height = img.size
    out_w, out_h = size
    b0, b1, b2, b3 = (np.float32(v) for v in box)  # Pillow's C code takes the box as float32
    if (img.mode not in _MODES or out_w < 1 or out_h < 1
            or b0 < 0 or b1 < 0 or b2 > width or b3 > height or b2 - b0 < 0 or b3 - b1 < 0
            or (b0 == int(b0) and b2 - b0 == out_w and b1 == int(b1) and b3 - b1 == out_h)):
        return None
    img.load()
    pixels = _pixels(img)
    if pixels is None:
        return None
    view, keep_alive = pixels
    channels = _MODES[img.mode]
    pixel = np.uint32 if channels == 4 else np.uint8  # one element a pixel, for transposing
    scratch = _scratch()
    need_horizontal = out_w != width or b0 != 0 or b2 != out_w  # Pillow's tests, as written
    need_vertical = out_h != height or b1 != 0 or b3 != out_h
    v_bounds, v_weights = kernel_module.coefficients(height, b1, b3, out_h)
    rows = view.reshape(height, width * channels)
    if need_horizontal:
        h_bounds, h_weights = kernel_module.coefficients(width, b0, b2, out_w)
        y0, y1 = int(v_bounds[0, 0]), int(v_bounds[-1, 0] + v_bounds[-1, 1])
        x0, x1 = int(h_bounds[0, 0]), int(h_bounds[-1, 0] + h_bounds[-1, 1])
        h_bounds[:, 0] -= x0
        v_bounds[:, 0] -= y0
        columns = scratch.get("columns", (x1 - x0, y1 - y0), pixel)
        kernel_module.transpose(rows.view(pixel)[y0:y1, x0:x1], columns)
        filtered = scratch.get("filtered", (out_w, y1 - y0), pixel)
        kernel_module.filter_rows(_as_bytes(columns), h_bounds, h_weights, _as_bytes(filtered),
                                  scratch.get("acc", ((y1 - y0) * channels,), np.int32))
        rows = scratch.get("rows", (y1 - y0, out_w), pixel)
        kernel_module.transpose(filtered, rows)
        rows = _as_bytes(rows)
    if need_vertical:
        out = scratch.get("out", (out_h, out_w * channels), np.uint8)
        kernel_module.filter_rows(rows, v_bounds, v_weights, out, scratch.get("acc", (out_w * channels,), np.int32))
        rows = out
    resized = Image.frombytes(img.mode, size, rows, "raw", "RGBX" if channels == 4 else "L")  # a copy
    del keep_alive  # Pillow's memory is read until here
    return resized


def _pixels(img: Image.Image) -> tuple[np.ndarray, object] | None:
    """A view of ``img``'s pixels in Pillow's own memory (1 or 4 bytes each), with the object that
    must stay alive while it is used; None where Pillow cannot export them without a copy (an
    image stored in several blocks: over 16 MB by default).

    An image over memory Pillow does not own (``Image.frombuffer``, ``fromarray``: ``readonly``)
    is never exported: Pillow 12.3's export crashes the process on one.
    """
    if img.readonly:
        return None
    try:
        capsule = img.im.__arrow_c_array__()  # the array alone: Image's own method makes a schema too
    except (ValueError, AttributeError):
        return None
    array = _ArrowArray.from_address(_capsule_pointer(capsule, b"arrow_array"))
    if array.n_children:  # RGB: a fixed-size list of 4 bytes a pixel; the bytes are its child's
        array = array.children[0].contents
    nbytes = img.size[0] * img.size[1] * _MODES[img.mode]
    buffer = (ctypes.c_uint8 * nbytes).from_address(array.buffers[1])
    return np.frombuffer(buffer, np.uint8), (capsule, img)


def _as_bytes(pixels: np.ndarray) -> np.ndarray:
    return pixels.view(np.uint8)


class _Scratch(threading.local):
    """Arrays reused from image to image, one set per thread: fresh ones would touch new pages
    on every image."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        """A C-contiguous array of ``shape`` and ``dtype``, in memory kept under ``name``."""
        size = 1
        for side in shape:
            size *= side
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.size < size:
            buffer = self._buffers[name] = np.empty(max(size, 1 << 16), dtype)
        return buffer[:size].reshape(shape)


_scratch = functools.cache(_Scratch)
