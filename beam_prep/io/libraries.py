"""Optional libraries that a file format needs, and the exact command that installs each.

beam-prep writes TFRecords with what it always installs; ArrayRecord needs the
``array-record`` package (C++, wheels for CPython 3.11-3.14 on Linux), and
reading WebDataset shards the way PyTorch does needs ``webdataset``, and reading with NVIDIA DALI
(``beam_prep.dali_reader``) ``nvidia-dali-cuda120``. Each is an
extra of beam-prep (setup.py) and is checked here before any work, so a missing
one is said with its install command, not met as an ImportError on a worker.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import NamedTuple

from beam_prep.errors import OptionsError

__all__ = ["LIBRARIES", "Library", "require"]


class Library(NamedTuple):
    """An optional library: the module to import, and the requirement that installs it."""

    module: str
    requirement: str  # as in setup.py's extras; tests check the two agree

    @property
    def install(self) -> str:
        return f"pip install '{self.requirement}'"


LIBRARIES = {
    "array_record": Library("array_record.python.array_record_module", "array-record>=0.8,<0.9"),
    "webdataset": Library("webdataset", "webdataset>=1.0,<1.1"),
    # NVIDIA DALI, for beam_prep.dali_reader: the CUDA 12 build, which also runs CPU-only pipelines.
    "dali": Library("nvidia.dali", "nvidia-dali-cuda120>=2.4,<3"),
}


def require(name: str, needed_for: str) -> ModuleType:
    """The module of library ``name``, imported; ``needed_for`` says what needs it (``--file_format
    array_record``).

    Raises:
      OptionsError: it is not installed (or cannot be imported), with the command that installs it.
    """
    library = LIBRARIES[name]
    try:
        return importlib.import_module(library.module)
    except ImportError as e:
        raise OptionsError(f"{needed_for} needs the {library.requirement.split('>')[0]} library, which "
                           f"cannot be imported here ({e}): install it with {library.install}") from e
