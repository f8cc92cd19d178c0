"""Finds this process's resize kernel, once: the C extension the install built, or why not.

The kernel's loops are a C extension (``_resample.c``) that setuptools builds at
install time where a compiler is found (``setup.py``, ``optional=True``). Loading
it is an import: nothing is compiled, cached or mapped at run time. Any failure
(not built, an import error, a Pillow version the kernel was not checked
against) leaves ``Loaded.kernel`` None and says why, with what to do, in
``Loaded.fallback``; ``resample`` then resizes with Pillow's own loops, the same
pixels.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import os
from importlib import metadata
from types import ModuleType

import PIL

from beam_prep.errors import OptionsError

# Which code resizes, where a user sets it: unset (or empty), the kernel where this install has it,
# else Pillow's loops after one warning; "pillow", Pillow's loops (to compare, or to rule the kernel
# out); "kernel", the kernel or a refused run. Anything else is refused (exit 2): a misspelt value
# must not silently mean the default. The pixels are the same whichever runs.
KERNEL_VARIABLE = "BEAM_PREP_RESIZE_KERNEL"
PILLOW = "pillow"
KERNEL = "kernel"
CHOICES = (PILLOW, KERNEL)
# Which of the kernel's loops run, to compare them (tests/write/test_resample_isa.py, benchmarks):
# unset (or empty), the fastest this CPU runs (default_isa); else scalar, sse4, avx2 or avx512, and a refused run
# where this build or CPU does not run that one. The pixels are the same whichever runs.
ISA_VARIABLE = "BEAM_PREP_RESAMPLE_ISA"
ISAS = ("scalar", "sse4", "avx2", "avx512")
EXTENSION = "beam_prep.write.images._resample"


@dataclasses.dataclass(frozen=True)
class PillowRules:
    """What differs between the Pillow versions the kernel was checked against, and decides its bytes
    or its errors.

    Attributes:
      tall_first: ``Image.resize`` resizes an image taller than 100 times its width vertically
        first, then horizontally (Pillow 12.2, PR #9524).
      horizontal_always: ``ImagingResampleInner`` computes the horizontal weights even where no
        horizontal pass runs, so that their MemoryError is raised anyway (before Pillow 12).
      mode_name: the first field of Pillow's image struct is the mode's name (``char[7]``, before
        Pillow 12) rather than its number (``ModeID``): where ``resample`` finds the line pointers.
    """

    tall_first: bool
    horizontal_always: bool
    mode_name: bool


# The Pillow versions the kernel was checked against, byte for byte (tests/write/test_resample.py on
# each), and each one's rules. Any other version resizes with Pillow's own loops (one warning): its
# rules may differ. Add a version here only after the property tests pass with it installed, e.g.
# pip install --no-deps --target /tmp/pil pillow==X; PYTHONPATH=/tmp/pil:. pytest tests/write/test_resample.py
# (and with numpy 1.26, the oldest setup.py allows, the same way).
CHECKED_PILLOW = {
    "11.3.0": PillowRules(tall_first=False, horizontal_always=True, mode_name=True),
    "12.3.0": PillowRules(tall_first=True, horizontal_always=False, mode_name=False),
}

_REBUILD = ("reinstall beam-prep where a C compiler is found (e.g. apt-get install gcc python3-dev; "
            "pip install --force-reinstall --no-deps --no-binary beam-prep beam-prep, or pip install -e . "
            "in a checkout)")


def choice() -> str | None:
    """``BEAM_PREP_RESIZE_KERNEL``'s value, None where unset or empty.

    Raises:
      OptionsError: a value other than ``pillow`` and ``kernel`` (exactly: ``Pillow`` too).
    """
    value = os.environ.get(KERNEL_VARIABLE) or None
    if value is not None and value not in CHOICES:
        raise OptionsError(f"{KERNEL_VARIABLE} must be {' or '.join(CHOICES)} (or unset: the kernel where "
                           f"it is built, else Pillow's loops), not {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Loaded:
    """What resizes in this process.

    Attributes:
      kernel: the extension module, or None where Pillow's loops resize.
      rules: with the kernel, this Pillow version's rules (``CHECKED_PILLOW``).
      fallback: why the kernel is not used though it could have been, and what to do (the run
        warns, once); None where it is used, or where Pillow's loops are chosen (``pillow`` set,
        pillow-simd installed).
    """

    kernel: ModuleType | None
    rules: PillowRules | None = None
    fallback: str | None = None


@functools.cache
def load() -> Loaded:
    """This process's kernel, found once (an import: microseconds where it is built)."""
    build = pillow_build()
    if not build.startswith("pillow "):  # pillow-simd: its own resize rounds differently, kept for reruns
        return Loaded(None)
    version = build.split()[1]
    if version not in CHECKED_PILLOW:
        return Loaded(None, fallback=(
            f"Pillow {version} is not a version the resize kernel was checked against "
            f"({', '.join(CHECKED_PILLOW)}): install one of those for the kernel's speed"))
    try:
        kernel = importlib.import_module(EXTENSION)
    except ModuleNotFoundError as e:
        if e.name != EXTENSION:
            return Loaded(None, fallback=f"the resize kernel cannot load (ModuleNotFoundError: {e}): {_REBUILD}")
        return Loaded(None, fallback=f"the resize kernel is not built in this install: {_REBUILD}")
    except Exception as e:  # noqa: BLE001 - whatever stops the import, Pillow's loops resize, said once.
        return Loaded(None, fallback=f"the resize kernel cannot load ({type(e).__name__}: {e}): {_REBUILD}")
    use_isa(kernel, os.environ.get(ISA_VARIABLE) or None)
    return Loaded(kernel, rules=CHECKED_PILLOW[version])


def default_isa(kernel: ModuleType) -> str:
    """The instruction set the kernel chose when it loaded: the widest this build and CPU run, but
    avx2 where AVX-512 runs as two 256-bit halves and is slower (docs/design/resizing.md)."""
    return kernel.preferred_isa()


def use_isa(kernel: ModuleType, name: str | None) -> None:
    """Runs the kernel's loops for instruction set ``name`` (``ISA_VARIABLE``'s value), or
    ``default_isa`` where None.

    Raises:
      OptionsError: a name not in ``ISAS``, or one this build or CPU does not run.
    """
    if name is None:
        kernel.set_isa(default_isa(kernel))  # the module's own choice, again after any set_isa
        return
    if name not in ISAS:
        raise OptionsError(f"{ISA_VARIABLE} must be one of {', '.join(ISAS)} (or unset: the fastest this CPU "
                           f"runs), not {name!r}")
    if name not in kernel.isas():
        raise OptionsError(f"{ISA_VARIABLE}={name}, but this build or CPU runs only {', '.join(kernel.isas())}: "
                           "unset it for the widest of those")
    kernel.set_isa(name)


@functools.cache
def pillow_build() -> str:
    """The Pillow build that decodes and resizes here: ``pillow 12.3.0``, or ``pillow-simd ...``
    where the opt-in accelerated build is installed in its place (docs/design/resizing.md).

    Their resized pixels differ by rounding, so the manifest records which made a dataset:
    reruns are byte-identical with the same build.
    """
    for name in ("pillow-simd", "pillow"):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if os.path.realpath(dist.locate_file("PIL/__init__.py")) == os.path.realpath(PIL.__file__):
            return f"{name} {dist.version}"
    return f"PIL {PIL.__version__}"
