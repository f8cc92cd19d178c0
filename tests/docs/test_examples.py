"""Every command and Python block in the README and the docs site runs, so none can rot.

Each page's ``bash`` and ``python`` blocks run in order, in a fresh folder of their own
that holds the sample tree (``python -m pipelines.make_sample sample_data``), so a later
block can read what an earlier one wrote, as a reader following the page would; consecutive
``python`` blocks share one interpreter, as in a notebook, except a script (a block with an
``if __name__ == "__main__":`` guard), which runs as a user saves and runs it: as its own
file, whose worker processes (Grain's, a DataLoader's) import it again. Other
fences (``console``, ``json``...) are not run.

A ``text`` block shows what the runnable block above it printed (stdout and stderr, as a
terminal shows them), and is compared with it: ``output_matches`` masks what varies by machine
(timings, rates, dates, temporary paths, process ids), and ``...`` in the page stands for any text
in a line, or, alone on its line, for any lines. The folder the blocks run in shows as ``/home/me``,
their temporary folder as ``$TMPDIR``. A ``text`` block that is no output says why on
the line before its fence, with one of ``NOT_OUTPUT``'s reasons: ``<!-- not-output: layout -->``.

A block that cannot run here says why on the line before its fence, with one of
``NOT_RUN``'s reasons: ``<!-- not-run: cloud -->``. A block that shows a refused run
says the exit code it must end with: ``<!-- exit: 2 -->``.
"""
from __future__ import annotations

import difflib
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
# Why a text block may be no command's output: nothing else excuses one.
NOT_OUTPUT = {
    "layout": "a folder's layout or a file's form, annotated by hand",
    "form": "the form of a command or a line, with a placeholder where each use differs",
    "command": "a command shown, not run: it needs data the docs test does not have (ImageNet, a download)",
    "not-run": "what a command prints where this machine cannot make it so (a cloud job, a library missing)",
    "scenario": "what a run the page does not make prints (another tree, a full disk, a signal, a second run "
                "at once): the tests of that behaviour check its words",
    "generated": "a generated reference page's usage text: tests/docs/test_reference.py checks it",
    "formula": "arithmetic, no command's output",
}
RUN = {"bash", "sh", "python"}
OUTPUT = "text"
READERS_FOLDER = "/home/me"  # what a page's output calls the folder its blocks run in
BLOCK_TIMEOUT_S = 600
# The system's temporary folder, read at collection, before any test points TMPDIR at its own folder.
SYSTEM_TMP = tempfile.gettempdir()

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)\s*(?P<info>[\w+-]*)[^\n]*$")
_MARK = re.compile(r"^\s*<!--\s*(?P<key>not-run|not-output|exit):\s*(?P<value>[\w-]+)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    page: str
    line: int
    language: str
    code: str
    not_run: str | None = None
    exit_code: int = 0
    not_output: str | None = None


def pages() -> list[pathlib.Path]:
    """The README and every page of the site."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def blocks(page: pathlib.Path) -> list[Block]:
    """The fenced blocks of ``page``, with the marks on the line before each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    rel = page.relative_to(REPO).as_posix() if page.is_relative_to(REPO) else page.as_posix()
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
                           marks.get("not-run"), int(marks.get("exit", 0)), marks.get("not-output")))
        i = k + 1
    return found


def test_every_mark_names_a_known_reason():
    for page in pages():
        for b in blocks(page):
            assert b.not_run is None or b.not_run in NOT_RUN, (
                f"{b.page}:{b.line}: not-run reason {b.not_run!r} is not one of {sorted(NOT_RUN)}")


def outputs(page: pathlib.Path) -> tuple[dict[int, Block], list[str]]:
    """The ``text`` blocks to compare, by the line of the runnable block whose output each shows, and
    what is wrong with the others: a text block not marked ``not-output`` shows the output of the
    nearest runnable block above it, which must run, and show no other."""
    shown: dict[int, Block] = {}
    wrong: list[str] = []
    above: Block | None = None
    for b in blocks(page):
        if b.language in RUN:
            above = b
        if b.language != OUTPUT:
            continue
        where = f"{b.page}:{b.line}"
        if b.not_output is not None:
            if b.not_output not in NOT_OUTPUT:
                wrong.append(f"{where}: not-output reason {b.not_output!r} is not one of {sorted(NOT_OUTPUT)}")
        elif above is None or above.not_run is not None:
            wrong.append(f"{where}: a text block with no block run above it: mark it <!-- not-output: REASON -->, "
                         f"REASON one of {sorted(NOT_OUTPUT)}")
        elif above.line in shown:
            wrong.append(f"{where}: a second text block for {above.page}:{above.line}, whose output "
                         f"{shown[above.line].page}:{shown[above.line].line} shows: mark it <!-- not-output: REASON -->")
        else:
            shown[above.line] = b
    return shown, wrong


