"""``--help`` lists every beam-prep option, by section, with its default; ``--help_beam`` lists Beam's."""
from __future__ import annotations

import argparse
import re
import subprocess

import pytest
from helpers import REPO

from beam_prep.cli.options import SECTIONS, PrepareImagesOptions
from beam_prep.write.run.beam_compat import BeamArgumentParser, add_options_arguments
from pipelines import cli, prepare_images


def declared() -> list[tuple[str, argparse.Action]]:
    """(section title, option) for every option PrepareImagesOptions declares."""
    parser = BeamArgumentParser(add_help=False)
    add_options_arguments(PrepareImagesOptions, parser)
    return [(group.title, action) for group in parser._action_groups for action in group._group_actions]


def sections(text: str) -> dict[str, str]:
    """The help's sections by title: a line ending in ':' at column 0 opens one."""
    found: dict[str, str] = {}
    title = None
    for line in text.splitlines():
        if re.fullmatch(r"[a-z][a-z ]*:", line):
            title = line[:-1]
            found[title] = ""
        elif title is not None:
            found[title] += line + "\n"
    return found


def entry(section: str, flag: str) -> str:
    """An option's entry in a section, its lines joined into one, spaces collapsed."""
    match = re.search(rf"^  {re.escape(flag)}\b.*?(?=^  -|\Z)", section, re.MULTILINE | re.DOTALL)
    assert match, f"{flag} not in\n{section}"
    return " ".join(match.group(0).split())


@pytest.fixture(scope="module")
def help_text() -> str:
    result = subprocess.run(prepare_images.command("--help"), cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_every_option_is_in_its_section_with_its_default(help_text):
    by_title = sections(help_text)
    options = declared()
    assert {title for title, _ in options} == set(SECTIONS), "an option outside the sections"
    for title, action in options:
        text = entry(by_title[title], action.option_strings[0])
        if action.default is None:  # a choice made later: the help says which, or that it is required
            assert "(default: " in text or "(required)" in text, text
        elif action.nargs == 0:
            assert "(default: off)" in text, text
        else:
            assert f"(default: {action.default})" in text, text


def test_sections_come_in_order_after_the_usage(help_text):
    assert help_text.startswith("usage: beam-prep prepare --input ROOT --output OUT")
    assert "python -m pipelines.prepare_images ..." in help_text.split("\n\n")[0]
    positions = [help_text.index(f"\n{title}:\n") for title in SECTIONS]
    assert positions == sorted(positions)


def test_the_help_shows_a_local_and_a_dataflow_example_and_where_beams_options_are(help_text):
    examples = sections(help_text)["examples"]
    assert "beam-prep prepare --input photos --output photos-tfrecords" in examples
    assert "--runner DataflowRunner --project PROJECT --region" in examples
    assert "--help_beam lists them all" in help_text
    # Dataflow's progress is its counters.
    assert "Job metrics" in help_text and "failed_<stage>" in help_text


def test_beam_prep_prepare_prints_the_same_help(help_text, capsys):
    assert cli.main(["prepare", "--help"]) == 0
    assert capsys.readouterr().out == help_text


def test_help_wins_over_other_flags_and_starts_nothing(help_text, capsys, tmp_path):
    assert prepare_images.main(["--input", str(tmp_path / "nope"), "--image-size", "9", "--help"]) == 0
    out, err = capsys.readouterr()
    assert out == help_text and err == ""


def test_help_beam_lists_beams_options_by_class(capsys):
    assert prepare_images.main(["--help_beam"]) == 0
    out = capsys.readouterr().out
    for title, flag in (("StandardOptions", "--runner"), ("DirectOptions", "--direct_num_workers"),
                        ("GoogleCloudOptions", "--temp_location"), ("WorkerOptions", "--machine_type")):
        assert flag in sections_of_classes(out)[title], title
    assert "--image_size" not in out  # ours are in --help


def sections_of_classes(text: str) -> dict[str, str]:
    return dict(re.findall(r"^(\w+Options):\n(.*?)(?=^\w+Options:|\Z)", text, re.MULTILINE | re.DOTALL))


def test_dry_run_is_among_the_run_options_with_what_it_does_here(help_text, capsys):
    """A headline flag, declared by Beam's TestOptions ("Used in unit testing runners ..."): the help
    lists it with beam-prep's meaning, and --help_beam too."""
    text = entry(sections(help_text)["run"], "--dry_run")
    assert text.startswith("--dry_run List the tree and plan the run (images and shards per split, labels, "
                           "skipped files), print the plan and write nothing;"), text
    assert text.endswith("(default: off)"), text
    assert prepare_images.main(["--help_beam"]) == 0
    beams = entry(sections_of_classes(capsys.readouterr().out)["TestOptions"], "--dry_run")
    assert "unit testing" not in beams and "print the plan and write nothing" in beams, beams
