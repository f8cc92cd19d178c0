"""Bad options fail before any work starts, with a message that says what to fix."""
from __future__ import annotations

import os

import pytest
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions
from helpers import make_tree

from beam_prep.api import with_local_defaults
from beam_prep.cli.options import config_from_options
from beam_prep.write.plan.config import DEFAULT_REMOTE_READ_CONCURRENCY, PROGRESS_INTERVAL_ENV, progress_interval
from beam_prep.write.run import pipeline
from beam_prep.write.run.pipeline import local_workers
from pipelines import prepare_images


@pytest.fixture
def tree(tmp_path):
    make_tree(tmp_path / "in", {"a": 2, "b": 2})
    return tmp_path / "in"


def fails(capsys, *argv: str) -> str:
    assert prepare_images.main(list(argv)) == 2
    return capsys.readouterr().err


def test_missing_input_is_reported(capsys, tmp_path):
    assert "--input is required" in fails(capsys, "--output", str(tmp_path / "out"))


def test_input_that_does_not_exist_is_reported(capsys, tmp_path):
    err = fails(capsys, "--input", str(tmp_path / "nope"), "--output", str(tmp_path / "out"))
    assert "nope is not a directory" in err


def test_empty_tree_is_reported(capsys, tmp_path):
    (tmp_path / "in" / "a").mkdir(parents=True)
    err = fails(capsys, "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"))
    assert "no images under" in err


@pytest.mark.parametrize("flag,value,message", [
    ("--resize_mode", "squash", "--resize_mode must be one of center_crop, stretch, pad, shorter_side, none"),
    ("--image_size", "0", "--image_size must be at least 1 pixel"),
    ("--image_size", "big", "--image_size must be an int or HxW"),
    ("--image_size", "100000", "--image_size must be at most 16384 a side"),
    ("--image_size", "64x16385", "--image_size must be at most 16384 a side"),
    ("--image_format", "gif", "--image_format must be one of jpeg, png, raw, original"),
    ("--channels", "4", "--channels must be 1 or 3"),
    ("--jpeg_quality", "101", "--jpeg_quality must be in 1..100"),
    ("--validation_percent", "100", "--validation_percent must be in [0, 100)"),
    ("--num_shards", "-1", "--num_shards must be 0"),
    ("--sink", "fast", "--sink must be one of auto, streaming, shuffle"),
    ("--compression", "zstd", "--compression must be one of gzip, none"),
    ("--read_concurrency", "-1", "--read_concurrency must be in [0, 256]"),
    ("--read_concurrency", "1000", "--read_concurrency must be in [0, 256]"),
    ("--read_ahead_mb", "0", "--read_ahead_mb must be at least 1"),
    ("--label_offset", "-1", "--label_offset must be in [0, 16]"),
    ("--label_offset", "1000", "--label_offset must be in [0, 16]"),
    ("--labels_txt", "ids", "--labels_txt must be one of names, slim"),
    ("--progress_interval", "0", "--progress_interval must be more than 0 seconds"),
    ("--max_per_class", "0", "error: --max_per_class must be at least 1 (files kept per label), not 0\n"),
    ("--max_per_class", "-3", "--max_per_class must be at least 1 (files kept per label), not -3"),
    ("--max_per_class", "abc", "argument --max_per_class: invalid int value: 'abc'"),
    ("--max_failures", "-1", "error: --max_failures must be a number of files (0 or more, e.g. 10) or a percent "
                             "of the files listed from 0% to 100% (e.g. 2.5%), not '-1'\n"),
    ("--max_failures", "abc", "--max_failures must be a number of files (0 or more, e.g. 10) or a percent"),
    ("--max_failures", "150%", "from 0% to 100% (e.g. 2.5%), not '150%'"),
    ("--stratify", "--validation_percent=0", "error: --stratify gives each label its --validation_percent share "
                                             "of validation images: give --validation_percent too (e.g. "
                                             "--validation_percent 10)\n"),
])
def test_bad_values_are_reported(capsys, tree, tmp_path, flag, value, message):
    err = fails(capsys, "--input", str(tree), "--output", str(tmp_path / "out"), flag, value)
    assert message in err


