"""The Dataflow worker image: same Beam and Python as setup.py, and the project installs from its context.

No Docker engine runs here, so the tests do what the build would: the image's
working folder is made from the context as the Dockerfile's COPY lines copy it,
minus what .dockerignore leaves out; the project is installed from it as its
RUN line installs it; and every ``python -c`` check of its RUN lines is run there.
"""
from __future__ import annotations

import ast
import os
import pathlib
import re
import shlex
import subprocess
import sys
import zipfile

import pytest
from helpers import REPO
from packaging.specifiers import SpecifierSet


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
    match = re.search(r"^FROM apache/beam_python(\d+\.\d+)_sdk:(\S+)\s*$", dockerfile(), re.MULTILINE)
    assert match, "the Dockerfile must build FROM apache/beam_pythonX.Y_sdk:VERSION"
    python, beam = match.groups()
    setup = setup_kwargs()
    assert beam == setup["BEAM_VERSION"]
    assert f"{python}.0" in SpecifierSet(setup["python_requires"])


def test_beams_boot_entrypoint_is_kept():
    assert not re.search(r"^\s*(ENTRYPOINT|CMD)\b", dockerfile(), re.MULTILINE)


# --- the build, without Docker ---------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (NAME, arguments): continuation lines joined, comments dropped."""
    found, current = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or (not current and not line.strip()):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        name, _, arguments = (current + line).strip().partition(" ")
        found.append((name.upper(), arguments.strip()))
        current = ""
    return found


def _ignore_rule(pattern: str) -> tuple[re.Pattern, bool]:
    """A .dockerignore line as (regex over a relative path, whether it re-includes): ``*`` and
    ``?`` stay within a path segment, ``**`` spans any number of them."""
    included = pattern.startswith("!")
    parts = []
    for token in re.split(r"(\*\*/|\*\*|\*|\?)", os.path.normpath(pattern.lstrip("!").strip()).lstrip("/")):
        parts.append({"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(token, re.escape(token)))
    return re.compile("".join(parts)), included


def ignored(relpath: str, rules: list[tuple[re.Pattern, bool]]) -> bool:
    """Whether the build context leaves ``relpath`` out: as Docker decides, the last rule that
    matches the path or a folder above it wins."""
    folders = relpath.split("/")
    candidates = ["/".join(folders[:i]) for i in range(1, len(folders) + 1)]
    left_out = False
    for regex, included in rules:
        if any(regex.fullmatch(c) for c in candidates):
            left_out = not included
    return left_out


def build_workdir(folder: pathlib.Path) -> pathlib.Path:
    """The image's WORKDIR, made in ``folder`` as the COPY lines make it from the context.

    A COPY source that .dockerignore leaves out is not in the context, and the
    build fails on it: so does this, naming it.
    """
    rules = [_ignore_rule(line) for line in (REPO / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    workdir = folder
    for name, arguments in instructions(dockerfile()):
        if name == "WORKDIR":
            workdir = folder / arguments.lstrip("/")
        if name != "COPY":
            continue
        *sources, destination = arguments.split()
        for source in sources:
            origin = REPO / source
            if origin.is_dir():  # its contents go into the destination folder
                copies = [(path, workdir / destination / path.relative_to(origin))
                          for path in sorted(origin.rglob("*")) if path.is_file()]
            else:  # into the destination folder, or named by the destination
                into = destination.endswith("/") or len(sources) > 1
                copies = [(origin, workdir / destination / origin.name if into else workdir / destination)]
            copies = [(path, target) for path, target in copies
                      if not ignored(path.relative_to(REPO).as_posix(), rules)]
            assert copies, f"COPY {source}: not in the build context (.dockerignore leaves it out)"
            for path, target in copies:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(path.read_bytes())
    return workdir


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> pathlib.Path:
    return build_workdir(tmp_path_factory.mktemp("image"))


def test_the_project_installs_from_the_copied_context(workdir, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
         str(tmp_path / "wheels"), str(workdir)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "wheels").glob("beam_prep-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"beam_prep/write/sinks/shard_sinks.py", "beam_prep/model/features.py", "pipelines/prepare_images.py"} <= names
    metadata = next(n for n in names if n.endswith("METADATA"))
    requires = zipfile.ZipFile(wheel).read(metadata).decode()
    assert f"Requires-Dist: apache-beam[gcp]=={setup_kwargs()['BEAM_VERSION']}" in requires


def test_the_workers_resize_with_the_kernel_built_in_the_image():
    """The image's workers resize with the kernel, as a local run does (the same bytes), not
    pillow-simd: its install builds the extension with a compiler it removes in the same layer,
    and a check refuses an image where the kernel does not run (the check runs below)."""
    runs = [arguments for name, arguments in instructions(dockerfile()) if name == "RUN"]
    (install,) = [run for run in runs if "pip install" in run]
    assert "apt-get install" in install and " gcc " in install and "apt-get purge -y gcc" in install
    assert install.index("apt-get install") < install.index("pip install") < install.index("apt-get purge")
    assert "resample.available() == resample.KERNEL" in install
    assert not any("pillow-simd" in arguments for _, arguments in instructions(dockerfile()))


def image_environment(text: str) -> dict[str, str]:
    """The ``ENV KEY=VALUE`` instructions' variables."""
    return dict(pair.split("=", 1) for name, arguments in instructions(text) if name == "ENV"
                for pair in shlex.split(arguments))


def python_checks(text: str) -> list[str]:
    """Every ``python -c CODE`` of the RUN lines."""
    checks = []
    for name, arguments in instructions(text):
        if name != "RUN":
            continue
        words = shlex.split(arguments)
        checks += [words[i + 2] for i, word in enumerate(words[:-2])
                   if word in ("python", "python3") and words[i + 1] == "-c"]
    return checks


# Appended to each check: the project's modules it imported are the image's, never this checkout's
# (an editable install of it in the running environment would otherwise do).
_FROM_THE_IMAGE = """
import sys
for name in ("beam_prep", "pipelines"):
    module = sys.modules.get(name)
    assert module is None or module.__file__.startswith(tuple(sys.argv[1:])), (name, module.__file__)
"""


def test_every_python_check_of_the_dockerfile_passes_where_the_image_runs_it(workdir, tmp_path):
    """Each check runs as its RUN line runs it: ``python -c`` in the image's working folder, the
    project installed from it (``pip install .``, here into a folder on PYTHONPATH, in place of
    site-packages, its kernel built as the image builds it), the image's ``ENV`` variables set,
    and its dependencies the running environment's; the repository is on no path."""
    site = tmp_path / "site-packages"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target",
         str(site), "."], cwd=workdir, capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    checks = python_checks(dockerfile())
    assert len(checks) >= 2, checks  # the install's and the kernel's
    failed = []
    for code in checks:
        env = {**os.environ, **image_environment(dockerfile()), "PYTHONPATH": str(site)}
        env.pop("BEAM_PREP_RESIZE_KERNEL", None)
        result = subprocess.run([sys.executable, "-c", code + _FROM_THE_IMAGE, f"{workdir}/", f"{site}/"],
                                cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            failed.append(f"{code}\n{result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ''}")
    assert not failed, "\n\n".join(failed)
