"""Our resize kernel against Pillow's own ``resize(size, BICUBIC, box=box)``: the same bytes.

The oracle is Pillow itself, on real photographs (Pillow's test images) and on
random geometry: odd sizes, sub-pixel boxes, up- and downscales, L and RGB.
Equality is the bound (the issue asked for 50 dB and 2 levels; the kernel does
Pillow's integer arithmetic, so anything short of equality is a bug). The
weights are checked against a plain-Python transcription of Pillow's C: that is
what makes the kernel's output the same on every CPU.
"""
from __future__ import annotations

import concurrent.futures
import json
import math
import os
import pathlib
import random
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO, make_tree, run_prepare
from PIL import Image, ImageOps

from beam_prep.write.images import native_code, resample, resample_loader

BICUBIC = Image.Resampling.BICUBIC


@pytest.fixture(scope="module", params=["machine code", "numba in process"])
def kernel(request):
    """Each way the kernel runs: machine code built for this CPU and mapped (Linux x86-64), and
    numba's in-process compile (elsewhere)."""
    assert resample.load().startswith("numba "), resample._LOADER.error
    if request.param == "numba in process":
        return resample_loader.NumbaKernel()
    if not native_code.supported():
        pytest.skip("machine code is mapped on Linux x86-64 only")
    assert isinstance(resample._LOADER.kernel, resample_loader.NativeKernel)
    return resample._LOADER.kernel


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
    assert resample.kernel() == resample.available() == f"numba {__import__('numba').__version__}"


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


def test_weights_are_pillows_in_plain_doubles(kernel):
    rng = random.Random(3)
    for _ in range(400):
        in_size = rng.randint(1, 3000)
        in0 = rng.choice([0.0, rng.uniform(0, in_size / 2)])
        in1 = rng.choice([float(in_size), rng.uniform(in0 + 1e-3, in_size)])
        out_size = rng.randint(1, 700)
        bounds, weights = kernel.coefficients(in_size, np.float32(in0), np.float32(in1), out_size)
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


_LOAD = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
from PIL import Image
from beam_prep.write.images import resample
img = Image.effect_mandelbrot((300, 200), (-2, -1, 1, 1), 50).convert("RGB")
print("kernel:", resample.load(), type(resample._LOADER.kernel).__name__)
print("imported:", sorted(m for m in ("numba", "llvmlite") if m in sys.modules))
same = resample.resize(img, (64, 48), (2.5, 1, 290, 199)).tobytes() == img.resize(
    (64, 48), Image.Resampling.BICUBIC, box=(2.5, 1, 290, 199)).tobytes()
print("same:", same)
"""


def _run(code: str, env: dict[str, str], cwd: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.skipif(not native_code.supported(), reason="machine code is mapped on Linux x86-64 only")
def test_a_worker_maps_the_built_kernel_without_numba_or_llvm(tmp_path):
    """The first process builds the machine code into the cache (in a process of its own); the
    next loads it without importing numba or LLVM (their memory is what this saves), and a
    damaged file is built again rather than mapped."""
    env = {**os.environ, resample_loader.CACHE_VARIABLE: str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    for _ in range(2):
        done = _run(_LOAD, env, tmp_path)
        assert done.returncode == 0, done.stderr
        assert "kernel: numba" in done.stdout and "NativeKernel" in done.stdout and "same: True" in done.stdout
        assert "imported: []" in done.stdout
    (built,) = (tmp_path / "cache").glob("resize-kernel-*.bin")
    data = bytearray(built.read_bytes())
    data[-100] ^= 0xFF
    built.write_bytes(bytes(data))
    done = _run(_LOAD, env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "NativeKernel" in done.stdout and "same: True" in done.stdout
    assert built.read_bytes() != bytes(data)  # built again


def test_without_numba_pillow_resizes_after_one_warning(tmp_path):
    """A machine where numba cannot load and nothing is built yet: a package named numba that
    fails to import stands first on the path, as a broken install would."""
    stub = tmp_path / "stub" / "numba"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('numba cannot load here')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(stub.parent), str(REPO)]),
           resample_loader.CACHE_VARIABLE: str(tmp_path / "empty-cache")}
    env.pop(resample.KERNEL_VARIABLE, None)
    done = _run(_LOAD, env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "kernel: pillow" in done.stdout and "same: True" in done.stdout
    (warning,) = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert warning.startswith("WARNING The compiled resize kernel is unavailable here (")
    assert "numba cannot load here" in warning
    assert warning.endswith("resizing with Pillow's own loops, the same pixels, more slowly.")
    required = _run(_LOAD.replace("resample.load()", "0") + """
resample.resize(img, (64, 48), (2.5, 1, 290, 199))
""", {**env, resample.KERNEL_VARIABLE: resample.NUMBA}, tmp_path)
    assert required.returncode == 1
    assert "KernelUnavailable: BEAM_PREP_RESIZE_KERNEL=numba, but the resize kernel cannot load: " in required.stderr
    assert "numba cannot load here" in required.stderr


def test_either_kernel_writes_the_same_dataset(tmp_path):
    """The whole command, once with the kernel from the first image and once with Pillow's
    loops: the same shards, byte for byte; the manifests say which kernel resized."""
    tree = tmp_path / "tree"
    make_tree(tree, {"cat": 9, "dog": 7}, size=(173, 131))
    shards = {}
    for kernel in (resample.NUMBA, resample.PILLOW):
        out = tmp_path / kernel
        done = run_prepare("--input", str(tree), "--output", str(out), "--image_size", "61x83",
                           env={**os.environ, resample.KERNEL_VARIABLE: kernel})
        assert done.returncode == 0, done.stderr
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["resize_kernel"].split()[0] == kernel
        shards[kernel] = {p.name: p.read_bytes() for p in sorted(out.glob("*.tfrecord*"))}
    assert shards[resample.NUMBA] and shards[resample.NUMBA] == shards[resample.PILLOW]
