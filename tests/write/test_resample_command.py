"""The whole command in each state the resize kernel can be in: the same shards, said once.

The kernel is a C extension built at install time (docs/design/resizing.md), so
its hostile environments are few: built; not built (no compiler at install);
built but failing to import (a broken or foreign build); ruled out by the user;
or run without HOME (an arbitrary container UID), where the old loader found no cache. In each, every process of the run (the launcher and its workers) is put in
that state by a ``sitecustomize`` first on their path, and the run must write
the same shards as Pillow's loops, with one console line where the kernel fell
back, and a manifest that says what resized the images. A bad
``BEAM_PREP_RESIZE_KERNEL`` or ``BEAM_PREP_RESAMPLE_ISA`` is refused before any work (exit 2, nothing
made: the command's main in this process, put in that state, as it starts nothing), and the scalar
loops write the widest loops' shards.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys

import numpy as np
import pytest
from helpers import REPO, make_tree, run_prepare
from PIL import Image

from beam_prep.write.images import resample, resample_loader

pytestmark = pytest.mark.slow

ARGS = ("--image_size", "61x83", "--resize_mode", "stretch")
_STATES = {
    "not built": f"import sys\nsys.modules[{resample_loader.EXTENSION!r}] = None\n",
    "import fails": f"""import sys
class _Broken:
    def find_spec(self, name, path=None, target=None):
        if name == {resample_loader.EXTENSION!r}:
            raise ImportError("undefined symbol: clip8 (a build for another Python)")
sys.meta_path.insert(0, _Broken())
""",
}


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> pathlib.Path:
    """Photos-like images, and strips past 100:1 both ways, which Pillow 12.2+ resizes in another order."""
    root = tmp_path_factory.mktemp("kernel-states") / "tree"
    make_tree(root, {"cat": 5, "dog": 4}, size=(173, 131))
    pixels = np.random.default_rng(3)
    for i, shape in enumerate([(647, 3, 3), (401, 2, 3), (3, 520, 3), (900, 5, 3)]):
        Image.fromarray(pixels.integers(0, 256, shape, dtype=np.uint8)).save(root / "cat" / f"strip_{i}.png")
    return root


def _run(tree: pathlib.Path, out: pathlib.Path, state: str | None, kernel: str | None, *flags: str,
         homeless: bool = False, **variables: str):
    env = {**os.environ, **variables}
    if homeless:  # a container started with an arbitrary UID: no HOME and no passwd entry to find one
        for name in ("HOME", "XDG_CACHE_HOME", "BEAM_PREP_CACHE_DIR"):
            env.pop(name, None)
    env.pop(resample.KERNEL_VARIABLE, None)
    if kernel is not None:
        env[resample.KERNEL_VARIABLE] = kernel
    path = [str(REPO)]
    if state is not None:
        site = out.parent / f"site-{out.name}"
        site.mkdir()
        (site / "sitecustomize.py").write_text(_STATES[state])
        path.insert(0, str(site))
    env["PYTHONPATH"] = os.pathsep.join(path)
    return run_prepare("--input", str(tree), "--output", str(out), *ARGS, *flags, env=env)


@pytest.fixture(scope="module")
def run_once(tree, tmp_path_factory):
    """``_run`` made once for each state, kernel, flags and variables: the runs several tests
    compare with (the kernel's, Pillow's) are made once for the module. Gives the finished
    process and its output folder."""
    made: dict[tuple, tuple] = {}

    def run(state: str | None, kernel: str | None, *flags: str, homeless: bool = False, **variables: str):
        key = (state, kernel, flags, homeless, tuple(sorted(variables.items())))
        if key not in made:
            out = tmp_path_factory.mktemp("run") / "out"
            made[key] = (_run(tree, out, state, kernel, *flags, homeless=homeless, **variables), out)
        return made[key]

    return run


@pytest.fixture
def refused_here(tree, capsys):
    """The command's main in this process, in ``state`` with ``BEAM_PREP_RESIZE_KERNEL`` ``kernel`` and
    ``variables`` set: for a run refused before any work, which starts nothing. Gives its exit code and
    the lines it wrote on stderr. The state is this process's (``not built``: the extension's import
    fails as the ``sitecustomize`` makes it fail), and what the kernel's loader found is forgotten
    before and after."""
    from pipelines import prepare_images

    def refused(out: pathlib.Path, state: str | None, kernel: str | None, **variables: str) -> tuple[int, list[str]]:
        assert state in (None, "not built"), state
        resample_loader.load.cache_clear()
        monkeypatch.delenv(resample.KERNEL_VARIABLE, raising=False)
        if kernel is not None:
            monkeypatch.setenv(resample.KERNEL_VARIABLE, kernel)
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        if state == "not built":
            monkeypatch.setitem(sys.modules, resample_loader.EXTENSION, None)
        capsys.readouterr()
        code = prepare_images.main(["--input", str(tree), "--output", str(out), *ARGS])
        return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]

    with pytest.MonkeyPatch.context() as monkeypatch:
        yield refused
    resample_loader.load.cache_clear()


def _shards(out: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.tfrecord*"))}


def _fallback_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "Pillow's own loops" in line]


def test_every_kernel_state_writes_pillows_shards_and_says_so_once(run_once):
    """Without HOME, the ISA variable is set empty too: an empty one is an unset one (the widest loops)."""
    runs = {"built": (None, None), "pillow chosen": (None, resample.PILLOW),
            "not built": ("not built", None), "import fails": ("import fails", None),
            "HOME unset": (None, None)}
    shards, manifests, outs = {}, {}, []
    for name, (state, kernel) in runs.items():
        variables = {resample_loader.ISA_VARIABLE: ""} if name == "HOME unset" else {}
        done, out = run_once(state, kernel, homeless=name == "HOME unset", **variables)
        outs.append(out)
        assert done.returncode == 0, f"{name}: {done.stderr[-3000:]}"
        manifests[name] = json.loads((out / "manifest.json").read_text())
        shards[name] = _shards(out)
        lines = _fallback_lines(done.stderr)
        if state is None:
            assert lines == [], f"{name}: {lines}"
        else:
            assert len(lines) == 1, f"{name}: {done.stderr[-3000:]}"
            assert lines[0].startswith("warning: every image was resized with Pillow's own loops"), lines[0]
            assert ("not built in this install" if state == "not built" else "undefined symbol") in lines[0]
            assert "reinstall beam-prep where a C compiler is found" in lines[0]
    assert shards["built"] and all(s == shards["pillow chosen"] for s in shards.values())
    assert manifests["built"]["resize_kernel"] == resample.KERNEL
    assert manifests["built"]["resize_fallback"] == []
    assert manifests["HOME unset"]["resize_kernel"] == resample.KERNEL  # nothing of the kernel's is under HOME
    assert manifests["pillow chosen"]["resize_kernel"] == resample.PILLOW
    assert manifests["pillow chosen"]["resize_fallback"] == []
    for name in ("not built", "import fails"):
        assert manifests[name]["resize_kernel"] == resample.PILLOW
        assert len(manifests[name]["resize_fallback"]) == 1
    for out in outs:
        assert not list(out.glob("**/.*.partial")) and not list(out.glob("**/*.partial"))


def test_the_shuffle_sink_counts_what_resized_too(tree, tmp_path):
    """The other sink carries its workers' counts per image (``ImageToExampleFn``), not per shard."""
    for state, kernel, fallback in [(None, resample.KERNEL, 0), ("not built", resample.PILLOW, 1)]:
        done = _run(tree, tmp_path / f"shuffle-{state}".replace(" ", "-"), state, None, "--sink", "shuffle")
        assert done.returncode == 0, done.stderr[-3000:]
        manifest = json.loads((tmp_path / f"shuffle-{state}".replace(" ", "-") / "manifest.json").read_text())
        assert manifest["resize_kernel"] == kernel and len(manifest["resize_fallback"]) == fallback
        assert len(_fallback_lines(done.stderr)) == fallback, done.stderr[-3000:]


