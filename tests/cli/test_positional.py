"""Paths typed without their flags get the command that was meant, not a bare "--input is required":
``beam-prep prepare tree out`` says ``did you mean --input tree --output out?`` and exits 2, and the
commands whose folder is positional say so of ``--output out``."""
from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import REPO

from beam_prep.api import parse_command_line
from beam_prep.cli.spelling import PATH_FLAGS, positionals_message
from beam_prep.errors import OptionsError
from pipelines import bench_reader, inspect_output, verify_output


def test_prepare_with_two_positional_paths_exits_2_with_the_command_meant(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "prepare", "tree", "out"], cwd=tmp_path,
                            env={"PYTHONPATH": str(REPO), "PATH": ""}, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().endswith("did you mean --input tree --output out?"), result.stderr
    assert "is required" not in result.stderr
    assert list(tmp_path.iterdir()) == [], "nothing is written for a refused command"


@pytest.mark.parametrize(("argv", "meant"), [
    (["tree"], "did you mean --input tree --output OUT?"),
    (["--input", "tree", "out"], "did you mean --output out?"),
    (["--output", "out", "tree"], "did you mean --input tree?"),
    (["--overwrite", "--image_size", "64", "tree", "out"], "did you mean --input tree --output out?"),
    (["--dry_run", "tree", "out"], "did you mean --input tree --output out?"),
    (["my tree", "out"], "did you mean --input 'my tree' --output out?"),
])
def test_prepare_names_the_flags_each_positional_path_stands_for(argv, meant):
    with pytest.raises(OptionsError) as e:
        parse_command_line(argv)
    assert str(e.value).endswith(meant)


def test_an_argument_beyond_both_paths_is_named_as_unexpected(tmp_path):
    with pytest.raises(OptionsError, match=r"unexpected argument extra: every option is a flag \(--input ROOT"):
        parse_command_line(["--input", str(tmp_path), "--output", str(tmp_path / "out"), "extra"])


def test_positionals_message_pairs_values_with_the_missing_flags_in_order():
    assert positionals_message(["a", "b"], ["--input", "--output"], PATH_FLAGS).endswith(
        "did you mean --input a --output b?")
    assert positionals_message(["a", "b", "c"], ["--input", "--output"], PATH_FLAGS).startswith(
        "unexpected arguments a b c:")


@pytest.mark.parametrize(("module", "name"), [(verify_output, "verify"), (bench_reader, "bench"),
                                              (inspect_output, "inspect")])
@pytest.mark.parametrize(("argv", "meant"), [
    (["--output", "records"], "records"),
    (["--input=records"], "records"),
])
def test_commands_whose_folder_is_positional_say_so_of_a_path_flag(module, name, argv, meant, capsys):
    with pytest.raises(SystemExit) as e:
        module.main(argv)
    assert e.value.code == 2
    error = capsys.readouterr().err
    assert f"OUT is a positional argument, not {argv[0].split('=')[0]}: did you mean beam-prep {name} {meant}?" \
        in error, error
