"""The resize kernel and the JPEG fast path under AddressSanitizer and UBSan: differential fuzzes
against Pillow.

The extension is built again with ``-fsanitize=address,undefined`` (every finding fatal) and
``BEAM_PREP_EXACT_SCRATCH``, which gives every call scratch arrays of exact size, so that a read
or write past one reaches memory the sanitizer guards. ``tests/children/resample_fuzz.py`` then loads it
in a fresh Python (the sanitizer's runtime preloaded: the interpreter itself is not built with
it) and resizes random images, odd sizes, boxes and arguments, and Pillow's padded lines
included, a fixed number of cases (the same ones on any machine): every outcome must be
Pillow's, and the C entry points must refuse hostile calls with ValueError. A planted
overrun, read under the same runtime and options, first shows that the sanitizer would stop
the fuzz at one. ``tests/children/jpeg_fuzz.py`` gives the same build's JPEG fast path damaged
JPEGs of every kind, each outcome held to Pillow's path's.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import pytest
from helpers import REPO, child

pytestmark = pytest.mark.slow

SOURCE = REPO / "beam_prep" / "write" / "images" / "_resample.c"
FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g", "-O1"]
CASES = 2000
JPEG_CASES = 1500


def _compiler() -> str:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    found = shutil.which(cc) or shutil.which("cc")
    if found is None:
        pytest.skip("no C compiler found: the sanitizer build needs one")
    return found


def _runtime(cc: str, tmp_path: pathlib.Path) -> str:
    """The AddressSanitizer runtime to preload, after checking the compiler builds with the flags."""
    probe = tmp_path / "probe.c"
    probe.write_text("int probe(int *p) { return p[1]; }\n")  # reads past a one-int buffer
    done = subprocess.run([cc, "-shared", "-fPIC", *FLAGS, str(probe), "-o", str(tmp_path / "probe.so")],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"{cc} does not build with -fsanitize=address,undefined: {done.stderr.strip()[:300]}")
    runtime = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(runtime):
        pytest.skip(f"{cc} names no AddressSanitizer runtime to preload (libasan.so)")
    return runtime


# Calls the probe on a one-int buffer from malloc: AddressSanitizer must stop the read past it.
OVERRUN = """
import ctypes, sys
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
buffer = libc.malloc(4)
print(ctypes.CDLL(sys.argv[1]).probe(ctypes.c_void_p(buffer)))
"""


def _env(runtime: str) -> dict[str, str]:
    env = {**os.environ, "LD_PRELOAD": runtime, "PYTHONMALLOC": "malloc", "PYTHONPATH": str(REPO),
           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0",  # the interpreter's own allocations live on
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
    env.pop("BEAM_PREP_RESIZE_KERNEL", None)
    return env


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory) -> tuple[pathlib.Path, dict[str, str]]:
    """The extension built with the sanitizers, and the environment that runs it; first, a planted
    overrun under the same runtime and options shows that the sanitizer stops a child at one."""
    tmp_path = tmp_path_factory.mktemp("sanitized")
    cc = _compiler()
    runtime = _runtime(cc, tmp_path)
    env = _env(runtime)
    planted = subprocess.run([sys.executable, "-c", OVERRUN, str(tmp_path / "probe.so")], env=env,
                             capture_output=True, text=True, timeout=120)
    assert planted.returncode != 0 and "ERROR: AddressSanitizer: heap-buffer-overflow" in planted.stderr, (
        planted.stdout + planted.stderr[-3000:])
    extension = tmp_path / f"_resample{sysconfig.get_config_var('EXT_SUFFIX')}"
    include = sysconfig.get_paths()["include"]
    subprocess.run([cc, "-shared", "-fPIC", *FLAGS, "-ffp-contract=off", "-DBEAM_PREP_EXACT_SCRATCH",
                    f"-I{include}", str(SOURCE), "-o", str(extension)], check=True, capture_output=True)
    return extension, env


def _run_child(name: str, extension: pathlib.Path, env: dict[str, str], cases: int) -> str:
    done = subprocess.run(child(name, "--extension", str(extension), "--cases", str(cases)), cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-6000:]
    assert "ERROR: AddressSanitizer" not in done.stderr and "runtime error" not in done.stderr, done.stderr[-6000:]
    return done.stdout


def test_the_sanitized_kernel_resizes_like_pillow_case_after_case(sanitized):
    out = _run_child("resample_fuzz", *sanitized, CASES)
    (line,) = [line for line in out.splitlines() if line.startswith("fuzz:")]
    cases, by_kernel = int(line.split()[1]), int(line.split("resized by the kernel ")[1].split(",")[0])
    hashed = int(line.split("hashed by the kernel ")[1])  # the perceptual hash's thumbnail against Pillow's
    assert cases == CASES and by_kernel >= cases // 3 and hashed >= by_kernel, line


def test_the_sanitized_jpeg_path_answers_damaged_jpegs_as_pillow(sanitized):
    """Damaged JPEGs through the fast path under the sanitizers: no finding, and each outcome Pillow's
    path's (``tests/children/jpeg_fuzz.py``); some still decode cleanly and take the fast path."""
    out = _run_child("jpeg_fuzz", *sanitized, JPEG_CASES)
    (line,) = [line for line in out.splitlines() if line.startswith("jpeg fuzz:")]
    cases, native = int(line.split()[2]), int(line.split("made by the fast path ")[1])
    assert cases == JPEG_CASES and native >= JPEG_CASES // 20, line
