"""Our resize kernel against Pillow's own ``resize(size, BICUBIC, box=box)``: the same bytes.

The oracle is Pillow itself, on real photographs (Pillow's test images) and on
random geometry: odd sizes, sub-pixel boxes, up- and downscales, L and RGB.
Equality is the bound (the issue asked for 50 dB and 2 levels; the kernel does
Pillow's integer arithmetic, so anything short of equality is a bug). The
weights are checked against a plain-Python transcription of Pillow's C: that is
what makes the kernel's output the same on every CPU.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import math
import random
import sys

import numpy as np
import pytest
from children.resample_fuzz import hostile_calls, outcome
from PIL import Image, ImageOps

from beam_prep.errors import KernelUnavailable, OptionsError
from beam_prep.write.images import resample, resample_loader

BICUBIC = Image.Resampling.BICUBIC


@pytest.fixture(scope="module")
def kernel():
    """The kernel as this checkout built it (``python setup.py build_ext --inplace``, or the
    editable install): the tests hold it against the installed Pillow, which must be a checked one."""
    loaded = resample_loader.load()
    assert loaded.kernel is not None, (f"{loaded.fallback} (in a checkout: python setup.py build_ext "
                                       "--inplace)")
    return loaded


@pytest.fixture(scope="module")
def photos(pillow_images):
    """Real photographs and scans from Pillow's test images, upright, in L and RGB."""
    names = [n for n in pillow_images.names if n.lower().endswith((".jpg", ".jpeg"))
             and not any(bad in n for bad in ("truncated", "broken", "corrupt", "invalid"))]
    images = []
    for name in names[:24]:
        try:
            with Image.open(pillow_images.path(name)) as img:
                img = ImageOps.exif_transpose(img.convert("RGB"))
        except OSError:  # a test file that is damaged on purpose
            continue
        images += [(name, img), (name, img.convert("L"))]
    assert len(images) >= 30
    return images


def random_box(rng: random.Random, width: int, height: int) -> tuple[float, float, float, float]:
    x0, y0 = rng.uniform(0, width * 0.4), rng.uniform(0, height * 0.4)
    return x0, y0, rng.uniform(x0 + 0.01, width), rng.uniform(y0 + 0.01, height)


def assert_same(got: Image.Image, want: Image.Image, case: str) -> None:
    assert (got.mode, got.size) == (want.mode, want.size), case
    if got.tobytes() != want.tobytes():
        diff = np.abs(np.asarray(got, np.int16) - np.asarray(want, np.int16))
        pytest.fail(f"{case}: {np.count_nonzero(diff)} values differ, by up to {diff.max()}")


def test_the_kernel_loads_and_says_so(kernel):
    assert resample.available() == resample.KERNEL
    assert resample_loader.pillow_build().split()[1] in resample_loader.CHECKED_PILLOW


def test_photos_resize_to_pillows_bytes(kernel, photos):
    rng = random.Random(7)
    for name, img in photos:
        width, height = img.size
        for size in [(224, 224), (rng.randint(1, 97), rng.randint(1, 97)),  # downscales, odd sizes
                     (width * 2 + 1, height + 3)]:  # an upscale
            box = random_box(rng, width, height)
            got = resample._by_kernel(kernel, img, size, box)
            assert got is not None, name
            assert_same(got, img.resize(size, BICUBIC, box=box), f"{name} {img.mode} {size} {box}")


@pytest.mark.parametrize("mode", ["L", "RGB"])
def test_random_geometry_resizes_to_pillows_bytes(kernel, mode):
    rng = random.Random(mode)
    pixels = np.random.default_rng(len(mode))
    for case in range(250):
        width, height = rng.randint(1, 260), rng.randint(1, 260)
        shape = (height, width, 3) if mode == "RGB" else (height, width)
        img = Image.fromarray(pixels.integers(0, 256, shape, dtype=np.uint8)).copy()
        box = random.choice([(0, 0, width, height), random_box(rng, width, height),
                             (0.5, 0, width - 0.25, height)])
        size = (rng.choice([1, 2, rng.randint(1, 40), rng.randint(1, 600)]),
                rng.choice([1, 3, rng.randint(1, 40), rng.randint(1, 600)]))
        want = img.resize(size, BICUBIC, box=box)
        got = resample._by_kernel(kernel, img, size, box)
        if got is None:  # Pillow's own shortcut: a box of the output's size at whole pixels
            assert box == (0, 0, width, height) and size == (width, height)
            continue
        assert_same(got, want, f"case {case}: {mode} {width}x{height} {box} -> {size}")