def test_every_text_block_is_an_output_checked_or_says_why_not():
    wrong = [line for page in pages() for line in outputs(page)[1]]
    assert not wrong, "\n".join(wrong)


# What varies by machine and run, masked alike in a page's text and in what its command printed.
_MASKS = (
    (re.compile(r"\x1b\[[0-9;?]*[A-Za-z]"), ""),  # a terminal's colours and cursor moves
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:?\d\d)?"), "<time>"),
    (re.compile(r"(?<![\w/.-])(/tmp|/var/folders|/private)/[^\s'\",;:)]*"), "<path>"),
    (re.compile(r"\b\d[\d,]*(\.\d+)?(?= ?(s|ms|min|seconds?)\b)"), "<n>"),
    (re.compile(r"\b\d[\d,]*(\.\d+)?(?= ?\w*/s\b)"), "<n>"),  # rates: images/s, MB/s
    (re.compile(r"\b(pid|process) \d+"), r"\1 <n>"),
    (re.compile(r"\b\d+(\.\d+)? (KiB|MiB|GiB|kB|MB|GB)\b"), "<size>"),  # file sizes: the JPEG encoder's
    (re.compile(r"(?<=\S)  +"), "  "),  # a table's padding: its columns' widths follow the masked values
)


# Lines other libraries log as they load (TensorFlow's C++ log, Python's warnings and the source line
# under each), never beam-prep's: a page does not show them.
_NOISE = re.compile(r"WARNING: All log messages before absl::InitializeLog\(\)|[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ "
                    r"[\w.]+:\d+\] |To enable the following instructions: |\S+\.py:\d+: \w*Warning: ")


def masked(text: str) -> list[str]:
    """``text``'s lines as a page compares them: what a progress bar redrew (``\\r``) gone, other
    libraries' log lines (``_NOISE``) dropped, each line's trailing blanks and what varies by machine
    masked (``_MASKS``), no blank lines at either end."""
    lines: list[str] = []
    noise = False
    for line in text.splitlines():
        line = line.rsplit("\r", 1)[-1].rstrip()
        if _NOISE.match(line) or (noise and line.startswith("  ")):
            noise = True
            continue
        noise = False
        for pattern, replacement in _MASKS:
            line = pattern.sub(replacement, line)
        lines.append(line)
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return lines


def output_matches(shown: str, printed: str) -> str | None:
    """None where ``printed`` is what the page ``shown`` says, masked alike; else a diff of the two.
    ``...`` in ``shown`` is any text within its line; a line of ``...`` alone, any lines (none too)."""
    page, got = masked(shown), masked(printed)
    pattern = "".join(r"(?:[^\n]*\n)*?" if line.strip() == "..." else
                      ".*".join(map(re.escape, line.split("..."))) + r"\n" for line in page)
    if re.fullmatch(pattern, "".join(line + "\n" for line in got)):
        return None
    return "\n".join(difflib.unified_diff(page, got, "the page", "printed", lineterm=""))


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
    env["LC_ALL"] = "C.UTF-8"  # one order for ls, one way to write numbers, on every machine
    return env


def reading_order() -> list[pathlib.Path]:
    """The README, then the guides in the order the site's navigation lists them (mkdocs.yml)."""
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    guides = next(section["Guides"] for section in nav if "Guides" in section)
    return [REPO / "README.md", *(REPO / "docs" / path for entry in guides for path in entry.values())]


def _runnable_pages() -> list[pathlib.Path]:
    """The pages with blocks to run, but the README and the guides: those run in reading order in one
    folder (``test_the_guides_run_in_reading_order_in_one_folder``), each output block checked as here."""
    chained = set(reading_order())
    return [p for p in pages() if p not in chained and any(b.language in RUN and b.not_run is None for b in blocks(p))]


