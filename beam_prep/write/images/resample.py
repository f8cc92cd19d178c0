"""Pillow's bicubic resize, computed by a vectorised kernel of our own: the same pixels, faster.

``resize(img, size, box)`` returns what ``img.resize(size, BICUBIC, box=box)`` returns, byte
for byte: this module holds Pillow's rules around the kernel (the C extension ``_resample``),
hands Pillow any call the kernel would not answer as Pillow does, and counts what resized each
image (``counting``). docs/design/resizing.md has the rules, the fallbacks and why.
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import math
import struct
import threading
import weakref
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

import numpy as np
from PIL import Image

from beam_prep.errors import KernelUnavailable, OptionsError
from beam_prep.write.images import resample_loader
from beam_prep.write.images.resample_loader import KERNEL, KERNEL_VARIABLE, PILLOW, pillow_build

__all__ = ["KERNEL", "KERNEL_VARIABLE", "PILLOW", "available", "check_choice", "counting", "fallback_key",
           "pillow_build", "resize", "summary", "tally"]

log = logging.getLogger(__name__)

RESAMPLE = Image.Resampling.BICUBIC
_MODES = {"L": 1, "RGB": 4}  # bytes a pixel in Pillow's memory: RGB is stored as RGBX
_INT_MAX = 2**31 - 1
TALL = 100  # Pillow 12.2+: an image taller than this many times its width is resized vertically first
# A count's key for images Pillow resized because the kernel could not (``fallback_key``): the reason follows.
_FALLBACK = f"{PILLOW}: "


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


def available() -> str:
    """What resizes in this environment, found without resizing (the launcher's view):
    ``kernel``, or ``pillow`` where the kernel is not built, not chosen, or not checked against
    this Pillow (``resample_loader.load``).

    Raises:
      OptionsError: ``BEAM_PREP_RESIZE_KERNEL`` holds a value it does not take.
    """
    if resample_loader.choice() == PILLOW or resample_loader.load().kernel is None:
        return PILLOW
    return KERNEL


def check_choice() -> str:
    """Refuses a run before any work where ``BEAM_PREP_RESIZE_KERNEL`` is wrong: a value it does not
    take, or ``kernel`` where this environment cannot have it; returns ``available()``.

    Raises:
      OptionsError: naming the value and what to do.
    """
    if resample_loader.choice() == KERNEL and resample_loader.load().kernel is None:
        raise OptionsError(f"{KERNEL_VARIABLE}={KERNEL}, but {_why_not()}: unset it to resize with "
                           "Pillow's loops (the same pixels)")
    return available()


def _why_not() -> str:
    loaded = resample_loader.load()
    if _BROKEN.reason is not None:
        return _BROKEN.reason
    return loaded.fallback or f"{pillow_build()} is installed, whose own resize runs"


class _Broken:
    """Set once the kernel failed in this process: Pillow's loops resize from then on."""

    reason: str | None = None
    lock = threading.Lock()


_BROKEN = _Broken()


class _Counts(threading.local):
    counter: collections.Counter | None = None


_COUNTS = _Counts()


@contextlib.contextmanager
def counting() -> Iterator[collections.Counter]:
    """Counts the images this thread resizes, by what resized them: ``kernel``, ``pillow``, or
    ``fallback_key(reason)`` where Pillow's loops resized because the kernel could not.

    A sink wraps a shard's (or an element's) work in it, and carries the counts to the manifest
    (``summary``): per thread, so the threads of one worker never count each other's images.
    """
    previous = _COUNTS.counter
    counter = _COUNTS.counter = collections.Counter()
    try:
        yield counter
    finally:
        _COUNTS.counter = previous


def fallback_key(reason: str) -> str:
    """The count's key of an image Pillow's loops resized because the kernel could not, for ``reason``."""
    return _FALLBACK + reason


def summary(rows: Iterable[tuple[str, int]]) -> dict[str, Any]:
    """The manifest's ``resize_kernel`` and ``resize_fallback`` from ``counting``'s rows.

    ``resize_kernel``: what resized the images, ``kernel`` or ``pillow``, or both with their counts
    (``{"kernel": 990, "pillow": 10}``) where both did, ``none`` where no image needed a resize.
    ``resize_fallback``: why Pillow's loops resized where the kernel could have, and what to do
    (sorted; empty where nothing fell back).
    """
    by: collections.Counter[str] = collections.Counter()
    reasons = set()
    for key, n in rows:
        if key.startswith(_FALLBACK):
            reasons.add(key[len(_FALLBACK):])
            key = PILLOW
        elif key not in (KERNEL, PILLOW):
            continue  # another count the same counter carries (``tally``: the sources')
        by[key] += n
    resized = {name: by[name] for name in sorted(by) if by[name]}
    kernel: Any = next(iter(resized)) if len(resized) == 1 else (resized or "none")
    return {"resize_kernel": kernel, "resize_fallback": sorted(reasons)}


def tally(key: str) -> None:
    """Counts one image under ``key`` in this thread's ``counting``, if one is open: what resized it
    (here), or another per-image count the sinks carry to the manifest the same way (``sources``)."""
    counter = _COUNTS.counter
    if counter is not None:
        counter[key] += 1


def resize(img: Image.Image, size: tuple[int, int], box: tuple[float, float, float, float] | None) -> Image.Image:
    """``img.resize(size, Image.Resampling.BICUBIC, box=box)``, by the kernel where it runs.

    Args:
      img: an image in mode L or RGB (any other mode goes to Pillow).
      size: the output's (width, height).
      box: the source region to resize, in (fractional) source pixels; None: the whole image.

    Returns:
      The resized image, equal to Pillow's pixel for pixel.

    Raises:
      ValueError, TypeError, MemoryError: as Pillow raises them, for a size under 1, an empty or
        out-of-bounds box, a size or box of another shape or type, or sizes too large for Pillow.
      KernelUnavailable: ``BEAM_PREP_RESIZE_KERNEL=kernel`` and the kernel cannot run here.
      OptionsError: ``BEAM_PREP_RESIZE_KERNEL`` holds a value it does not take.
    """
    chosen = resample_loader.choice()
    if chosen == PILLOW:
        tally(PILLOW)
        return img.resize(size, RESAMPLE, box=box)
    loaded = resample_loader.load()
    if loaded.kernel is not None and _BROKEN.reason is None:
        try:
            resized = _by_kernel(loaded, img, size, box)
        except _Declined as e:  # this image only: Pillow's loops resize it, and the run says why
            tally(fallback_key(e.reason))
            return img.resize(size, RESAMPLE, box=box)
        except MemoryError:  # the kernel's memory for this image: Pillow's loops try with theirs (or raise)
            tally(PILLOW)
            return img.resize(size, RESAMPLE, box=box)
        except Exception as e:  # noqa: BLE001 - a kernel that fails means Pillow's loops from here on, said once.
            _break(f"the resize kernel failed ({type(e).__name__}: {e}): please report it; "
                   f"{KERNEL_VARIABLE}={PILLOW} avoids it")
        else:
            if resized is not None:
                tally(KERNEL)
                return resized
            tally(PILLOW)  # Pillow's own shortcut or error, or an image the kernel does not take
            return img.resize(size, RESAMPLE, box=box)
    if chosen == KERNEL:
        raise KernelUnavailable(f"{KERNEL_VARIABLE}={KERNEL}, but {_why_not()}")
    reason = _BROKEN.reason or loaded.fallback
    tally(PILLOW if reason is None else fallback_key(reason))
    return img.resize(size, RESAMPLE, box=box)


def _break(reason: str) -> None:
    with _BROKEN.lock:
        if _BROKEN.reason is None:
            _BROKEN.reason = reason
            # A worker's log: the run's console line comes from the launcher, once (the manifest's resize_fallback).
            log.info("resizing with Pillow's own loops from now on, the same pixels: %s", reason)


class _Declined(Exception):
    """The kernel cannot take this image for ``reason`` (said once by the run); Pillow's loops resize it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


PADDED_LINES = ("Pillow pads its image lines (PILLOW_ALIGNMENT, or Image.core.set_alignment), which the "
                "kernel does not read: unset it for the kernel's speed")


def _by_kernel(loaded: resample_loader.Loaded, img: Image.Image, size: Any, box: Any) -> Image.Image | None:
    """``resize`` by the kernel; None where Pillow's own code must run: another mode, an empty
    image, arguments that are not plain numbers (Pillow's own conversions and errors answer), the
    errors Pillow raises (a size under 1, a box out of bounds or empty, MemoryError for sizes it
    refuses), its shortcuts for a box of the output's size (a crop), and pixels it cannot hand over
    without a copy. ``Image.resize``'s rule, then ``_imaging.c``'s for each call.

    Raises:
      _Declined: the image's lines are padded (``PADDED_LINES``).
    """
    rules = loaded.rules
    if img.mode not in _MODES or 0 in img.size or rules is None:
        return None
    plain = _plain_arguments(img.size, size, box)
    if plain is None:
        return None
    size, box = plain
    width, height = img.size
    out_w, out_h = size
    if (rules.tall_first and height > width * TALL and out_h < height
            and out_w >= 1 and out_h >= 1):  # Image.resize: vertically, then horizontally
        steps = [((width, height), (width, out_h), (0.0, box[1], _f32(width), box[3])),
                 ((width, out_h), size, (box[0], 0.0, box[2], _f32(out_h)))]
    else:
        steps = [((width, height), size, box)]
    if any(_pillows_own(rules, *step) for step in steps):
        return None
    img.load()
    if img.readonly:  # memory Pillow does not own: its export would crash (_pixels), so Pillow's loops
        return None
    if len(steps) == 1:
        horizontal, vertical = _needs_horizontal(*steps[0]), _needs_vertical(*steps[0])
        if not (horizontal or vertical):  # ImagingResampleInner's copy (the crop shortcut above takes it first)
            return None
    else:  # each its own _imaging.c call: the first vertical only, the second horizontal only
        horizontal, vertical = _needs_horizontal(*steps[1]), True
    # Pillow's own image, which the kernel writes (no copy): fill's zeros are a memset a line, where
    # new's are one of the whole block
    made = Image.core.fill(img.mode, size, 0)
    _LAST.forget()  # an earlier image's rows are no longer the last made
    rows = loaded.kernel.resample_image(img.im, made, rules.mode_name, _MODES[img.mode], width, height, out_w, out_h,
                                        *box, horizontal, vertical, len(steps) == 2)
    if rows is False:  # the source's lines are not one buffer: Pillow's export says why
        if _pixels(img, rules) is None:
            return None  # several blocks (over 16 MB by default)
        raise _Declined(PADDED_LINES)
    resized = Image.Image()._new(made)
    if rows is not None:
        _LAST.keep(resized, rows)
    return resized


def kernel_pixels(img: Image.Image, just_made: bool = False) -> tuple[ModuleType, Any, int, object] | None:
    """The kernel and a view of ``img``'s pixels (a buffer), for the kernel's other work on the image as it
    is (the perceptual hash): ``(kernel, pixels, pixelsize, keep_alive)``, or None where the
    resize would not run in the kernel (not built or not chosen, a Pillow not checked, broken,
    another mode, an empty image, pixels Pillow cannot hand over, padded lines).
    ``keep_alive`` must stay alive while ``pixels`` is read.

    ``just_made``: ``img`` is the image this thread's last ``resize`` returned (the caller's word);
    its pixels are then read where the kernel wrote them, the image's own memory (kept alive by
    the buffer), not exported from Pillow again."""
    if img.mode not in _MODES or 0 in img.size or _BROKEN.reason is not None \
            or resample_loader.choice() == PILLOW:
        return None
    loaded = resample_loader.load()
    if loaded.kernel is None or loaded.rules is None:
        return None
    rows = _LAST.rows_of(img) if just_made else None
    if rows is not None:
        return loaded.kernel, rows, _MODES[img.mode], None
    img.load()
    try:
        pixels = _pixels(img, loaded.rules)
    except _Declined:
        return None
    if pixels is None:
        return None
    view, keep_alive = pixels
    return loaded.kernel, view, _MODES[img.mode], keep_alive


_FLOAT32 = struct.Struct("f")
_INTEGERS = (int, np.integer)
_REALS = (int, float, np.integer, np.floating)


def _f32(value: float) -> float:
    """``value`` rounded to float32 as C's ``(float)`` rounds it (an infinity past float32's range),
    held in a Python float: Pillow's C code takes the box as float32. Plain Python arithmetic,
    so numpy's scalar rules (which changed in numpy 2) play no part."""
    try:
        return _FLOAT32.unpack(_FLOAT32.pack(value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def _sub(a: float, b: float) -> float:
    """``a - b`` of two float32 values in float32, as C subtracts them (rounding the exact double
    difference once more is the same as rounding the exact one: 53 >= 2 * 24 + 2 bits)."""
    return _f32(a - b)


def _plain_arguments(in_size: tuple[int, int], size: Any, box: Any) -> tuple[tuple[int, int], tuple[float, ...]] | None:
    """``size`` and ``box`` as ``_imaging.c`` reads them (two C ints, four float32 values), where
    they are plain: a tuple or list of two ints in C's range, and None (``Image.resize``: the
    whole image) or a tuple or list of four finite real numbers. None for anything else (a float
    size, three corners, a NaN): Pillow's own code gives its answer, an image or its error."""
    if box is None:
        box = (0, 0, *in_size)
    if not isinstance(size, (tuple, list)) or not isinstance(box, (tuple, list)) or len(size) != 2 or len(box) != 4:
        return None
    if not all(isinstance(v, _INTEGERS) for v in size):
        return None
    out_w, out_h = int(size[0]), int(size[1])
    if not (-_INT_MAX - 1 <= out_w <= _INT_MAX and -_INT_MAX - 1 <= out_h <= _INT_MAX):
        return None  # Pillow's OverflowError
    if not all(isinstance(v, _REALS) for v in box):
        return None
    try:
        corners = tuple(_f32(float(v)) for v in box)
    except OverflowError:  # an int past a double's range
        return None
    if not all(math.isfinite(v) for v in corners):
        return None
    return (out_w, out_h), corners


def _pillows_own(rules: resample_loader.PillowRules, in_size: tuple[int, int], size: tuple[int, int],
                 box: tuple[float, ...]) -> bool:
    """Where one ``_imaging.c`` resize call does not resample as the kernel does: it raises (a size
    under 1, a box out of bounds or empty, MemoryError for sizes past its limits), or crops (a box of
    the output's size at whole pixels). Its comparisons of float32 with int, in float32."""
    width, height = in_size
    out_w, out_h = size
    b0, b1, b2, b3 = box
    if (out_w < 1 or out_h < 1 or b0 < 0 or b1 < 0 or b2 > _f32(width) or b3 > _f32(height)
            or _sub(b2, b0) < 0 or _sub(b3, b1) < 0):
        return True
    if (b0 == math.trunc(b0) and _sub(b2, b0) == _f32(out_w)
            and b1 == math.trunc(b1) and _sub(b3, b1) == _f32(out_h)):
        return True
    if out_w > _INT_MAX // 4 - 1:  # ImagingNewPrologueSubtype: MemoryError for the output and the pass between
        return True
    horizontal = rules.horizontal_always or _needs_horizontal(in_size, size, box)
    return _taps(b1, b3, out_h) is None or (horizontal and _taps(b0, b2, out_w) is None)


def _needs_horizontal(in_size: tuple[int, int], size: tuple[int, int], box: tuple[float, ...]) -> bool:
    return size[0] != in_size[0] or box[0] != 0 or box[2] != _f32(size[0])  # ImagingResampleInner's test


def _needs_vertical(in_size: tuple[int, int], size: tuple[int, int], box: tuple[float, ...]) -> bool:
    return size[1] != in_size[1] or box[1] != 0 or box[3] != _f32(size[1])


def _taps(in0: float, in1: float, out_size: int) -> int | None:
    """``precompute_coeffs``' taps a pixel for one axis; None where it raises MemoryError (or where
    its own check would overflow: Pillow's code decides)."""
    scale = _sub(in1, in0) / out_size  # the difference in float32, as Pillow takes it
    taps = math.ceil(2.0 * max(scale, 1.0)) * 2 + 1
    if taps * 8 > _INT_MAX or out_size > _INT_MAX // (taps * 8):
        return None
    return taps


class _Imaging11(ctypes.Structure):
    """The head of Pillow's ``struct ImagingMemoryInstance`` (libImaging/Imaging.h) before 12.0."""

    _fields_ = [("mode", ctypes.c_char * 7), ("type", ctypes.c_int), ("depth", ctypes.c_int),
                ("bands", ctypes.c_int), ("xsize", ctypes.c_int), ("ysize", ctypes.c_int),
                ("palette", ctypes.c_void_p), ("image8", ctypes.c_void_p), ("image32", ctypes.c_void_p),
                ("image", ctypes.c_void_p), ("block", ctypes.c_void_p), ("blocks", ctypes.c_void_p),
                ("pixelsize", ctypes.c_int), ("linesize", ctypes.c_int)]


class _Imaging12(ctypes.Structure):
    """The same from 12.0, where the mode is a number (``ModeID``)."""

    _fields_ = [("mode", ctypes.c_int), *_Imaging11._fields_[1:]]


def _check_lines(img: Image.Image, rules: resample_loader.PillowRules, base: int) -> None:
    """Checks that ``img``'s lines lie one after the other from ``base`` (the exported buffer), read
    from its line pointers: Pillow pads each line to ``PILLOW_ALIGNMENT`` bytes (and the first one
    may start past the block) where that was set when the image was made.

    Raises:
      _Declined: they do not (``PADDED_LINES``).
      RuntimeError: Pillow's struct is not laid out as this version's was (a bug of ours: the
        kernel stops, said once).
    """
    width, height = img.size
    pixelsize = _MODES[img.mode]
    layout = _Imaging11 if rules.mode_name else _Imaging12
    head = layout.from_address(_capsule_pointer(img.im.ptr, b"Pillow Imaging"))
    lines = head.image8 if pixelsize == 1 else head.image32
    if ((head.xsize, head.ysize, head.pixelsize, head.linesize) != (width, height, pixelsize, width * pixelsize)
            or not lines or lines != head.image):
        # Not the layout this version was checked with: a bug of ours, said once by the run
        raise RuntimeError(f"Pillow's image struct is not the one {resample_loader.pillow_build()} was checked with")
    pointers = np.frombuffer((ctypes.c_void_p * height).from_address(lines), np.uintp)
    expected = np.arange(height, dtype=np.uintp) * np.uintp(width * pixelsize) + np.uintp(base)
    if not np.array_equal(pointers, expected):
        raise _Declined(PADDED_LINES)


def _pixels(img: Image.Image, rules: resample_loader.PillowRules) -> tuple[np.ndarray, object] | None:
    """A view of ``img``'s pixels in Pillow's own memory (1 or 4 bytes each), with the object that
    must stay alive while it is used; None where Pillow cannot export them without a copy (an
    image stored in several blocks: over 16 MB by default).

    An image over memory Pillow does not own (``Image.frombuffer``, ``fromarray``: ``readonly``)
    is never exported: Pillow 12.3's export crashes the process on one; nor is an empty one
    (its export reads a block that does not exist). The lines are checked to lie one after the
    other (``_check_lines``): Pillow's export hands over the first block as if they did.

    Raises:
      _Declined: the lines are padded.
    """
    if img.readonly or 0 in img.size:
        return None
    try:
        capsule = img.im.__arrow_c_array__()  # the array alone: Image's own method makes a schema too
    except (ValueError, AttributeError):
        return None
    array = _ArrowArray.from_address(_capsule_pointer(capsule, b"arrow_array"))
    pixelsize = _MODES[img.mode]
    if array.n_children:  # RGB: a fixed-size list of 4 bytes a pixel; the bytes are its child's
        array = array.children[0].contents
        pixelsize = 1
    nbytes = img.size[0] * img.size[1] * _MODES[img.mode]
    if array.length * pixelsize != nbytes or array.offset or not array.buffers[1]:
        return None  # not the whole image in one buffer
    _check_lines(img, rules, array.buffers[1])
    buffer = (ctypes.c_uint8 * nbytes).from_address(array.buffers[1])
    return np.frombuffer(buffer, np.uint8), (capsule, img)


class _LastOutput(threading.local):
    """The last image this thread's kernel made, and its rows: the image's own memory, in a buffer
    that keeps it alive (``resample_image``'s), so that the perceptual hash of a resized image reads
    them without exporting the image's pixels again."""

    def __init__(self) -> None:
        self._image: weakref.ref[Image.Image] | None = None
        self._rows: memoryview | None = None

    def keep(self, image: Image.Image, rows: Any) -> None:
        self._image, self._rows = weakref.ref(image), rows

    def forget(self) -> None:
        self._image = self._rows = None

    def rows_of(self, image: Image.Image) -> Any:
        """``image``'s rows if it is the last image made here; else None."""
        if self._image is None or self._image() is not image:
            return None
        return self._rows


_LAST = _LastOutput()
