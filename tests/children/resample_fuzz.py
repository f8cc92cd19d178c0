"""The resize kernel against Pillow on any input: hostile calls of its C entry points, and a
differential fuzz of ``resample.resize`` against ``Image.resize``.

``hostile_calls`` is used in-process by ``tests/write/test_resample.py`` and here. Run as a child
(``python -m tests.children.resample_fuzz --extension FILE``), it loads the kernel from the extension file it is given (the sanitizer build of
``tests/write/test_resample_sanitized.py``, under AddressSanitizer and UBSan), then resizes random
images with random geometry and arguments, odd ones included, a number of cases: each
outcome (the image's bytes, or the error's type and message) must be Pillow's, and the kernel
must stay on. It prints one summary line and exits 0, or raises at the first difference.
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import math
import random
import sys
from collections.abc import Callable

import numpy as np

INT_MAX = 2**31 - 1
SSIZE_MAX = 2**63 - 1


def _i32(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.int32)


def _u8(n: int) -> np.ndarray:
    return np.zeros(n, np.uint8)


def hostile_calls(kernel) -> dict[str, Callable[[], object]]:
    """Calls of the kernel's C entry points that each must refuse with ValueError: sizes
    whose products or sums overflow, bounds outside the source, aliasing buffers, NaN boxes."""
    from PIL import Image

    from beam_prep.write.images import resample_loader
    from beam_prep.write.images.phash import _DCT
    named = resample_loader.load().rules.mode_name  # the installed Pillow's image struct
    grey, small, rgb = Image.new("L", (10, 8)).im, Image.new("L", (4, 3)).im, Image.new("RGB", (10, 8)).im

    def whole(src=grey, dst=small, channels=1, sizes=(10, 8, 4, 3), box=(0.0, 0.0, 10.0, 8.0), passes=(True, True, False),
              mode_name=named):
        return kernel.resample_image(src, dst, mode_name, channels, *sizes, *box, *passes)

    bounds = np.array([[0, 2]], np.int32)
    weights = np.array([[1 << 21, 1 << 21, 0, 0, 0]], np.int32)
    shared = _u8(64)
    return {
        "phash: width * height overflows": lambda: kernel.phash(_u8(64), 2**30, 2**30, 4, _DCT),
        "phash: pixels too small": lambda: kernel.phash(_u8(64), 9, 9, 1, _DCT),
        "phash: 3 bytes a pixel": lambda: kernel.phash(_u8(64), 4, 4, 3, _DCT),
        "phash: no pixel": lambda: kernel.phash(_u8(64), 0, 4, 1, _DCT),
        "phash: dct too small": lambda: kernel.phash(_u8(64), 4, 4, 1, np.zeros(8)),
        "phash: thumbnail too small": lambda: kernel.phash(_u8(64), 4, 4, 1, _DCT, _u8(1023)),
        "coefficients: out_size 0 (a division by zero)": lambda: kernel.coefficients(
            10, 0.0, 10.0, 0, 5, _i32(1, 2), _i32(1, 5)),
        "coefficients: negative out_size": lambda: kernel.coefficients(10, 0.0, 10.0, -3, 5, _i32(1, 2), _i32(1, 5)),
        "coefficients: NaN box": lambda: kernel.coefficients(10, math.nan, 10.0, 4, 5, _i32(4, 2), _i32(4, 5)),
        "coefficients: box past the source": lambda: kernel.coefficients(10, 0.0, 1e30, 4, 5, _i32(4, 2), _i32(4, 5)),
        "coefficients: inverted box": lambda: kernel.coefficients(10, 6.0, 4.0, 4, 5, _i32(4, 2), _i32(4, 5)),
        "coefficients: taps that are not the box's": lambda: kernel.coefficients(
            10, 0.0, 10.0, 4, 3, _i32(4, 2), _i32(4, 3)),
        "coefficients: buffers too small": lambda: kernel.coefficients(
            100, 0.0, 100.0, INT_MAX, 5, _i32(1, 2), _i32(1, 5)),
        "filter_rows: first + count overflows int": lambda: kernel.filter_rows(
            _u8(40), 10, 4, np.array([[INT_MAX - 1, 2]], np.int32), weights, 5, _u8(4), 1, _i32(4)),
        "filter_rows: negative first": lambda: kernel.filter_rows(
            _u8(40), 10, 4, np.array([[-1, 2]], np.int32), weights, 5, _u8(4), 1, _i32(4)),
        "filter_rows: count past taps": lambda: kernel.filter_rows(
            _u8(40), 10, 4, np.array([[0, 6]], np.int32), _i32(1, 5), 5, _u8(4), 1, _i32(4)),
        "filter_rows: src_rows * width overflows": lambda: kernel.filter_rows(
            _u8(40), 2**62, 4, np.array([[2**30, 2]], np.int32), weights, 5, _u8(4), 1, _i32(4)),
        "filter_rows: width * 4 overflows (acc)": lambda: kernel.filter_rows(
            _u8(40), 0, 2**62, bounds, weights, 5, _u8(4), 0, _i32(4)),
        "filter_rows: out_rows * taps * 4 overflows": lambda: kernel.filter_rows(
            _u8(40), 10, 4, bounds, weights, INT_MAX, _u8(4), INT_MAX, _i32(4)),
        "filter_rows: weights whose sum overflows 32 bits": lambda: kernel.filter_rows(
            np.full(40, 255, np.uint8), 10, 4, bounds, np.array([[INT_MAX, INT_MAX, 0, 0, 0]], np.int32), 5,
            _u8(4), 1, _i32(4)),
        "filter_rows: out is acc": lambda: kernel.filter_rows(
            _u8(40), 10, 4, bounds, weights, 5, shared[:16], 1, shared[:16].view(np.int32)),
        "filter_rows: out overlaps src": lambda: kernel.filter_rows(
            shared[:40], 10, 4, bounds, weights, 5, shared[36:40], 1, _i32(4)),
        "coefficients: bounds not aligned to 4 bytes": lambda: kernel.coefficients(
            10, 0.0, 10.0, 2, 21, _u8(17)[1:], _i32(2, 21)),
        "filter_rows: weights not aligned to 4 bytes": lambda: kernel.filter_rows(
            _u8(40), 10, 4, bounds, _u8(21)[1:], 5, _u8(4), 1, _i32(4)),
        "filter_rows: acc not aligned to 4 bytes": lambda: kernel.filter_rows(
            _u8(40), 10, 4, bounds, weights, 5, _u8(4), 1, _u8(17)[1:]),
        "transpose: y0 + rows overflows": lambda: kernel.transpose(_u8(100), 10, 10, SSIZE_MAX, 0, 1, 1, 1, _u8(1)),
        "transpose: x0 + cols overflows": lambda: kernel.transpose(_u8(100), 10, 10, 0, SSIZE_MAX, 1, 1, 1, _u8(1)),
        "transpose: src size overflows": lambda: kernel.transpose(_u8(100), 2**62, 4, 2**40, 0, 1, 1, 4, _u8(4)),
        "transpose: out size overflows": lambda: kernel.transpose(_u8(100), 2**40, 2**40, 0, 0, 2**40, 2**40, 1,
                                                                  _u8(1)),
        "transpose: block past the source": lambda: kernel.transpose(_u8(100), 10, 10, 8, 0, 3, 1, 1, _u8(3)),
        "transpose: itemsize 3": lambda: kernel.transpose(_u8(300), 10, 10, 0, 0, 1, 1, 3, _u8(3)),
        "transpose: out overlaps src": lambda: kernel.transpose(shared, 8, 8, 0, 0, 2, 2, 1, shared[60:64]),
        "filter_pixels: y0 + rows overflows": lambda: kernel.filter_pixels(
            _u8(40), 10, 1, SSIZE_MAX, 1, bounds[:, :1].copy(), weights, 5, _u8(4), 1),
        "filter_pixels: first + count overflows int": lambda: kernel.filter_pixels(
            _u8(40), 1, 10, 0, 1, np.array([[INT_MAX - 1, 2]], np.int32), weights, 5, _u8(4), 1),
        "filter_pixels: taps past the row": lambda: kernel.filter_pixels(
            _u8(40), 1, 10, 0, 1, np.array([[9, 2]], np.int32), weights, 5, _u8(4), 1),
        "filter_pixels: src size overflows": lambda: kernel.filter_pixels(
            _u8(40), 2**62, 2**40, 0, 1, bounds, weights, 5, _u8(4), 1),
        "filter_pixels: out size overflows": lambda: kernel.filter_pixels(
            _u8(40), 2, 5, 0, 2, bounds, weights, 5, _u8(4), 2**62),
        "filter_pixels: out too small": lambda: kernel.filter_pixels(_u8(40), 2, 5, 0, 2, bounds, weights, 5, _u8(4), 1),
        "filter_pixels: weights whose sum overflows 32 bits": lambda: kernel.filter_pixels(
            np.full(40, 255, np.uint8), 2, 5, 0, 1, bounds, np.array([[INT_MAX, INT_MAX, 0, 0, 0]], np.int32), 5,
            _u8(4), 1),
        "filter_pixels: out overlaps src": lambda: kernel.filter_pixels(
            shared[:40], 2, 5, 0, 1, bounds, weights, 5, shared[36:40], 1),
        "set_isa: an unknown instruction set": lambda: kernel.set_isa("avx1024"),
        "resample_image: the source is not that wide": lambda: whole(sizes=(11, 8, 4, 3)),
        "resample_image: the source is not that tall": lambda: whole(sizes=(10, 9, 4, 3)),
        "resample_image: dst is not that size": lambda: whole(sizes=(10, 8, 5, 3)),
        "resample_image: sizes past any image": lambda: whole(sizes=(INT_MAX, INT_MAX, INT_MAX, INT_MAX)),
        "resample_image: a side of 0": lambda: whole(sizes=(0, 8, 4, 3)),
        "resample_image: a negative side": lambda: whole(sizes=(10, 8, 4, -3)),
        "resample_image: 3 bytes a pixel": lambda: whole(channels=3),
        "resample_image: 4 bytes a pixel of an L image": lambda: whole(channels=4),
        "resample_image: 1 byte a pixel of an RGB image": lambda: whole(src=rgb),
        "resample_image: dst is src": lambda: whole(dst=grey, sizes=(10, 8, 10, 8), box=(0.5, 0.0, 10.0, 8.0)),
        "resample_image: the other Pillow's struct": lambda: whole(mode_name=not named),
        "resample_image: no pass": lambda: whole(sizes=(10, 8, 10, 8), passes=(False, False, False)),
        "resample_image: a side changed by no pass": lambda: whole(passes=(False, True, False)),
        "resample_image: vertical first with no vertical pass": lambda: whole(
            sizes=(10, 8, 4, 8), passes=(True, False, True)),
        "resample_image: NaN box": lambda: whole(box=(math.nan, 0.0, 10.0, 8.0)),
        "resample_image: box past the source": lambda: whole(box=(0.0, 0.0, 11.0, 8.0)),
        "resample_image: inverted box": lambda: whole(box=(0.0, 6.0, 10.0, 2.0)),
        "resample_image: negative box": lambda: whole(box=(-1.0, 0.0, 10.0, 8.0)),
    }


def outcome(resize: Callable[..., object], *args: object, **kwargs: object) -> tuple:
    """What ``resize(*args, **kwargs)`` gave: the image (mode, size, bytes), or the error (type, message)."""
    try:
        img = resize(*args, **kwargs)
    except Exception as e:
        return ("error", type(e).__name__, str(e))
    return ("image", img.mode, img.size, img.tobytes())


def _geometry(rng: random.Random) -> tuple[int, int]:
    shape = rng.random()
    if shape < 0.05:
        return rng.choice([(0, rng.randint(0, 9)), (rng.randint(0, 9), 0)])
    if shape < 0.25:  # strips past 100:1 both ways
        thin, long = rng.choice([1, 2, 3, 5]), rng.randint(90, 1500)
        return (thin, long) if rng.random() < 0.5 else (long, thin)
    return rng.randint(1, 200), rng.randint(1, 200)


def _box(rng: random.Random, width: int, height: int):
    kind = rng.random()
    if kind < 0.15:
        return None
    if kind < 0.25:
        return (0, 0, width, height)
    if kind < 0.3:  # odd arguments: Pillow's own answer
        return rng.choice([(0, 0, width), (math.nan, 0, width, height), (0, 0, math.inf, height),
                           (0, -1, width, height), (0, 0, width + 1, height), (2.0, 0, 1.0, height),
                           [0, 0, width, height], (np.float32(0.5), np.int64(0), width, height)])
    x0, y0 = rng.uniform(0, width * 0.5), rng.uniform(0, height * 0.5)
    return (x0, y0, rng.uniform(x0, width), rng.uniform(y0, height))


def _size(rng: random.Random, width: int, height: int):
    kind = rng.random()
    if kind < 0.04:
        return rng.choice([(0, 3), (3, -1), (2.0, 3), (3,), [5, 7], (np.int32(4), 9)])
    if kind < 0.1:
        return width, height
    return (rng.choice([1, 2, rng.randint(1, 40), rng.randint(1, 400)]),
            rng.choice([1, 3, rng.randint(1, 40), rng.randint(1, 400)]))


def fuzz(cases: int, seed: int) -> collections.Counter:
    """``cases`` random resizes, each compared with Pillow's; the counts of what resized.

    A count, not a time: the same seed checks the same cases on any machine, under any load."""
    from PIL import Image

    from beam_prep.write.images import resample
    from beam_prep.write.images.phash import _DCT

    rng = random.Random(seed)
    pixels = np.random.default_rng(seed)
    kernel = resample.resample_loader.load().kernel
    calls = hostile_calls(kernel)
    isas = kernel.isas()
    counted: collections.Counter = collections.Counter()
    for case_number in range(1, cases + 1):
        for name, call in calls.items() if case_number % 500 == 1 else ():
            try:
                call()
            except ValueError:
                continue
            raise AssertionError(f"{name}: no ValueError")
        kernel.set_isa(rng.choice(isas))  # each of the loops this CPU runs, in turn at random
        mode = rng.choice(["L", "RGB"])
        width, height = _geometry(rng)
        alignment = rng.choice([1, 1, 1, 4, 64])  # Pillow's line padding, as PILLOW_ALIGNMENT sets it
        Image.core.set_alignment(alignment)
        try:
            shape = (height, width, 3) if mode == "RGB" else (height, width)
            img = Image.fromarray(pixels.integers(0, 256, shape, dtype=np.uint8)).copy() if 0 not in shape \
                else Image.new(mode, (width, height))
        finally:
            Image.core.set_alignment(1)
        size, box = _size(rng, width, height), _box(rng, width, height)
        case = (f"case {case_number} ({kernel.get_isa()}): {mode} {width}x{height} (alignment {alignment}) size={size!r} "
                f"box={box!r}")
        with resample.counting() as counts:
            got = outcome(resample.resize, img, size, box)
        want = outcome(img.resize, size, Image.Resampling.BICUBIC, box=box)
        if got != want:
            raise AssertionError(f"{case}: the kernel gave {got[:3]!r}, Pillow {want[:3]!r}")
        if resample._BROKEN.reason is not None:
            raise AssertionError(f"{case}: the kernel turned off: {resample._BROKEN.reason}")
        if got[0] == "image" and 0 not in got[2]:  # the hash of what it made, and of its source
            made = resample.resize(img, size, box)
            for image, fresh in ((made, True), (img, False)):
                by_kernel = resample.kernel_pixels(image, just_made=fresh)
                if by_kernel is None:
                    continue
                thumbnail = np.zeros((32, 32), np.uint8)
                by_kernel[0].phash(by_kernel[1], image.width, image.height, by_kernel[2], _DCT, thumbnail)
                grey = image if image.mode == "L" else image.convert("L")
                if not np.array_equal(thumbnail, np.asarray(grey.resize((32, 32), Image.Resampling.BOX))):
                    raise AssertionError(f"{case}: the hash's thumbnail of {image.size} is not Pillow's")
                counted["hashed"] += 1
        counted.update(counts)
    counted["cases"] = cases
    return counted


def _load_extension(path: str) -> None:
    """Puts the extension at ``path`` in the kernel's place, before ``resample_loader`` imports it."""
    from beam_prep.write.images import resample_loader

    spec = importlib.util.spec_from_file_location(resample_loader.EXTENSION, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[resample_loader.EXTENSION] = module
    loaded = resample_loader.load()
    if loaded.kernel is not module or not getattr(module, "EXACT_SCRATCH", 0):
        raise SystemExit(f"the sanitizer build is not the kernel here: {loaded}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extension", required=True, help="the built _resample extension to load")
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    _load_extension(args.extension)
    counted = fuzz(args.cases, args.seed)
    print(f"fuzz: {counted['cases']} cases like Pillow's; resized by the kernel {counted['kernel']}, "
          f"by Pillow {sum(n for k, n in counted.items() if k.startswith('pillow'))}; "
          f"hashed by the kernel {counted['hashed']}")


if __name__ == "__main__":
    main()
