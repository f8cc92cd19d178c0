"""Each of the kernel's loops (scalar, SSE4.1, AVX2, AVX-512), forced in turn, gives the same
bytes as the scalar loops and as Pillow on the same inputs.

The vector loops do Pillow's integer arithmetic in 32-bit lanes, so anything short of equality is
a bug. A path this CPU (or this build) does not run is skipped, naming it.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
from PIL import Image, ImageOps

from beam_prep.errors import OptionsError
from beam_prep.write.images import resample, resample_loader

BICUBIC = Image.Resampling.BICUBIC


@pytest.fixture(scope="module")
def kernel():
    loaded = resample_loader.load()
    assert loaded.kernel is not None, f"{loaded.fallback} (in a checkout: python setup.py build_ext --inplace)"
    yield loaded
    resample_loader.use_isa(loaded.kernel, None)


@pytest.fixture(scope="module")
def cases(pillow_images):
    """Real photographs (Pillow's test images) and random pixels, L and RGB, at geometry that
    reaches every loop's tails: widths past and short of a whole vector, 1 to 30 taps, strips."""
    rng = random.Random(47)
    pixels = np.random.default_rng(47)
    images = []
    names = [n for n in pillow_images.names if n.lower().endswith((".jpg", ".jpeg"))
             and not any(bad in n for bad in ("truncated", "broken", "corrupt", "invalid"))]
    for name in names[:8]:
        try:
            with Image.open(pillow_images.path(name)) as img:
                img = ImageOps.exif_transpose(img.convert("RGB"))
        except OSError:  # a test file damaged on purpose
            continue
        images += [(name, img), (name, img.convert("L"))]
    for width, height in [(1, 1), (3, 70), (70, 3), (17, 33), (64, 64), (129, 95), (250, 7)]:
        rgb = Image.fromarray(pixels.integers(0, 256, (height, width, 3), dtype=np.uint8)).copy()
        images += [(f"random {width}x{height}", rgb), (f"random {width}x{height}", rgb.convert("L"))]
    out = []
    for name, img in images:
        width, height = img.size
        for _ in range(4):
            x0, y0 = rng.uniform(0, width * 0.3), rng.uniform(0, height * 0.3)
            box = rng.choice([None, (x0, y0, rng.uniform(x0 + 0.01, width), rng.uniform(y0 + 0.01, height))])
            size = (rng.choice([1, 2, 5, rng.randint(1, 40), rng.randint(1, 300)]),
                    rng.choice([1, 3, 7, rng.randint(1, 40), rng.randint(1, 300)]))
            out.append((f"{name} {img.mode} {img.size} {box} -> {size}", img, size, box))
    out.append(("224 of a 1024x768 photograph", images[0][1].resize((1024, 768)), (224, 224), None))
    return out


@pytest.fixture(scope="module")
def scalar_bytes(kernel, cases):
    resample_loader.use_isa(kernel.kernel, "scalar")
    return [resample._by_kernel(kernel, img, size, box).tobytes() for _, img, size, box in cases]


@pytest.mark.parametrize("isa", resample_loader.ISAS)
def test_each_path_gives_the_scalar_paths_and_pillows_bytes(kernel, cases, scalar_bytes, isa):
    if isa not in kernel.kernel.isas():
        pytest.skip(f"this CPU or build does not run the {isa} loops (it runs {', '.join(kernel.kernel.isas())})")
    resample_loader.use_isa(kernel.kernel, isa)
    assert kernel.kernel.get_isa() == isa
    for (case, img, size, box), scalar in zip(cases, scalar_bytes):
        got = resample._by_kernel(kernel, img, size, box)
        assert got.tobytes() == scalar, f"{isa}: {case}: not the scalar loops' bytes"
        assert got.tobytes() == img.resize(size, BICUBIC, box=box).tobytes(), f"{isa}: {case}: not Pillow's bytes"


def test_the_variable_forces_a_path_and_unset_gives_the_widest_proven(kernel, monkeypatch):
    monkeypatch.setenv(resample_loader.ISA_VARIABLE, "scalar")
    resample_loader.load.cache_clear()
    try:
        assert resample_loader.load().kernel.get_isa() == "scalar"
        monkeypatch.delenv(resample_loader.ISA_VARIABLE)
        resample_loader.load.cache_clear()
        chosen = resample_loader.load().kernel.get_isa()
        widest = kernel.kernel.isas()[-1]
        assert chosen == ("avx2" if widest == "avx512" and _zen4() else widest), "the fastest path"
    finally:
        resample_loader.load.cache_clear()


def _zen4() -> bool:
    """Whether /proc/cpuinfo names an AMD CPU of family 25 (Zen 4: AVX-512 as two 256-bit halves)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            fields = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
    except OSError:
        pytest.skip("no /proc/cpuinfo to say which CPU this is")
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    return fields.get("vendor_id") == "AuthenticAMD" and fields.get("cpu family") == "25"


@pytest.mark.parametrize("value", ["AVX2", "avx", "neon9", " scalar"])
def test_unknown_paths_are_refused(kernel, monkeypatch, value):
    monkeypatch.setenv(resample_loader.ISA_VARIABLE, value)
    resample_loader.load.cache_clear()
    try:
        with pytest.raises(OptionsError, match=f"{resample_loader.ISA_VARIABLE} must be one of .*not '{value}'"):
            resample.check_choice()
    finally:
        resample_loader.load.cache_clear()


def test_a_path_this_cpu_lacks_is_refused(kernel, monkeypatch):
    missing = [isa for isa in resample_loader.ISAS if isa not in kernel.kernel.isas()]
    if not missing:
        pytest.skip("this CPU runs every path")
    monkeypatch.setenv(resample_loader.ISA_VARIABLE, missing[-1])
    resample_loader.load.cache_clear()
    try:
        with pytest.raises(OptionsError, match=f"={missing[-1]}, but this build or CPU runs only scalar"):
            resample.check_choice()
    finally:
        resample_loader.load.cache_clear()
