"""Every command and Python block in the README and the docs site runs, so none can rot.

Each page's ``bash`` and ``python`` blocks run in order, in a fresh folder of their own
that holds the sample tree (``python -m pipelines.make_sample sample_data``), so a later
block can read what an earlier one wrote, as a reader following the page would; consecutive
``python`` blocks share one interpreter, as in a notebook, except a script (a block with an
``if __name__ == "__main__":`` guard), which runs as a user saves and runs it: as its own
file, whose worker processes (Grain's, a DataLoader's) import it again. Other
fences (``text``, ``console``, ``json``...) show output and are not run.

A block that cannot run here says why on the line before its fence, with one of
``NOT_RUN``'s reasons: ``<!-- not-run: cloud -->``. A block that shows a refused run
says the exit code it must end with: ``<!-- exit: 2 -->``.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import pytest
import yaml
from helpers import REPO

# Why a block may be left out: nothing else excuses one.
NOT_RUN = {
    "cloud": "needs a Google Cloud project (a gs:// bucket or Dataflow)",
    "install": "sets up a machine (a virtual environment, pip install, .ci/run): CI does that itself",
    "benchmark": "times this machine for minutes; the benchmarks' own tests run them small",
}
RUN = {"bash", "sh", "python"}
BLOCK_TIMEOUT_S = 600
# The system's temporary folder, read at collection, before any test points TMPDIR at its own folder.
SYSTEM_TMP = tempfile.gettempdir()

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)\s*(?P<info>[\w+-]*)[^\n]*$")
_MARK = re.compile(r"^\s*<!--\s*(?P<key>not-run|exit):\s*(?P<value>[\w-]+)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    page: str
    line: int
    language: str
    code: str
    not_run: str | None = None
    exit_code: int = 0


def pages() -> list[pathlib.Path]:
    """The README and every page of the site."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def blocks(page: pathlib.Path) -> list[Block]:
    """The fenced blocks of ``page``, with the marks on the line before each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    rel = page.relative_to(REPO).as_posix()
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        marks = {}
        j = i - 1
        while j >= 0 and _MARK.match(lines[j]):
            mk = _MARK.match(lines[j])
            marks[mk["key"]] = mk["value"]
            j -= 1
        indent, fence = len(m["indent"]), m["fence"]
        body, k = [], i + 1
        while k < len(lines) and not lines[k].strip().startswith(fence):
            body.append(lines[k][indent:] if lines[k][:indent].strip() == "" else lines[k])
            k += 1
        found.append(Block(rel, i + 1, m["info"].lower(), "\n".join(body) + "\n",
                           marks.get("not-run"), int(marks.get("exit", 0))))
        i = k + 1
    return found


def test_every_mark_names_a_known_reason():
    for page in pages():
        for b in blocks(page):
            assert b.not_run is None or b.not_run in NOT_RUN, (
                f"{b.page}:{b.line}: not-run reason {b.not_run!r} is not one of {sorted(NOT_RUN)}")


def test_the_grain_and_pytorch_pages_loaders_run_as_scripts():
    """Their worker processes import the script again: run in a notebook's interpreter, they would not.
    (They ran as scripts against the PyTorch readers' datasets too; here, against the page's own.)"""
    scripts = [b for b in blocks(REPO / "docs" / "guides" / "grain-pytorch.md") if is_script(b)]
    assert len(scripts) == 3 and any("import jax" in b.code for b in scripts)
    assert all(b.not_run is None for b in scripts)


@pytest.fixture(scope="session")
def sample_tree(tmp_path_factory) -> pathlib.Path:
    tree = tmp_path_factory.mktemp("docs-sample") / "sample_data"
    subprocess.run([sys.executable, "-m", "pipelines.make_sample", str(tree)], cwd=REPO, check=True,
                   capture_output=True)
    return tree


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # beam-prep and python are the ones this suite runs with; `python -m benchmarks...`
    # and `python -m pipelines...` find the checkout.
    env["PATH"] = os.pathsep.join([str(pathlib.Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["REPO"] = str(REPO)
    return env


def _runnable_pages() -> list[pathlib.Path]:
    return [p for p in pages() if any(b.language in RUN and b.not_run is None for b in blocks(p))]


# Consecutive Python blocks run in one interpreter, one after the other in one namespace, as a
# reader runs them in a notebook or a REPL: each block's own process would import TensorFlow again.
_SESSION = """
import json, sys, traceback
ns = {"__name__": "__main__"}
for where, code in json.load(open(sys.argv[1])):
    try:
        exec(compile(code, where, "exec"), ns)
    except SystemExit as e:
        if e.code not in (None, 0):
            print(f"{where}: exited {e.code}", file=sys.stderr)
            sys.exit(e.code if isinstance(e.code, int) else 1)
    except BaseException:
        traceback.print_exc()
        print(f"{where}: failed", file=sys.stderr)
        sys.exit(1)