@pytest.mark.parametrize("mode", ["L", "RGB"])
def test_one_pass_resizes_match_pillows(kernel, mode):
    """A box as wide as the output needs no horizontal pass, one as tall no vertical pass:
    Pillow then skips it, and so must the kernel, bounds unshifted."""
    img = Image.effect_mandelbrot((157, 119), (-2, -1, 1, 1), 80).convert(mode)
    for size, box in [((157, 61), (0, 0, 157, 119)), ((157, 300), (0, 3.5, 157, 110)),
                      ((40, 119), (0, 0, 157, 119)), ((400, 119), (2.25, 0, 150, 119))]:
        got = resample._by_kernel(kernel, img, size, box)
        assert got is not None
        assert_same(got, img.resize(size, BICUBIC, box=box), f"{mode} {size} {box}")


def _pillow_weights(in_size: int, in0: float, in1: float, out_size: int) -> tuple[list, list]:
    """libImaging/Resample.c's precompute_coeffs and normalize_coeffs_8bpc, line by line, in
    Python's IEEE doubles (never fused): the weights every CPU must compute."""
    def bicubic(x: float) -> float:
        a = -0.5
        x = abs(x)
        if x < 1.0:
            return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
        if x < 2.0:
            return (((x - 5) * x + 8) * x - 4) * a
        return 0.0

    in0, in1 = float(np.float32(in0)), float(np.float32(in1))
    scale = float(np.float32(in1) - np.float32(in0)) / out_size
    filterscale = max(scale, 1.0)
    support = 2.0 * filterscale
    ksize = math.ceil(support) * 2 + 1
    bounds, weights = [], []
    for xx in range(out_size):
        center = in0 + (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        k = [bicubic((x + xmin - center + 0.5) * (1.0 / filterscale)) for x in range(xmax)]
        total = 0.0
        for w in k:
            total += w
        if total != 0.0:
            k = [w / total for w in k]
        ints = [int(-0.5 + w * (1 << 22)) if w < 0 else int(0.5 + w * (1 << 22)) for w in k]
        bounds.append([xmin, xmax])
        weights.append(ints + [0] * (ksize - xmax))
    return bounds, weights


def _coefficients(kernel, in_size: int, in0: float, in1: float, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's bounds and integer weights for one axis, by its ``coefficients`` entry point
    (the fill ``resample_image`` runs for each axis)."""
    taps = resample._taps(in0, in1, out_size)
    bounds, weights = np.empty((out_size, 2), np.int32), np.empty((out_size, taps), np.int32)
    kernel.coefficients(in_size, in0, in1, out_size, taps, bounds, weights)
    return bounds, weights


def test_weights_are_pillows_in_plain_doubles(kernel):
    rng = random.Random(3)
    for _ in range(400):
        in_size = rng.randint(1, 3000)
        in0 = rng.choice([0.0, rng.uniform(0, in_size / 2)])
        in1 = rng.choice([float(in_size), rng.uniform(in0 + 1e-3, in_size)])
        out_size = rng.randint(1, 700)
        bounds, weights = _coefficients(kernel.kernel, in_size, np.float32(in0), np.float32(in1), out_size)
        want_bounds, want_weights = _pillow_weights(in_size, in0, in1, out_size)
        assert bounds.tolist() == want_bounds, (in_size, in0, in1, out_size)
        assert weights.tolist() == want_weights, (in_size, in0, in1, out_size)


def test_threads_resize_at_once_without_sharing_scratch(kernel, photos):
    """Workers on Dataflow run several threads; the kernel releases the GIL and keeps its
    scratch arrays per thread."""
    jobs = [(img, (rng_size, rng_size + 7), (1.5, 2.25, img.width - 1.0, img.height - 0.5))
            for (_name, img), rng_size in zip(photos, range(40, 400, 11))]

    def resize_all(_):
        return [resample.resize(img, size, box).tobytes() for img, size, box in jobs]

    want = [img.resize(size, BICUBIC, box=box).tobytes() for img, size, box in jobs]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for got in pool.map(resize_all, range(8)):
            assert got == want


def test_pillow_resizes_what_the_kernel_cannot_take(kernel):
    rgb = Image.effect_mandelbrot((600, 400), (-2, -1, 1, 1), 60).convert("RGB")
    cases = {
        "memory Pillow does not own": Image.fromarray(np.asarray(rgb.convert("L"))),
        "a mode the kernel has no loop for": rgb.convert("RGBA"),
        "several memory blocks": rgb.resize((3000, 1800)),  # 21.6 MB, over Pillow's 16 MB block
    }
    for case, img in cases.items():
        box = (3.5, 1.25, img.width - 2.0, img.height - 10.0)
        assert resample._by_kernel(kernel, img, (224, 224), box) is None, case
        assert_same(resample.resize(img, (224, 224), box), img.resize((224, 224), BICUBIC, box=box), case)
    with pytest.raises(ValueError, match="box can't exceed original image size"):
        resample.resize(rgb, (10, 10), (0, 0, 601, 400))




def _strip_cases(rng: random.Random) -> list[tuple[int, int, tuple[float, ...], tuple[int, int]]]:
    """Geometry where Pillow's rules branch: strips past 100:1 both ways (Pillow 12.2+ resizes the
    tall ones vertically first), one-pixel sides, and up- and downscales of each."""
    cases = [(3, 647, (0, 0, 3, 647), (12, 13)),  # the strip: 43 of 156 bytes differed
             (1, 101, (0, 0, 1, 101), (1, 100)), (1, 101, (0, 0, 1, 101), (5, 100)),
             (2, 200, (0, 0, 2, 200), (2, 200)), (2, 201, (0, 0, 2, 201), (3, 400))]  # just past 100:1; upscales
    for _ in range(120):
        thin, long = rng.choice([1, 1, 2, 3, 5, 9]), rng.randint(90, 3000)
        width, height = (thin, long) if rng.random() < 0.6 else (long, thin)
        box = rng.choice([(0, 0, width, height), random_box(rng, width, height),
                          (0, 0.5, width, height - 0.25), (0.25, 0, width, height)])
        size = (rng.choice([1, rng.randint(1, 8), rng.randint(1, 300)]),
                rng.choice([1, rng.randint(1, 8), rng.randint(1, 300)]))
        cases.append((width, height, box, size))
    return cases


@pytest.mark.parametrize("mode", ["L", "RGB"])
def test_strips_and_one_pixel_sides_resize_to_pillows_bytes(kernel, mode):
    rng = random.Random(f"strips {mode}")
    pixels = np.random.default_rng(11)
    resized = 0
    for width, height, box, size in _strip_cases(rng):
        shape = (height, width, 3) if mode == "RGB" else (height, width)
        img = Image.fromarray(pixels.integers(0, 256, shape, dtype=np.uint8)).copy()
        got = resample._by_kernel(kernel, img, size, box)
        want = img.resize(size, BICUBIC, box=box)
        if got is None:  # Pillow's own crop: a box of the output's size at whole pixels (in either step)
            continue
        resized += 1
        assert_same(got, want, f"{mode} {width}x{height} {box} -> {size}")
    assert resized >= 100


def test_the_tall_strip_rule_is_what_makes_the_bytes_pillows(kernel):
    """The same strip with the pass order of Pillow before 12.2: other bytes, so the rule is needed
    (and the test above would catch its absence) with the Pillow installed here."""
    if not kernel.rules.tall_first:
        pytest.skip("this Pillow resizes every image horizontally first")
    img = Image.fromarray(np.random.default_rng(5).integers(0, 256, (647, 3, 3), dtype=np.uint8)).copy()
    want = img.resize((12, 13), BICUBIC, box=(0, 0, 3, 647))
    assert resample._by_kernel(kernel, img, (12, 13), (0, 0, 3, 647)).tobytes() == want.tobytes()
    horizontal_first = dataclasses.replace(kernel, rules=dataclasses.replace(kernel.rules, tall_first=False))
    assert resample._by_kernel(horizontal_first, img, (12, 13), (0, 0, 3, 647)).tobytes() != want.tobytes()


def test_counting_says_what_resized_each_image(kernel, monkeypatch):
    img = Image.effect_mandelbrot((60, 40), (-2, -1, 1, 1), 30)
    with resample.counting() as counted:
        resample.resize(img, (20, 10), (0.5, 0, 60, 40))
        resample.resize(img.convert("RGBA"), (20, 10), (0.5, 0, 60, 40))  # no loop for RGBA: Pillow's
        monkeypatch.setenv(resample.KERNEL_VARIABLE, resample.PILLOW)
        resample.resize(img, (20, 10), (0.5, 0, 60, 40))
    assert counted == {resample.KERNEL: 1, resample.PILLOW: 2}
    assert resample.summary(counted.items()) == {"resize_kernel": {"kernel": 1, "pillow": 2}, "resize_fallback": []}
    assert resample.summary([("kernel", 5)]) == {"resize_kernel": "kernel", "resize_fallback": []}
    assert resample.summary([]) == {"resize_kernel": "none", "resize_fallback": []}
    assert resample.summary([(resample.fallback_key("why"), 2), (resample.PILLOW, 1)]) == {
        "resize_kernel": "pillow", "resize_fallback": ["why"]}


@pytest.mark.parametrize("value", ["Pillow", "off", "numba", "KERNEL", " pillow"])
def test_unknown_kernel_choices_are_refused(monkeypatch, value):
    monkeypatch.setenv(resample.KERNEL_VARIABLE, value)
    with pytest.raises(OptionsError, match=f"BEAM_PREP_RESIZE_KERNEL must be pillow or kernel .*not {value!r}"):
        resample.check_choice()
    with pytest.raises(OptionsError):
        resample.resize(Image.new("L", (9, 9)), (3, 3), (0, 0, 9, 9))
    from beam_prep.write.run.write_image_dataset import WriteImageDataset

    with pytest.raises(OptionsError, match="BEAM_PREP_RESIZE_KERNEL must be"):
        WriteImageDataset("/nonexistent/out", ["cat"], image_size=16)


class _FailingImport:
    """A finder that makes the extension's import raise ``error``, as a broken build would."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def find_spec(self, name, path=None, target=None):
        if name == resample_loader.EXTENSION:
            raise self.error


@pytest.fixture
def reload_kernel(monkeypatch):
    """``resample_loader.load`` found again under the test's conditions, and again after it."""
    monkeypatch.delitem(sys.modules, resample_loader.EXTENSION, raising=False)
    monkeypatch.delenv(resample.KERNEL_VARIABLE, raising=False)
    resample_loader.load.cache_clear()
    yield
    resample_loader.load.cache_clear()


@pytest.mark.parametrize("state, reason", [
    ("not built", "the resize kernel is not built in this install: reinstall beam-prep where a C compiler"),
    ("import fails", "the resize kernel cannot load (RuntimeError: undefined symbol: clip8)"),
    ("unchecked Pillow", "Pillow 99.0.0 is not a version the resize kernel was checked against"),
])
def test_without_the_kernel_pillow_resizes_the_same_bytes_and_says_why(reload_kernel, monkeypatch, state, reason):
    if state == "not built":
        monkeypatch.setitem(sys.modules, resample_loader.EXTENSION, None)  # ModuleNotFoundError, as unbuilt
    elif state == "import fails":
        monkeypatch.setattr(sys, "meta_path", [_FailingImport(RuntimeError("undefined symbol: clip8")), *sys.meta_path])
    else:
        monkeypatch.setattr(resample_loader, "pillow_build", lambda: "pillow 99.0.0")
    img = Image.effect_mandelbrot((300, 200), (-2, -1, 1, 1), 50).convert("RGB")
    box = (2.5, 1, 290, 199)
    with resample.counting() as counted:
        got = resample.resize(img, (64, 48), box)
    assert got.tobytes() == img.resize((64, 48), BICUBIC, box=box).tobytes()
    ((key, n),) = counted.items()
    assert n == 1 and key.startswith(resample.fallback_key(reason)), key
    assert resample.available() == resample.PILLOW
    monkeypatch.setenv(resample.KERNEL_VARIABLE, resample.KERNEL)
    with pytest.raises(OptionsError, match=f"BEAM_PREP_RESIZE_KERNEL=kernel, but {reason[:30]}"):
        resample.check_choice()
    with pytest.raises(KernelUnavailable):
        resample.resize(img, (64, 48), box)


def test_a_kernel_failing_at_work_hands_over_to_pillow_once(kernel, monkeypatch, caplog):
    class Failing:
        def resample_image(self, *args):
            raise RuntimeError("a bug in the kernel")

    monkeypatch.setattr(resample, "_BROKEN", resample._Broken())
    monkeypatch.setattr(resample_loader, "load", lambda: dataclasses.replace(kernel, kernel=Failing()))
    img = Image.effect_mandelbrot((120, 80), (-2, -1, 1, 1), 50)
    with caplog.at_level(logging.INFO, logger=resample.__name__), resample.counting() as counted:
        for _ in range(3):
            assert resample.resize(img, (50, 30), (1, 1, 119, 79)).tobytes() == img.resize(
                (50, 30), BICUBIC, box=(1, 1, 119, 79)).tobytes()
    ((key, n),) = counted.items()
    assert n == 3 and "the resize kernel failed (RuntimeError: a bug in the kernel)" in key
    assert len([r for r in caplog.records if "Pillow's own loops" in r.getMessage()]) == 1


# --- any input: what Pillow does, per call, the kernel left on ----------------------------------


@pytest.fixture
def fresh_kernel(kernel, monkeypatch):
    """The kernel, on, with no earlier test's failure carried over: a test can see it turn off."""
    monkeypatch.setattr(resample, "_BROKEN", resample._Broken())
    monkeypatch.delenv(resample.KERNEL_VARIABLE, raising=False)
    return kernel


def _assert_like_pillow(img: Image.Image, size, box, case: str) -> collections.Counter:
    with resample.counting() as counted:
        got = outcome(resample.resize, img, size, box)
    want = outcome(img.resize, size, BICUBIC, box=box)
    assert got == want, f"{case}: the kernel gave {got[:3]}, Pillow {want[:3]}"
    assert resample._BROKEN.reason is None, f"{case}: {resample._BROKEN.reason}"
    return counted


@pytest.mark.parametrize("mode", ["L", "RGB"])
def test_an_empty_image_resizes_as_pillow_does(fresh_kernel, mode):
    """A side of 0: Pillow's answer (a black image, or its error), where the kernel's export crashed."""
    for empty in [(0, 5), (5, 0), (0, 0)]:
        img = Image.new(mode, empty)
        for size, box in [((3, 3), None), ((3, 3), (0, 0, *empty)), ((1, 7), (0, 0, 0, 0)), (empty, None)]:
            counted = _assert_like_pillow(img, size, box, f"{mode} {empty} -> {size} {box}")
            assert resample.KERNEL not in counted


@pytest.mark.parametrize("mode, width", [("L", 61), ("RGB", 45), ("L", 64)])
def test_padded_lines_are_read_where_pillow_put_them(fresh_kernel, mode, width):
    """PILLOW_ALIGNMENT (here Image.core.set_alignment, as Pillow applies it) pads each line of an
    image made meanwhile: its pixels are Pillow's, and where they are padded the run says why."""
    pixels = np.random.default_rng(width).integers(0, 256, (50, width, 3) if mode == "RGB" else (50, width),
                                                   dtype=np.uint8)
    previous = Image.core.get_alignment()
    Image.core.set_alignment(64)
    try:
        img = Image.fromarray(pixels).copy()
    finally:
        Image.core.set_alignment(previous)
    counted = _assert_like_pillow(img, (20, 17), (0.5, 1, width - 1, 49.5), f"{mode} {width} wide")
    if width * resample._MODES[mode] % 64:
        assert counted == {resample.fallback_key(resample.PADDED_LINES): 1}
    summary = resample.summary(counted.items())
    assert summary["resize_fallback"] in ([], [resample.PADDED_LINES])


@pytest.mark.parametrize("size, box", [
    ((24, 16), (math.nan, 0, 50, 40)), ((24, 16), (0, 0, 50, math.nan)),  # a NaN corner
    ((24.0, 16), (0.5, 0, 50, 40)), ((24, 16.5), None),  # a float size
    ((24, 16), None), ([24, 16], [0.5, 0, 50, 40]),  # box=None: the whole image; lists
    ((24, 16), (0.5, 0, 50)), ((24, 16), (0.5, 0, 50, 40, 1)), ((24,), None),  # a size or box of another length
    ((24, 16), (0, 0, math.inf, 40)), ((24, 16), (0, 0, 2**1100, 40)), ((24, 16), (0, 0, "50", 40)),
    ((2**40, 16), None), ((0, 16), None), ((24, -1), None),  # past C's int, under 1
    ((np.int64(24), np.uint8(16)), (np.float32(0.5), np.int32(0), np.float64(50), 40)),  # numpy scalars
    ((24, 16), (-0.5, 0, 50, 40)), ((24, 16), (0, 0, 60.25, 40)), ((24, 16), (30, 0, 20, 40)),  # out of bounds
])
def test_odd_arguments_get_pillows_answer_and_leave_the_kernel_on(fresh_kernel, size, box):
    img = Image.effect_mandelbrot((60, 40), (-2, -1, 1, 1), 30).convert("RGB")
    _assert_like_pillow(img, size, box, f"{size} {box}")
    with resample.counting() as counted:
        resample.resize(img, (24, 16), (0.5, 0, 50, 40))
    assert counted == {resample.KERNEL: 1}


@pytest.mark.parametrize("size", [(600_000_000, 2), (10, 60_000_000), (2**29, 1)])
def test_sizes_pillow_refuses_raise_its_memory_error(fresh_kernel, size):
    """Output sizes past Pillow's limits (its weights' buffer, its image's line): its MemoryError."""
    img = Image.effect_mandelbrot((60, 40), (-2, -1, 1, 1), 30)
    _assert_like_pillow(img, size, None, f"{size}")


def test_pillow_11_raises_memory_error_for_weights_it_computes_and_does_not_use(fresh_kernel):
    """Before 12.0, ImagingResampleInner computed the horizontal weights even where no horizontal
    pass runs: past precompute_coeffs' limit (INT_MAX / (5 taps * 8) outputs) it raised MemoryError
    for a resize that 12.x does; the kernel follows each version's rule."""
    width = 2**31 // 40 + 1
    size, box = (width, 1), (0.0, 0.5, float(width), 1.0)  # a vertical pass only
    checked = resample_loader.CHECKED_PILLOW
    assert resample._pillows_own(checked["11.3.0"], (width, 1), size, box)
    assert not resample._pillows_own(checked["12.3.0"], (width, 1), size, box)
    if fresh_kernel.rules.horizontal_always:  # that Pillow installed: its own MemoryError, through resize
        _assert_like_pillow(Image.new("L", (width, 1)), size, box, "a vertical pass only")


def test_a_side_past_float32s_integers_compares_as_pillows_c_does(fresh_kernel):
    """16,777,217 is not a float32: Pillow compares the box (float32) with the size (int) in
    float32, where both are 16,777,216, and skips the horizontal pass; numpy 1.26 compared a
    float32 scalar with a Python int in float64 and took it."""
    width = 2**24 + 1
    box = (0.0, 0.0, float(np.float32(width)), 1.0)
    assert not resample._needs_horizontal((width, 1), (width, 2), box)
    img = Image.frombytes("L", (width, 1), np.random.default_rng(24).integers(0, 256, width, np.uint8).tobytes())
    counted = _assert_like_pillow(img, (width, 2), None, "16,777,217 x 1 -> x 2")
    assert counted == {resample.KERNEL: 1}


def test_resample_image_writes_pillows_pixels_into_the_image_it_is_given_and_keeps_it_alive(kernel):
    """The whole resize in one C call: Pillow's bytes, written into the image core it is given, and
    those rows handed back as a read-only buffer that keeps the image alive after the image is gone."""
    img = Image.effect_mandelbrot((60, 40), (-2, -1, 1, 1), 30).convert("RGB")
    tall = Image.effect_mandelbrot((4, 900), (-2, -1, 1, 1), 30)
    for src, size, box, passes in [(img, (24, 16), (0.5, 0.0, 50.0, 40.0), (True, True, False)),
                                   (img, (60, 16), (0.0, 0.25, 60.0, 39.5), (False, True, False)),
                                   (img, (24, 40), (1.0, 0.0, 59.0, 40.0), (True, False, False)),
                                   (tall, (3, 30), (0.0, 0.0, 4.0, 900.0), (True, True, True))]:
        want = src.resize(size, BICUBIC, box=box) if not passes[2] else src.resize(
            (src.width, size[1]), BICUBIC, box=(0, box[1], src.width, box[3])).resize(
            size, BICUBIC, box=(box[0], 0, box[2], size[1]))
        made = Image.core.fill(src.mode, size, 0)
        channels = resample._MODES[src.mode]
        rows = kernel.kernel.resample_image(src.im, made, kernel.rules.mode_name, channels, *src.size, *size, *box,
                                            *passes)
        resized = Image.Image()._new(made)
        assert_same(resized, want, f"{src.mode} {src.size} -> {size} {box} {passes}")
        view = memoryview(rows)
        assert view.readonly and view.nbytes == size[0] * size[1] * channels
        expected = bytes(view)
        del made, resized, view
        assert bytes(memoryview(rows)) == expected  # the image's memory, alive as long as its rows


def test_resample_image_refuses_what_is_not_a_pillow_image_or_an_int(kernel):
    img = Image.new("L", (10, 8))
    named = kernel.rules.mode_name
    with pytest.raises(TypeError):
        kernel.kernel.resample_image(object(), img.im, named, 1, 10, 8, 10, 8, 0.0, 0.5, 10.0, 8.0, False, True, False)
    with pytest.raises(TypeError):
        kernel.kernel.resample_image(img.im, b"\0" * 80, named, 1, 10, 8, 10, 8, 0.0, 0.5, 10.0, 8.0, False, True,
                                     False)
    with pytest.raises(OverflowError):
        kernel.kernel.resample_image(img.im, Image.new("L", (4, 3)).im, named, 1, 2**40, 8, 4, 3, 0.0, 0.0, 10.0, 8.0,
                                     True, True, False)


def test_the_c_entry_points_refuse_hostile_arguments(kernel):
    """Sizes whose products or sums overflow, bounds outside the source, aliasing buffers, a NaN
    box, out_size 0: a ValueError each, never a read or write outside a buffer (the sanitizer build
    runs the same calls, tests/write/test_resample_sanitized.py)."""
    for name, call in hostile_calls(kernel.kernel).items():
        with pytest.raises(ValueError):
            call()
            pytest.fail(f"{name}: accepted")
    img = Image.effect_mandelbrot((60, 40), (-2, -1, 1, 1), 30)
    assert_same(resample._by_kernel(kernel, img, (24, 16), (0.5, 0, 50, 40)),
                img.resize((24, 16), BICUBIC, box=(0.5, 0, 50, 40)), "after the hostile calls")
