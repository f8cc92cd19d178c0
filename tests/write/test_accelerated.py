"""The opt-in accelerated Pillow (pillow-simd; README, *Faster resizing*) holds the same quality bound.

``.ci/run`` builds pillow-simd from source into ``.ci/pillow-simd`` (a ``pip --target``
folder). This test runs the imaging module's fidelity tests again in a child Python
with that folder first on its path, so that ``PIL`` is pillow-simd there: every
crop and resize must still be within 44 dB of the full-decode Lanczos reference.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import REPO

SIMD_TARGET = REPO / ".ci" / "pillow-simd"
FIDELITY_TESTS = "full_decode or draft_mode or pillow_build_in_use"


def test_pillow_simd_meets_the_quality_bound_of_the_stock_pillow():
    if not (SIMD_TARGET / "PIL").is_dir():
        message = f"pillow-simd is not built in {SIMD_TARGET.relative_to(REPO)} (.ci/run builds it)"
        if os.environ.get("BEAM_PREP_REQUIRE_PILLOW_SIMD"):
            pytest.fail(message)
        pytest.skip(message)
    env = {**os.environ, "PYTHONPATH": str(SIMD_TARGET), "BEAM_PREP_EXPECT_IMAGING": "pillow-simd"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "tests/write/test_imaging.py",
         "-k", FIDELITY_TESTS],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]