"""


_MAIN_GUARD = re.compile(r"""^if __name__ == ["']__main__["']:""", re.MULTILINE)


def is_script(block: Block) -> bool:
    """A Python block written as a script: it runs as its own file, never with other blocks."""
    return block.language == "python" and bool(_MAIN_GUARD.search(block.code))


def _steps(page: pathlib.Path) -> list[list[Block]]:
    """The page's runnable blocks in order, consecutive Python blocks (exit 0, not scripts) grouped as one step."""
    steps: list[list[Block]] = []
    for b in blocks(page):
        if b.language not in RUN or b.not_run is not None:
            continue
        if (b.language == "python" and b.exit_code == 0 and not is_script(b) and steps
                and steps[-1][0].language == "python" and steps[-1][0].exit_code == 0
                and not is_script(steps[-1][0])):
            steps[-1].append(b)
        else:
            steps.append([b])
    return steps


def _run_page(page: pathlib.Path, folder: pathlib.Path, tmp: str) -> str | None:
    """Runs ``page``'s examples in ``folder`` (which holds the sample tree), their temporary files
    in ``tmp``; None, or why the first failing step failed."""
    env = {**_env(), "TMPDIR": tmp}
    for n, step in enumerate(_steps(page)):
        first = step[0]
        if is_script(first):
            script = folder / f"block_{first.line}.py"
            script.write_text(first.code)
            cmd = [sys.executable, script.name]
        elif first.language == "python":
            listing = folder.parent / f"{folder.name}-blocks-{n}.json"
            listing.write_text(json.dumps([[f"{b.page}:{b.line}", b.code] for b in step]))
            cmd = [sys.executable, "-c", _SESSION, str(listing)]
        else:
            cmd = ["bash", "-c", "set -euo pipefail\n" + first.code]
        try:
            done = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True,
                                  timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"{first.page}:{first.line}: still running after {BLOCK_TIMEOUT_S} s"
        if done.returncode != first.exit_code:
            code = "".join(f"# {b.page}:{b.line}\n{b.code}" for b in step)
            return (f"{first.page}:{first.line}: exit {done.returncode}, expected {first.exit_code}\n"
                    f"--- code\n{code}--- stdout\n{done.stdout[-4000:]}--- stderr\n{done.stderr[-4000:]}")
    return None


@pytest.mark.parametrize("page", _runnable_pages(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_page_examples_run(page: pathlib.Path, sample_tree: pathlib.Path, tmp_path: pathlib.Path):
    """One page a test, its blocks in order in a folder of its own: the suite's scheduler
    (``conftest.pytest_xdist_make_scheduler``) gives each page to whichever worker is free.

    Their temporary files go to a folder of the system's temporary folder, as a reader's do, not
    under the test's: Ray (the DALI page) puts sockets there, whose paths must fit in 107 bytes.
    """
    shutil.copytree(sample_tree, tmp_path / "page" / "sample_data")
    with tempfile.TemporaryDirectory(prefix="page-", dir=SYSTEM_TMP) as tmp:
        failure = _run_page(page, tmp_path / "page", tmp)
    assert failure is None, failure


def reading_order() -> list[pathlib.Path]:
    """The README, then the guides in the order the site's navigation lists them (mkdocs.yml)."""
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    guides = next(section["Guides"] for section in nav if "Guides" in section)
    return [REPO / "README.md", *(REPO / "docs" / path for entry in guides for path in entry.values())]


def quick_start_commands() -> str:
    """The README's Quick start's own ``beam-prep`` commands: its block sets up a machine
    (``not-run: install``), yet what it prepares is in the reader's folder when the guides start."""
    install = next(b for b in blocks(REPO / "README.md") if b.not_run == "install")
    commands = [part.strip() for line in install.code.splitlines() if not line.lstrip().startswith("#")
                for part in line.split("&&") if part.strip().startswith("beam-prep ")]
    assert commands, install.code
    return "\n".join(commands) + "\n"


def test_the_guides_run_in_reading_order_in_one_folder(sample_tree: pathlib.Path, tmp_path: pathlib.Path):
    """A reader follows the README, then every guide in turn, in one folder: no page's command may
    find a folder an earlier page wrote (each writes its own, or reuses one as it says)."""
    pages = reading_order()
    assert len(pages) > 10 and all(p.exists() for p in pages), pages
    folder = tmp_path / "reader"
    shutil.copytree(sample_tree, folder / "sample_data")
    with tempfile.TemporaryDirectory(prefix="pages-", dir=SYSTEM_TMP) as tmp:
        quick_start = subprocess.run(["bash", "-c", "set -euo pipefail\n" + quick_start_commands()], cwd=folder,
                                     env={**_env(), "TMPDIR": tmp}, capture_output=True, text=True,
                                     timeout=BLOCK_TIMEOUT_S)
        assert quick_start.returncode == 0, quick_start.stderr
        for page in pages:
            failure = _run_page(page, folder, tmp)
            assert failure is None, f"after the pages before it in reading order: {failure}"
