"""A disk that fills up: a tmpfs of a few hundred KB, for the tests of what a full output disk does."""
from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def small_disk(folder: pathlib.Path, size: str = "300k") -> Iterator[pathlib.Path]:
    """``folder``, made a tmpfs of ``size`` while inside; the test is skipped, saying why, where no
    tmpfs can be mounted (not root, or no CAP_SYS_ADMIN in a container)."""
    if os.geteuid() != 0:
        pytest.skip("a small disk is a tmpfs mounted for the test: run as root")
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a small disk is a tmpfs mounted for the test, and mount refused: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)
