"""What the command line says when a flag is unknown."""
from __future__ import annotations

import pytest

from beam_prep.errors import OptionsError
from beam_prep.flags import check_flags, known_flags, nearest_flag, unknown_flags
from conftest import run_prepare
from pipelines import prepare_images
from trees import make_tree


@pytest.fixture
def tree(tmp_path):
    make_tree(tmp_path / "in", {"a": 4, "b": 4}, size=(64, 64), fmt="PNG", ext=".png")
    return tmp_path / "in"


# Unknown flags.

def test_a_misspelled_flag_is_named_with_the_nearest_known_one():
    with pytest.raises(OptionsError, match=r"^unknown option --image-size; did you mean --image_size\?$"):
        check_flags(["--input", "x", "--image-size", "64"])


def test_every_unknown_flag_is_named():
    with pytest.raises(OptionsError) as raised:
        check_flags(["--validation_perc=10", "--image-size", "64", "--frobnicate"])
    assert str(raised.value) == ("unknown options --validation_perc (did you mean --validation_percent?), "
                                 "--image-size (did you mean --image_size?), --frobnicate")


def test_values_after_an_unknown_flag_are_not_flags():
    assert unknown_flags(["--image-size", "64", "--foo=1", "--bar", "-5", "--", "--after-the-end"]) \
        == ["--image-size", "--foo", "--bar"]


def test_dashes_and_underscores_count_alike_in_suggestions():
    known = known_flags()
    assert nearest_flag("--image-size", known) == "--image_size"
    assert nearest_flag("--Direct-Num-Workers", known) == "--direct_num_workers"
    assert nearest_flag("--zzzzzz", known) is None


@pytest.mark.parametrize("flag,value", [
    ("--runner", "DirectRunner"), ("--direct_num_workers", "2"), ("--direct_running_mode", "in_memory"),
    ("--temp_location", "gs://bucket/tmp"), ("--project", "my-project"), ("--region", "us-central1"),
    ("--experiments", "use_runner_v2"), ("--setup_file", "./setup.py"), ("--dry_run", "true"),
    ("--sdk_container_image", "gcr.io/p/i"), ("--image_size", "64"), ("--overwrite", None),
])
def test_beams_flags_and_ours_are_known_in_both_forms(flag, value):
    forms = [[flag]] if value is None else [[flag, value], [f"{flag}={value}"]]
    for argv in forms:
        assert unknown_flags(argv) == [], argv
        check_flags(argv)


def test_a_bad_value_is_an_options_error_not_an_exit():
    with pytest.raises(OptionsError, match="--channels: invalid int value: 'three'"):
        check_flags(["--channels", "three"])


def test_unknown_flags_are_refused_before_the_input_is_looked_at(capsys, tmp_path):
    argv = ["--input", str(tmp_path / "missing"), "--output", str(tmp_path / "out"), "--validation_perc=10"]
    assert prepare_images.main(argv) == 2
    assert capsys.readouterr().err.strip() == \
        "error: unknown option --validation_perc; did you mean --validation_percent?"


def test_the_command_stops_on_an_unknown_flag_with_nothing_written(tree, tmp_path):
    out = tmp_path / "out"
    result = run_prepare("--input", str(tree), "--output", str(out), "--image-size", "64",
                         "--direct_running_mode", "in_memory")
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[-1] == "error: unknown option --image-size; did you mean --image_size?"
    assert not out.exists() and result.stdout == ""
