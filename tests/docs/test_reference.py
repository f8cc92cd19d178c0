"""The generated reference pages (docs/reference/cli.md, records.md) are what
``python -m pipelines.reference_docs`` writes today: a flag, a default or a record key
changed in the code and not regenerated fails here."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from helpers import REPO

from beam_prep.model.features import SCHEMA
from pipelines import reference_docs
from pipelines.cli import COMMANDS


@pytest.fixture(scope="module")
def pages():
    return reference_docs.rendered()


def test_committed_pages_are_what_the_generator_writes(pages):
    stale = [str(path) for path, text in pages.items() if (REPO / path).read_text(encoding="utf-8") != text]
    assert not stale, f"regenerate with python -m pipelines.reference_docs: {', '.join(stale)} differ"


def test_every_flag_of_every_command_is_on_the_cli_page(pages):
    page = pages[reference_docs.REFERENCE / "cli.md"]
    for name, (module, _) in COMMANDS.items():
        parser = __import__(module, fromlist=["parser"]).parser()
        assert f"## beam-prep {name}" in page
        for action in parser._actions:
            for flag in action.option_strings:
                if flag.startswith("--"):
                    assert f"`{flag}" in page, f"{name} {flag} missing from the command-line reference"
    # Beam's options are listed too: prepare passes them on.
    for flag in ("--runner", "--direct_num_workers", "--temp_location", "--setup_file"):
        assert f"`{flag} " in page


def test_defaults_and_choices_are_rendered(pages):
    page = pages[reference_docs.REFERENCE / "cli.md"]
    assert "| `--resize_mode RESIZE_MODE` | `center_crop` | One of `center_crop`, " in page
    assert "| `--overwrite` | off |" in page
    assert "| `--input INPUT` | required |" in page


def test_every_record_key_is_on_the_records_page(pages):
    page = pages[reference_docs.REFERENCE / "records.md"]
    for key in SCHEMA:
        assert f"| `{key}` | " in page
    assert "`<key>.cls`" in page


def test_check_names_a_differing_page_and_ignores_the_terminal(tmp_path):
    """``--check`` exits 0 on the committed pages whatever the terminal's width, and
    ``differing`` names a page edited by hand."""
    env = {**os.environ, "COLUMNS": "37", "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "pipelines.reference_docs", "--check"], check=False, cwd=REPO,
                            env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    shutil.copytree(REPO / "docs" / "reference", tmp_path / "docs" / "reference")
    cli = tmp_path / reference_docs.REFERENCE / "cli.md"
    cli.write_text(cli.read_text(encoding="utf-8").replace("| `--overwrite` | off |", "| `--overwrite` | on |"),
                   encoding="utf-8")
    assert reference_docs.differing(tmp_path) == [reference_docs.REFERENCE / "cli.md"]
