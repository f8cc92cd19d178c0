"""The Dataflow worker image: same Beam and Python as setup.py, and the project installs from its context.

No Docker engine runs here, so the test checks what the build would rely on.
"""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import zipfile

from packaging.specifiers import SpecifierSet

from helpers import REPO


def setup_kwargs() -> dict:
    tree = ast.parse((REPO / "setup.py").read_text())
    values = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
        if isinstance(node, ast.keyword) and node.arg == "python_requires":
            values["python_requires"] = ast.literal_eval(node.value)
    return values


def dockerfile() -> str:
    return (REPO / "Dockerfile").read_text()


def test_base_image_is_beams_sdk_at_the_pinned_version():
    match = re.search(r"^FROM apache/beam_python(\d+\.\d+)_sdk:(\S+)\s*$", dockerfile(), re.M)
    assert match, "the Dockerfile must build FROM apache/beam_pythonX.Y_sdk:VERSION"
    python, beam = match.groups()
    setup = setup_kwargs()
    assert beam == setup["BEAM_VERSION"]
    assert f"{python}.0" in SpecifierSet(setup["python_requires"])


def test_beams_boot_entrypoint_is_kept():
    assert not re.search(r"^\s*(ENTRYPOINT|CMD)\b", dockerfile(), re.M)


def test_the_project_installs_from_the_copied_context(tmp_path):
    context = tmp_path / "context"
    context.mkdir()
    for line in dockerfile().splitlines():
        if line.startswith("COPY "):
            *sources, _ = line.split()[1:]
            for source in sources:
                target = context / source
                target.parent.mkdir(parents=True, exist_ok=True)
                if (REPO / source).is_dir():
                    shutil.copytree(REPO / source, target,
                                    ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy(REPO / source, target)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
         str(tmp_path / "wheels"), str(context)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "wheels").glob("beam_prep-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"beam_prep/write/transforms.py", "beam_prep/model/features.py", "pipelines/prepare_images.py"} <= names
    metadata = next(n for n in names if n.endswith("METADATA"))
    requires = zipfile.ZipFile(wheel).read(metadata).decode()
    assert f"Requires-Dist: apache-beam[gcp]=={setup_kwargs()['BEAM_VERSION']}" in requires


def test_the_workers_get_pillow_simd_built_by_the_script_ci_tests():
    # The same script builds the opt-in accelerated Pillow for tests/write/test_accelerated.py,
    # and the image checks that it replaced the stock Pillow.
    text = dockerfile()
    assert re.search(r"^COPY \.ci/build-pillow-simd ", text, re.M)
    assert "bash build-pillow-simd" in text
    assert "imaging.library().startswith('pillow-simd')" in text
    script = (REPO / ".ci" / "build-pillow-simd").read_text()
    assert re.search(r'PILLOW_SIMD="pillow-simd==[\d.]+\w*"', script)