def test_shorter_side_takes_one_size(capsys, tree, tmp_path):
    err = fails(capsys, "--input", str(tree), "--output", str(tmp_path / "out"),
                "--resize_mode", "shorter_side", "--image_size", "20x30")
    assert "takes one size" in err


def test_output_inside_input_is_refused(capsys, tree):
    err = fails(capsys, "--input", str(tree), "--output", str(tree / "records"))
    assert "is inside --input" in err


def test_output_reaching_into_input_through_a_link_is_refused(capsys, tree, tmp_path):
    (tmp_path / "out").symlink_to(tree / "a", target_is_directory=True)
    err = fails(capsys, "--input", str(tree), "--output", str(tmp_path / "out" / "records"))
    assert "is inside --input" in err


def test_an_existing_dataset_needs_overwrite(capsys, tree, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    (out / "train-00000-of-00001.tfrecord.gz").write_bytes(b"")
    err = fails(capsys, "--input", str(tree), "--output", str(out))
    assert "already holds a dataset" in err and "--overwrite" in err
    assert (out / "manifest.json").exists()


def test_local_runs_default_to_worker_processes_one_a_core_in_beams_words():
    argv = with_local_defaults(["--input", "x"])
    assert "--runner=DirectRunner" in argv
    assert "--direct_running_mode=multi_processing" in argv
    assert "--direct_num_workers=0" in argv  # Beam's "one a core"; the run lowers it for a small job
    assert "--direct_num_workers=0" in with_local_defaults(["--direct_running_mode=multi_threading"])
    # The in-memory mode runs one worker, and Beam warns about any other count.
    assert not any(a.startswith("--direct_num_workers") for a in with_local_defaults(["--direct_running_mode=in_memory"]))


@pytest.mark.parametrize(("flags", "images", "cores", "planned", "workers"), [
    ([], 40, 2, 2, 1),  # a sample: one worker, not one a core; its shards planned for both cores all the same
    ([], 256, 4, 4, 1),
    ([], 257, 4, 4, 2),
    ([], 700, 4, 4, 3),
    ([], 100_000, 4, 4, 4),  # never more than one a core
    ([], 0, 4, 4, 1),  # a resumed run with every shard kept
    (["--direct_num_workers=2"], 40, 4, 2, 2),  # the user's count wins
    (["--direct_running_mode=in_memory"], 100_000, 4, 1, 1),  # one worker, whatever the images
    (["--runner=DataflowRunner"], 100_000, 4, 1, 1),  # not a local runner: Beam's own default, untouched
])
def test_a_small_local_job_starts_fewer_workers(monkeypatch, flags, images, cores, planned, workers):
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    options = PipelineOptions(with_local_defaults(flags))
    assert local_workers(options) == planned
    pipeline._fit_workers(options, images)
    assert options.view_as(DirectOptions).direct_num_workers == workers


def test_a_users_own_runner_options_win():
    argv = with_local_defaults(["--runner", "DirectRunner", "--direct_num_workers", "1"])
    assert "--direct_num_workers=1" not in argv and argv.count("--direct_num_workers") == 1
    assert with_local_defaults(["--runner=DataflowRunner"]) == ["--runner=DataflowRunner"]


DATAFLOW = ["--runner", "DataflowRunner", "--project", "my-project", "--region", "us-central1",
            "--temp_location", "gs://my-bucket/tmp", "--setup_file", "./setup.py",
            "--input", "gs://my-bucket/images", "--output", "gs://my-bucket/records"]


def without(flag: str) -> list[str]:
    i = DATAFLOW.index(flag)
    return DATAFLOW[:i] + DATAFLOW[i + 2:]


@pytest.mark.parametrize("flag,message", [
    ("--project", "DataflowRunner needs --project"),
    ("--region", "DataflowRunner needs --region"),
    ("--temp_location", "DataflowRunner needs --temp_location gs://"),
    ("--setup_file", "pass --setup_file ./setup.py or --sdk_container_image"),
])
def test_dataflow_options_are_checked_before_submission(capsys, flag, message):
    assert message in fails(capsys, *without(flag))


def test_dataflow_workers_cannot_read_local_paths(capsys, tree):
    argv = without("--input") + ["--input", str(tree)]
    assert "--input must be gs://" in fails(capsys, *argv)


@pytest.mark.parametrize("source,given,expected", [
    ("local", None, 0), ("gs", None, DEFAULT_REMOTE_READ_CONCURRENCY), ("gs", "4", 4), ("local", "8", 8)])
def test_reads_run_ahead_by_default_only_for_remote_input(tree, tmp_path, source, given, expected):

    root = str(tree) if source == "local" else "gs://bucket/images"
    argv = ["--input", root, "--output", "gs://bucket/out" if source == "gs" else str(tmp_path / "out"),
            *(["--read_concurrency", given] if given else []), "--read_ahead_mb", "16"]
    reads = config_from_options(PipelineOptions(argv)).reads
    assert reads.concurrency == expected and reads.max_bytes == 16 * 2**20


def test_writeimagedataset_warns_of_originals_with_a_fixed_size_by_its_argument_names(tmp_path):
    """The transform checks its image arguments as the command checks its flags: the same warning,
    naming arguments (a library's caller sees a BeamPrepWarning, not a printed line)."""
    from beam_prep.errors import BeamPrepWarning
    from beam_prep.write.run.write_image_dataset import WriteImageDataset

    with pytest.warns(BeamPrepWarning, match=r"^image_format original with resize_mode pad keeps only the JPEGs "
                                             r"already exactly 32x32 .*: resize_mode none, or resize_mode "
                                             r"shorter_side no_upscale=True, keeps the rest$"):
        WriteImageDataset(str(tmp_path / "out"), ["a"], image_format="original", resize_mode="pad", image_size=32)


def test_the_progress_interval_is_the_flags_else_the_environments_else_30_seconds(monkeypatch):
    """$BEAM_PREP_PROGRESS_INTERVAL pins it for every run of a job (and of the tests, whose output
    must not depend on how long a run takes); the flag still wins."""
    monkeypatch.delenv(PROGRESS_INTERVAL_ENV, raising=False)
    assert progress_interval(None) == 30.0
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, "2.5")
    assert progress_interval(None) == 2.5
    assert progress_interval(7.0) == 7.0


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan"])
def test_a_bad_progress_interval_in_the_environment_is_refused_naming_it(capsys, tree, tmp_path, monkeypatch, value):
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, value)
    out = tmp_path / "out"
    err = fails(capsys, "--input", str(tree), "--output", str(out))
    assert err == f"error: BEAM_PREP_PROGRESS_INTERVAL must be more than 0 seconds, not {value}\n"
    assert not out.exists()


@pytest.mark.parametrize("flag", ["input", "output"])
def test_a_path_no_utf8_spells_is_refused_before_any_work(tmp_path, flag):
    """Beam's options carry UTF-8 text alone: such a folder would fail the run deep in Beam, with a traceback."""
    from beam_prep.errors import OptionsError

    odd = os.fsdecode(os.fsencode(str(tmp_path)) + b"/in\xff")
    os.mkdir(odd)
    make_tree(tmp_path / "tree", {"a": 1})
    paths = {"input": str(tmp_path / "tree"), "output": str(tmp_path / "out"), flag: odd}
    with pytest.raises(OptionsError, match=rf"^--{flag} .*in\\xff is a path no UTF-8 spells, which a Beam pipeline "
                                           r"cannot carry: rename that folder"):
        config_from_options(PipelineOptions(["--input", paths["input"], "--output", paths["output"]]))
    assert not (tmp_path / "out").exists() and os.listdir(odd) == []
