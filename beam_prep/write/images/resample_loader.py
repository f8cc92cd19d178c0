"""Finds the resize kernel for this process: machine code built once a machine, or numba in process.

Two ways to run the same compiled loops (``resample_kernel``), one interface
(``coefficients``, ``filter_rows``, ``transpose``):

* ``NativeKernel`` (Linux on x86-64): the loops as machine code that
  ``resample_build`` compiled for this CPU, mapped by ``native_code``. A worker
  never imports numba or LLVM (about 150 MB and half a second a process); the
  load takes milliseconds. Built in a process of its own, into the cache
  folder, once per CPU model and kernel version, by the first run that resizes
  more than ``LOAD_AFTER`` images in a process; workers that need it at once
  build it once (a lock) and use Pillow's loops while they wait.
* ``NumbaKernel`` elsewhere: numba compiles the loops in the process (or loads
  them from its own cache), after the process's first ``LOAD_AFTER`` images.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import math
import os
import pathlib
import subprocess
import sys
import threading
from importlib import metadata
from typing import Protocol

import numpy as np

from beam_prep.write.images import native_code

log = logging.getLogger(__name__)

# Where the machine code is kept; default $XDG_CACHE_HOME/beam-prep, else ~/.cache/beam-prep.
CACHE_VARIABLE = "BEAM_PREP_CACHE_DIR"
# Images a process resizes with Pillow's loops before it builds the kernel's machine code (none
# built for this CPU yet), or compiles it with numba in process (where no machine code can be
# mapped): either costs as much CPU as resizing some hundreds of images, which a small run
# never earns back (``benchmarks/bench_startup.py``).
LOAD_AFTER = 500
_MAGIC = b"beam-prep resize kernel 1\n"
_BUILD_TIMEOUT_S = 600
_SOURCES = ("resample_kernel.py", "resample_build.py", "native_code.py")


class Kernel(Protocol):
    """The compiled loops ``resample`` calls, whichever way they run here."""

    def coefficients(self, in_size: int, in0: np.float32, in1: np.float32,
                     out_size: int) -> tuple[np.ndarray, np.ndarray]: ...

    def filter_rows(self, src: np.ndarray, bounds: np.ndarray, weights: np.ndarray, out: np.ndarray,
                    acc: np.ndarray) -> None: ...

    def transpose(self, src: np.ndarray, out: np.ndarray) -> None: ...


def taps(in0: np.float32, in1: np.float32, out_size: int) -> int:
    """The most weights one output pixel has, as Pillow sizes its coefficient array."""
    scale = float(in1 - in0) / out_size  # the difference in float32, as Pillow takes it
    return math.ceil(2.0 * max(scale, 1.0)) * 2 + 1


def _arrays(in_size: int, in0: np.float32, in1: np.float32, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    return np.empty((out_size, 2), np.int32), np.empty((out_size, taps(in0, in1, out_size)), np.int32)


class NativeKernel:
    """The loops as machine code mapped into this process (``native_code``).

    Args:
      packed: ``pack_objects``' file, as ``resample_build`` wrote it.
    """

    def __init__(self, packed: bytes) -> None:
        p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
        prototypes = {
            "coefficients": ctypes.CFUNCTYPE(None, i64, f32, f32, i64, i64, p, p),
            "filter_rows": ctypes.CFUNCTYPE(None, p, i64, i64, p, p, i64, p, i64, p),
            "transpose32": ctypes.CFUNCTYPE(None, p, i64, i64, i64, p),
            "transpose8": ctypes.CFUNCTYPE(None, p, i64, i64, i64, p),
        }
        self._code = []
        functions = {}
        for name, (symbol, obj) in unpack_objects(packed).items():
            code = native_code.load(obj)
            self._code.append(code)  # mapped for as long as this kernel lives
            functions[name] = code.function(symbol, prototypes[name])
        self._coefficients, self._filter_rows = functions["coefficients"], functions["filter_rows"]
        self._transpose = {4: functions["transpose32"], 1: functions["transpose8"]}

    def coefficients(self, in_size: int, in0: np.float32, in1: np.float32,
                     out_size: int) -> tuple[np.ndarray, np.ndarray]:
        bounds, weights = _arrays(in_size, in0, in1, out_size)
        self._coefficients(in_size, in0, in1, out_size, weights.shape[1], bounds.ctypes.data, weights.ctypes.data)
        return bounds, weights

    def filter_rows(self, src: np.ndarray, bounds: np.ndarray, weights: np.ndarray, out: np.ndarray,
                    acc: np.ndarray) -> None:
        self._filter_rows(src.ctypes.data, src.shape[0], src.shape[1], bounds.ctypes.data, weights.ctypes.data,
                          weights.shape[1], out.ctypes.data, out.shape[0], acc.ctypes.data)

    def transpose(self, src: np.ndarray, out: np.ndarray) -> None:
        """``src``: rows of a C-contiguous array, any column slice of them."""
        self._transpose[src.itemsize](src.ctypes.data, src.strides[0] // src.itemsize, src.shape[0],
                                      src.shape[1], out.ctypes.data)


class NumbaKernel:
    """The loops compiled by numba in this process (or loaded from numba's own cache)."""

    def __init__(self) -> None:
        from beam_prep.write.images import resample_kernel

        self._kernel = resample_kernel

    def coefficients(self, in_size: int, in0: np.float32, in1: np.float32,
                     out_size: int) -> tuple[np.ndarray, np.ndarray]:
        bounds, weights = _arrays(in_size, in0, in1, out_size)
        self._kernel.fill_coefficients(in_size, in0, in1, out_size, bounds, weights)
        return bounds, weights

    def filter_rows(self, src: np.ndarray, bounds: np.ndarray, weights: np.ndarray, out: np.ndarray,
                    acc: np.ndarray) -> None:
        self._kernel.filter_rows(src, bounds, weights, out, acc)

    def transpose(self, src: np.ndarray, out: np.ndarray) -> None:
        self._kernel.transpose(src, out)


def pack_objects(objects: dict[str, tuple[str, bytes]]) -> bytes:
    """Object files by entry point (with each one's symbol) as one file, with its checksum."""
    header, payload = {}, b""
    for name, (symbol, obj) in objects.items():
        header[name] = [symbol, len(payload), len(obj)]
        payload += obj
    body = json.dumps(header).encode() + b"\n" + payload
    return _MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def unpack_objects(packed: bytes) -> dict[str, tuple[str, bytes]]:
    """``pack_objects``' file back; ValueError for one damaged or of another format."""
    if not packed.startswith(_MAGIC):
        raise ValueError("not a beam-prep kernel file")
    digest, _, body = packed[len(_MAGIC):].partition(b"\n")
    if hashlib.sha256(body).hexdigest().encode() != digest:
        raise ValueError("the kernel file is damaged (checksum)")
    header, _, payload = body.partition(b"\n")
    return {name: (symbol, payload[start:start + length])
            for name, (symbol, start, length) in json.loads(header).items()}


def cache_dir() -> pathlib.Path:
    chosen = os.environ.get(CACHE_VARIABLE)
    if chosen:
        return pathlib.Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "beam-prep"


def kernel_file() -> pathlib.Path:
    """Where this machine's build of this kernel lives: named by the kernel's sources, the
    compiler's versions and the CPU, so a change of any of them builds anew."""
    identity = hashlib.sha256()
    here = pathlib.Path(__file__).parent
    for name in _SOURCES:
        identity.update((here / name).read_bytes())
    for package in ("numba", "llvmlite"):
        try:
            version = metadata.version(package)
        except metadata.PackageNotFoundError:  # nothing can be built: the name matters little
            version = "absent"
        identity.update(f"{package} {version}\n".encode())
    identity.update(native_code.cpu_identity().encode())
    return cache_dir() / f"resize-kernel-{identity.hexdigest()[:20]}.bin"


def build(target: pathlib.Path) -> None:
    """Runs ``resample_build`` in a process of its own, so that this one never loads numba.

    Raises:
      RuntimeError: the build failed, with the error it ended on.
    """
    package_root = str(pathlib.Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "beam_prep.write.images.resample_build", str(target)], env=env,
                          capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()  # the last says what was raised
        raise RuntimeError(f"building it failed: {lines[-1] if lines else f'exit code {done.returncode}'}")


def native(wait_for_build: bool) -> NativeKernel | None:
    """This machine's machine code: loaded from the cache, else built there first (holding a lock,
    so that processes starting together build it once). None where it is not built and
    ``wait_for_build`` is False."""
    target = kernel_file()
    if not target.is_file():
        if not wait_for_build:
            return None
        import fcntl  # here: the machine code runs on Linux only

        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.is_file():  # not built while this process waited for the lock
                build(target)
    return NativeKernel(target.read_bytes())


class Loader:
    """The kernel of this process, found once: at the first resize where machine code is built (a
    few milliseconds), else after ``LOAD_AFTER`` images, in a background thread, while ``resize``
    uses Pillow's loops, whose pixels are the same: a build (seconds, once a machine), or numba."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._tried_cache = False
        self._waiting = 0
        self.kernel: Kernel | None = None
        self.error: str | None = None
        self.refusal: str | None = None  # why this process must not use the kernel at all

    def on_pillow_resize(self) -> None:
        """``resize`` ran Pillow's loops: the moment to look for the kernel, or to count towards it."""
        if self.refusal is not None or self._thread is not None:
            return
        if native_code.supported() and not self._tried_cache:
            self._tried_cache = True
            try:
                self.kernel = native(wait_for_build=False)
            except (OSError, ValueError, native_code.NativeCodeError) as e:  # built again when one is built
                log.info("the resize kernel's file cannot be loaded (%s): it will be built again", e)
                _remove(kernel_file())
            if self.kernel is not None:
                return
        self._waiting += 1
        if self._waiting >= LOAD_AFTER:
            self.start()

    def start(self) -> None:
        with self._lock:
            if self._thread is None and self.kernel is None:
                self._thread = threading.Thread(target=self._load, name="beam-prep-resize-kernel", daemon=True)
                self._thread.start()
        if self.kernel is not None:
            self._done.set()

    def wait(self) -> Kernel | None:
        self.start()
        self._done.wait()
        return self.kernel

    def _load(self) -> None:
        try:
            if self.refusal is not None:
                raise ImportError(self.refusal)
            if native_code.supported():
                try:
                    self.kernel = native(wait_for_build=True)
                except ValueError:  # a damaged file: built again, once
                    _remove(kernel_file())
                    self.kernel = native(wait_for_build=True)
            else:
                self.kernel = NumbaKernel()
        except Exception as e:  # noqa: BLE001 - any failure to build or load means Pillow's loops.
            self.error = f"{type(e).__name__}: {e}"
            (log.info if self.refusal else log.warning)(
                "The compiled resize kernel is unavailable here (%s): resizing with Pillow's own loops, "
                "the same pixels, more slowly.", self.error)
        finally:
            self._done.set()


def _remove(path: pathlib.Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
