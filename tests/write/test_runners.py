"""--runner is checked before any work: a name Beam does not know is a bad option, not a failed job."""
from __future__ import annotations

import pytest
from helpers import make_tree

from beam_prep import prepare
from beam_prep.errors import OptionsError
from beam_prep.write.plan.runners import KNOWN_RUNNERS, check_runner, is_local_runner
from pipelines import cli


@pytest.fixture
def tree(tmp_path):
    make_tree(tmp_path / "in", {"a": 2, "b": 2}, size=(12, 10))
    return tmp_path / "in"


def test_an_unknown_runner_exits_2_with_one_line_and_creates_nothing(capsys, tree, tmp_path):
    out = tmp_path / "out"
    code = cli.main(["prepare", "--input", str(tree), "--output", str(out), "--runner", "NoSuchRunner"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: --runner NoSuchRunner is not a Beam runner: use one of ")
    assert all(name in err for name in ("DirectRunner", "DataflowRunner", "PrismRunner")), err
    assert not out.exists()


def test_the_library_refuses_an_unknown_runner_by_its_keyword_and_creates_nothing(tree, tmp_path):
    with pytest.raises(OptionsError, match=r"runner NoSuchRunner is not a Beam runner: use one of .*DirectRunner"):
        prepare(str(tree), str(tmp_path / "out"), runner="NoSuchRunner")
    assert not (tmp_path / "out").exists()


def test_a_near_miss_is_named_with_the_runner_it_resembles():
    with pytest.raises(OptionsError, match=r"^--runner DirectRuner is not a Beam runner \(did you mean DirectRunner\?\)"):
        check_runner("DirectRuner")


def test_a_name_unlike_any_runner_suggests_none():
    with pytest.raises(OptionsError) as raised:
        check_runner("NoSuchRunner")
    assert "did you mean" not in str(raised.value)


@pytest.mark.parametrize("given,name", [
    ("DirectRunner", "DirectRunner"), ("direct", "DirectRunner"), ("dataflowrunner", "DataflowRunner"),
    ("Prism", "PrismRunner"), (None, None),
    ("apache_beam.runners.direct.direct_runner.BundleBasedDirectRunner",
     "apache_beam.runners.direct.direct_runner.BundleBasedDirectRunner"),
])
def test_every_spelling_beam_takes_is_taken(given, name):
    assert check_runner(given) == name


def test_every_runner_named_in_the_message_is_one_beam_knows():
    from apache_beam.runners.runner import _RUNNER_MAP

    assert {name.lower() for name in KNOWN_RUNNERS} <= set(_RUNNER_MAP)


@pytest.mark.parametrize("dotted,message", [
    ("no_such_package.MyRunner", "cannot import no_such_package"),
    ("beam_prep.errors.OptionsError", "beam_prep.errors has no PipelineRunner class OptionsError"),
])
def test_a_dotted_path_must_import_a_runner_class(dotted, message):
    with pytest.raises(OptionsError, match=f"^--runner {dotted}: {message}"):
        check_runner(dotted)


def test_a_dataflow_runner_by_another_spelling_still_gets_dataflows_checks(capsys):
    """``--runner dataflow`` is Dataflow to Beam, so it needs a project as DataflowRunner does."""
    code = cli.main(["prepare", "--input", "gs://b/in", "--output", "gs://b/out", "--runner", "dataflow"])
    assert code == 2
    assert "DataflowRunner needs --project and --region" in capsys.readouterr().err


@pytest.mark.parametrize("runner", ["FlinkRunner", "SparkRunner", "PortableRunner", "spark"])
def test_a_remote_runner_refuses_a_local_output_in_one_line_and_creates_nothing(capsys, tree, tmp_path, runner):
    """Its workers see their own disks: a shuffle-sink run on a local folder ended "records were lost"."""
    out = tmp_path / "out"
    code = cli.main(["prepare", "--input", "gs://bucket/in", "--output", str(out), "--runner", runner])
    err = capsys.readouterr().err
    assert code == 2
    name = check_runner(runner)
    assert err == f"error: {name} workers cannot see local paths: --output must be gs://, not {out}\n"
    assert not out.exists()


def test_a_remote_runner_refuses_a_local_input_first(capsys, tree, tmp_path):
    out = tmp_path / "out"
    assert cli.main(["prepare", "--input", str(tree), "--output", str(out), "--runner", "FlinkRunner"]) == 2
    assert capsys.readouterr().err == f"error: FlinkRunner workers cannot see local paths: --input must be gs://, not {tree}\n"
    assert not out.exists()


@pytest.mark.parametrize("runner,local", [
    (None, True), ("DirectRunner", True), ("PrismRunner", True), ("FnApiRunner", True),
    ("apache_beam.runners.direct.direct_runner.BundleBasedDirectRunner", True),
    ("DataflowRunner", False), ("FlinkRunner", False), ("SparkRunner", False), ("PortableRunner", False),
    ("my_package.runners.MyRunner", False),
])
def test_which_runners_run_their_workers_here(runner, local):
    assert is_local_runner(runner) is local