@pytest.mark.parametrize("state, kernel, message", [
    (None, "Pillow", "BEAM_PREP_RESIZE_KERNEL must be pillow or kernel"),
    (None, "off", "BEAM_PREP_RESIZE_KERNEL must be pillow or kernel"),
    ("not built", "kernel", "BEAM_PREP_RESIZE_KERNEL=kernel, but the resize kernel is not built in this install"),
])
def test_a_bad_kernel_choice_is_refused_before_any_work(refused_here, tmp_path, state, kernel, message):
    out = tmp_path / "out"
    code, lines = refused_here(out, state, kernel)
    assert code == 2, lines
    (line,) = lines
    assert message in line, line
    assert not out.exists()


@pytest.mark.parametrize("isa", ["AVX2", "neon9"])
def test_a_bad_loop_choice_is_refused_before_any_work(refused_here, tmp_path, isa):
    out = tmp_path / "out"
    code, lines = refused_here(out, None, None, **{resample_loader.ISA_VARIABLE: isa})
    assert code == 2, lines
    (line,) = lines
    assert f"{resample_loader.ISA_VARIABLE} must be one of scalar, sse4, avx2, avx512" in line, line
    assert not out.exists()


def test_the_scalar_loops_write_the_same_shards_as_the_widest(run_once):
    shards = {}
    for isa in ("scalar", None):  # None: unset, the widest loops this CPU runs (the "built" run above)
        done, out = run_once(None, None, **({resample_loader.ISA_VARIABLE: isa} if isa else {}))
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads((out / "manifest.json").read_text())["resize_kernel"] == resample.KERNEL
        shards[isa] = _shards(out)
    assert shards["scalar"] and shards["scalar"] == shards[None]


def test_lines_pillow_pads_are_resized_by_pillow_and_said_once(run_once):
    """``PILLOW_ALIGNMENT=64`` (Pillow pads each image line to 64 bytes): the kernel read the padded
    rows as contiguous and wrote other pixels; now each padded image goes to Pillow's loops, the
    shards are Pillow's, and the run says why once."""
    want, want_out = run_once(None, resample.PILLOW)  # the "pillow chosen" run above
    padded, padded_out = run_once(None, None, PILLOW_ALIGNMENT="64")
    for done in (want, padded):
        assert done.returncode == 0, done.stderr[-3000:]
    shards = {"pillow": _shards(want_out), "padded": _shards(padded_out)}
    assert shards["pillow"] and shards["padded"] == shards["pillow"]
    manifest = json.loads((padded_out / "manifest.json").read_text())
    assert manifest["resize_fallback"] == [resample.PADDED_LINES]
    (line,) = _fallback_lines(padded.stderr)
    assert "Pillow pads its image lines (PILLOW_ALIGNMENT" in line, line