# Consecutive Python blocks run in one interpreter, one after the other in one namespace, as a
# reader runs them in a notebook or a REPL: each block's own process would import TensorFlow again.
_BEGINS = "\x1e block "  # _SESSION's line before each block's output: where the block is on its page
_SESSION = """
import json, sys, traceback
ns = {"__name__": "__main__"}
for where, code in json.load(open(sys.argv[1])):
    sys.stdout.flush(); sys.stderr.flush()
    print(sys.argv[2] + where, flush=True)
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
    shown, _ = outputs(page)
    drifted = []
    for n, step in enumerate(_steps(page)):
        first = step[0]
        if is_script(first):
            script = folder / f"block_{first.line}.py"
            script.write_text(first.code)
            cmd = [sys.executable, script.name]
        elif first.language == "python":
            listing = folder.parent / f"{folder.name}-blocks-{n}.json"
            listing.write_text(json.dumps([[f"{b.page}:{b.line}", b.code] for b in step]))
            cmd = [sys.executable, "-c", _SESSION, str(listing), _BEGINS]
        else:
            cmd = ["bash", "-c", "set -euo pipefail\n" + first.code]
        try:
            done = subprocess.run(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, errors="replace", timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"{first.page}:{first.line}: still running after {BLOCK_TIMEOUT_S} s"
        if done.returncode != first.exit_code:
            code = "".join(f"# {b.page}:{b.line}\n{b.code}" for b in step)
            return (f"{first.page}:{first.line}: exit {done.returncode}, expected {first.exit_code}\n"
                    f"--- code\n{code}--- output\n{done.stdout[-6000:]}")
        printed = _each_blocks_output(step, done.stdout)
        for b in step:
            if b.line in shown:
                seen = printed[b.line].replace(tmp, "$TMPDIR").replace(str(folder), READERS_FOLDER)
                diff = output_matches(shown[b.line].code, seen)
                if diff is not None:
                    drifted.append(f"{shown[b.line].page}:{shown[b.line].line}: the page's output of "
                                   f"{b.page}:{b.line} is not what it printed (masked):\n{diff}")
    return "\n".join(drifted) or None


def _each_blocks_output(step: list[Block], output: str) -> dict[int, str]:
    """What each block of ``step`` printed, by its line: a Python session's output cut at ``_BEGINS``."""
    if len(step) == 1 and _BEGINS not in output:
        return {step[0].line: output}
    printed: dict[int, str] = {}
    for part in output.split(_BEGINS)[1:]:
        where, _, text = part.partition("\n")
        printed[int(where.rsplit(":", 1)[1])] = text
    return printed


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


FAKE_PAGE = """# A page

```bash
echo "wrote 3 files in 2.5 s (1,234 images/s) to $TMPDIR/out"
echo "3 files"
```

```text
wrote 3 files in 0.4 s (99 images/s) to $TMPDIR/out
3 files
```

```python
print("a")
```

```python
import sys
print("b", file=sys.stderr)
print("c")
```

```text
b
...
```
"""


def _fake(tmp_path: pathlib.Path, text: str) -> str | None:
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    (tmp_path / "run").mkdir()
    return _run_page(page, tmp_path / "run", str(tmp_path))


@pytest.mark.slow  # runs the page's blocks
def test_a_page_whose_output_is_what_its_blocks_print_passes_with_timings_and_paths_masked(tmp_path):
    assert _fake(tmp_path, FAKE_PAGE) is None


@pytest.mark.slow  # runs the page's blocks
@pytest.mark.parametrize("drift, shown", [
    ("3 files\n```\n\n```python", "3 files\nand more\n```\n\n```python"),  # a line the command no longer prints
    ("wrote 3 files in 0.4 s", "wrote 4 files in 0.4 s"),  # a count changed: counts are never masked
    ("b\n...\n```", "c\n...\n```"),  # the second Python block's output, not the first's
])
def test_a_page_that_drifted_from_its_commands_fails_naming_its_block(tmp_path, drift, shown):
    assert drift in FAKE_PAGE
    page = FAKE_PAGE.replace(drift, shown)
    failure = _fake(tmp_path, page)
    assert failure is not None and "is not what it printed" in failure, failure
    first, second = [i + 1 for i, line in enumerate(page.splitlines()) if line == "```text"]
    assert failure.startswith(f"{tmp_path / 'page.md'}:{first if 'files' in drift else second}: "), failure


def test_output_matching_masks_what_varies_and_nothing_else():
    assert output_matches("took 1.5 s at 2,000 images/s on 2026-01-02T03:04:05+00:00\n",
                          "took 0.25 s at 12 images/s on 2027-11-12T13:14:15Z\n") is None
    assert output_matches("a ... c\n...\nz\n", "a b c\nx\ny\nz\n") is None
    assert output_matches("12 examples\n", "13 examples\n") is not None
    assert output_matches("a\n", "a\nb\n") is not None


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
