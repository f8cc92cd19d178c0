"""What the command line says when a flag is unknown or a job fails, and where the rest goes."""
from __future__ import annotations

import io
import json
import os
import re
import resource
import signal
import subprocess

import pytest
from helpers import REPO, child, encode, make_tree, prepare_here, run_prepare
from small_disk import small_disk

import beam_prep
from beam_prep.cli.flags import check_flags, known_flags, nearest_flag, unknown_flags
from beam_prep.cli.joblog import JobLog, is_job_failure, new_log_path, root_cause
from beam_prep.cli.spelling import known_spelling
from beam_prep.errors import OptionsError, StorageError
from beam_prep.tools.sample import picture
from beam_prep.write.plan.listing import split_for
from pipelines import bench_reader, cli, inspect_output, prepare_images, verify_output

# Raw 64x64 RGB pixels barely compress: 8 records make a ~96 KB shard, over the
# limit, while the launcher's listings (<1 KB) and the job's log (~30 KB) fit.
MAX_FILE_BYTES = 60_000
FAILING = ("--image_format", "raw", "--image_size", "64", "--num_shards", "1")


@pytest.fixture
def tree(tmp_path):
    make_tree(tmp_path / "in", {"a": 4, "b": 4}, size=(64, 64), fmt="PNG", ext=".png")
    return tmp_path / "in"


@pytest.fixture
def tmpdir_env(tmp_path):
    """The job's log lands in the test's own folder: TMPDIR is where it goes."""
    (tmp_path / "tmp").mkdir()
    return {**os.environ, "TMPDIR": str(tmp_path / "tmp")}


def run_with_file_limit(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """run_prepare in a process that cannot write a file past MAX_FILE_BYTES (EFBIG, "File too large")."""
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), not the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))

    return run_prepare(*args, env=env, preexec_fn=limit)


# Unknown flags.

def test_a_misspelled_flag_is_named_with_the_nearest_known_one():
    with pytest.raises(OptionsError, match=r"^unknown option --image_sise; did you mean --image_size\?$"):
        check_flags(["--input", "x", "--image_sise", "64"])


def test_every_unknown_flag_is_named():
    with pytest.raises(OptionsError) as raised:
        check_flags(["--validation_perc=10", "--image-size", "64", "--frobnicate"])
    assert str(raised.value) == ("unknown options --validation_perc (did you mean --validation_percent?), "
                                 "--image-size (did you mean --image_size?), --frobnicate")


@pytest.mark.parametrize("runner", [(), ("--runner", "direct"), ("--runner=DirectRunner",)])
def test_a_worker_count_misspelled_on_a_local_run_suggests_the_direct_runners_flag(runner):
    """Not --num_workers, Dataflow's, which a local run accepts and ignores."""
    with pytest.raises(OptionsError, match=r"^unknown option --workers; did you mean --direct_num_workers\?$"):
        check_flags(["--input", "x", "--workers", "4", *runner])


def test_a_worker_count_misspelled_for_dataflow_suggests_dataflows_flag():
    with pytest.raises(OptionsError, match=r"^unknown option --workers; did you mean --num_workers\?$"):
        check_flags(["--input", "x", "--workers", "4", "--runner", "DataflowRunner"])


def test_dataflows_worker_count_on_a_local_run_warns_before_any_work(tree, tmp_path, capsys):
    """Refused for an occupied output all the same: the warning comes first, before any work."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    assert prepare_images.main(["--input", str(tree), "--output", str(out), "--num_workers", "4"]) == 2
    assert capsys.readouterr().err == (
        "warning: --num_workers sets Dataflow's workers, and a local run ignores it: pass --direct_num_workers "
        "to choose how many processes this machine runs\n"
        f"error: --output {out} already holds a dataset (1 files); pass --overwrite to replace it\n")


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
    ("--sdk_container_image", "gcr.io/p/i"), ("--image_size", "64"), ("--verbose", None),
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
    result = run_prepare("--input", str(tree), "--output", str(out), "--image_sise", "64",
                         "--direct-running-mode", "in_memory")
    assert result.returncode == 2, result.stderr
    assert result.stderr == "error: unknown option --image_sise; did you mean --image_size?\n"
    assert not out.exists() and result.stdout == ""


@pytest.mark.slow  # a Beam pipeline, on the in-memory runner
def test_every_flag_of_prepare_takes_dashes_or_underscores(tree, tmp_path, capsys):
    """The command's main in this process: its flags are read there, and the run is in-memory."""
    code = prepare_images.main(["--input", str(tree), "--output", str(tmp_path / "out"), "--image-size", "16",
                                "--direct-running-mode=in_memory", "--labels-txt", "slim"])
    assert code == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert (manifest["image"]["height"], manifest["image"]["width"]) == (16, 16)
    assert (tmp_path / "out" / "labels.txt").read_text() == "0:a\n1:b\n"


def test_known_spelling_rewrites_flags_alone():
    known = ["--image_size", "--job-server-timeout", "--job_server_timeout", "--max_per_kind"]
    assert known_spelling(["--image-size", "a-b", "--max-per-kind=3", "--job-server-timeout", "5", "--",
                           "--image-size"], known) == \
        ["--image_size", "a-b", "--max_per_kind=3", "--job-server-timeout", "5", "--", "--image-size"]
    assert known_spelling(["--imagesize", "-5"], known) == ["--imagesize", "-5"]


# A job that fails.

def log_named_in(line: str) -> str:
    match = re.search(r"\(full log: (.+)\)$", line)
    assert match, line
    return match.group(1)


def test_a_failed_job_ends_with_one_line_and_leaves_its_log(tree, tmp_path, tmpdir_env):
    """On the multi-process runner, where worker processes write tracebacks to their stderr."""
    result = run_with_file_limit("--input", str(tree), "--output", str(tmp_path / "out"), *FAILING,
                                 "--direct_running_mode", "multi_processing", "--direct_num_workers", "1",
                                 env=tmpdir_env)
    lines = result.stderr.splitlines()
    assert result.returncode == 1, result.stderr
    assert len(lines) < 10 and "Traceback" not in result.stderr, result.stderr
    assert re.match(r"error: cannot write \S+/train-00000-of-00001\.tfrecord\.gz: \[Errno 27\] "
                    r"File too large; .*ulimit -f.* \(full log: ", lines[-1]), lines[-1]
    assert "while running" not in lines[-1]
    log = log_named_in(lines[-1])
    assert os.path.dirname(log) == tmpdir_env["TMPDIR"]
    text = open(log, encoding="utf-8").read()
    assert "Traceback (most recent call last):" in text and "StorageError: cannot write" in text
    assert "Error processing instruction" in text  # a worker's own report, not on stderr


@pytest.mark.slow  # a pipeline, in a subprocess
@pytest.mark.parametrize("full", ["a file size limit", "a full disk"])
def test_a_shard_that_finds_no_room_ends_in_one_line_naming_it(full, tmp_path, tmpdir_env):
    """Mid-shard, where the write is made outside the ``with`` that opened the file (the streaming
    sink holds it open across calls): the one line names the shard, the reason and what to do,
    as for any storage error (exit code 1). The limit or the disk holds the launcher's files."""
    make_tree(tmp_path / "in", {"a": 30, "b": 30}, size=(64, 64), fmt="PNG", ext=".png")  # 720 KB of raw pixels
    args = ["--input", str(tmp_path / "in"), "--image_format", "raw", "--image_size", "64",
            "--direct_running_mode", "multi_processing", "--direct_num_workers", "2"]
    if full == "a file size limit":
        result = run_with_file_limit(*args, "--output", str(tmp_path / "out"), env=tmpdir_env)
        reason = r"\[Errno 27\] File too large; .*\(ulimit -f\).*"
    else:
        with small_disk(tmp_path / "disk") as disk:
            result = run_prepare(*args, "--output", str(disk / "out"), env=tmpdir_env)
        reason = r"\[Errno 28\] No space left on device; free space on that disk, or write elsewhere"
    lines = result.stderr.splitlines()
    assert result.returncode == 1, result.stderr
    assert len(lines) < 10 and "Traceback" not in result.stderr, result.stderr
    assert re.fullmatch(rf"error: cannot write \S+/train-0000[01]-of-00002\.tfrecord\.gz: {reason} "
                        r"\(full log: \S+\)", lines[-1]), lines[-1]


@pytest.mark.slow  # a pipeline, in a subprocess
def test_a_manifest_that_finds_no_room_ends_in_one_line_naming_it(tmp_path, tmpdir_env):
    """The staged manifest is the run's largest file here (eight shards of one tiny image each):
    a file size limit that lets every shard and listing through stops it alone."""
    make_tree(tmp_path / "in", {"a": 4, "b": 4}, size=(16, 16), fmt="PNG", ext=".png")
    limit = 3_000

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    out = tmp_path / "out"
    result = run_prepare("--input", str(tmp_path / "in"), "--output", str(out), "--image_size", "16",
                         "--num_shards", "8", "--direct_running_mode", "in_memory", env=tmpdir_env,
                         preexec_fn=limited)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert re.fullmatch(rf"error: cannot write {re.escape(str(out))}/\.beam-prep/[^/]+/staged/manifest\.json: "
                        r"\[Errno 27\] File too large; .*\(ulimit -f\).*", result.stderr.splitlines()[-1]), \
        result.stderr
    shards = [p.stat().st_size for p in out.glob("**/train-*")]
    assert shards and max(shards) < limit  # the shards fitted: the manifest alone did not


@pytest.mark.slow  # the command, in a subprocess
def test_a_full_temp_folder_ends_in_one_line_naming_the_spill_and_tmpdir(tmp_path):
    """The listing spills its rows to the temp folder (TMPDIR) past a few thousand (fewer stay in memory):
    one there too small for them (a 64 KB tmpfs, which still takes the job's log) ends the run in one
    line naming the spill's file, and saying to free the temp folder or point TMPDIR elsewhere, not the
    dataset's disk."""
    for label in ("a", "b"):
        (tmp_path / "in" / label).mkdir(parents=True)
        for i in range(4500):  # listed by their names: rows of ~100 bytes each, more than a spill holds in memory
            (tmp_path / "in" / label / f"img_{i:04d}.jpg").write_bytes(b"")
    with small_disk(tmp_path / "tmp", size="64k") as tmp:
        result = run_prepare("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                             "--direct_running_mode", "in_memory", env={**os.environ, "TMPDIR": str(tmp)})
    assert result.returncode == 1, result.stderr
    assert re.fullmatch(rf"error: cannot write {re.escape(str(tmp))}/beam-prep-listing-\w+/\S+: \[Errno 28\] No space "
                        rf"left on device; beam-prep spills large tables to the temp folder {re.escape(str(tmp))}: "
                        r"free space there, or point TMPDIR at a folder with room\n", result.stderr), result.stderr


def test_verbose_shows_the_traceback_then_the_cause(tree, tmp_path, tmpdir_env):
    result = run_with_file_limit("--input", str(tree), "--output", str(tmp_path / "out"), *FAILING,
                                 "--direct_running_mode", "in_memory", "--verbose", env=tmpdir_env)
    assert result.returncode == 1, result.stderr
    assert "Traceback (most recent call last):" in result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith("error: cannot write ") and "File too large; " in last and last.endswith("elsewhere"), last
    assert [n for n in os.listdir(tmpdir_env["TMPDIR"]) if n.startswith("beam-prep-")] == []


def test_a_good_run_keeps_its_output_and_no_log(tree, tmp_path, tmpdir_env):
    result = run_prepare("--input", str(tree), "--output", str(tmp_path / "out"), "--image_size", "16",
                         "--direct_running_mode", "in_memory", env=tmpdir_env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # the summary says it all: our INFO records are for a failed job's log
    assert re.fullmatch(r"beam-prep: 8 of 8 images written in .*; 0 failed, 0 skipped\n"
                        r"  train: 8 examples in 1 shard\n"
                        r"(  near duplicates: .* 0 across splits \(see duplicates.jsonl\)\n)?", result.stdout)
    assert [n for n in os.listdir(tmpdir_env["TMPDIR"]) if n.startswith("beam-prep-")] == []


def snapshot(folder) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``folder``, hidden ones too, with its size and change time."""
    found = {}
    for path in sorted(folder.rglob("*")):
        info = path.stat()
        found[str(path.relative_to(folder))] = (info.st_size, info.st_mtime_ns)
    return found


def test_a_refused_run_says_one_line_and_changes_nothing(tree, tmp_path, tmpdir_env):
    """The dataset there is made in this process (``prepare_here``); the refused run is the command's."""
    out = tmp_path / "out"
    args = ("--input", str(tree), "--output", str(out), "--image_size", "16", "--direct_running_mode", "in_memory")
    prepare_here(*args)
    before = snapshot(out)
    refused = run_prepare(*args, env=tmpdir_env)
    assert refused.returncode == 2 and refused.stdout == ""
    # The dataset card (README.md) is the dataset's only where beam-prep wrote it: not among the files counted.
    assert refused.stderr == (f"error: --output {out} already holds a dataset ({len(before) - 1} files); "
                              "pass --overwrite to replace it\n")
    assert snapshot(out) == before  # no claim, no run folder left behind
    assert [n for n in os.listdir(tmpdir_env["TMPDIR"]) if n.startswith("beam-prep-")] == []


def test_a_run_refused_after_listing_leaves_no_output_folder(tmp_path, capsys):
    """The command's main in this process: refused before any work, it starts nothing."""
    make_tree(tmp_path / "split", {"a": 2}, splits=["train", "validation"], size=(24, 20))
    out = tmp_path / "new" / "out"
    capsys.readouterr()
    code = prepare_images.main(["--input", str(tmp_path / "split"), "--output", str(out), "--validation_percent",
                                "10", "--direct_running_mode", "in_memory"])
    refused = capsys.readouterr()
    assert code == 2 and refused.out == ""
    assert refused.err == (f"error: {tmp_path / 'split'} already has split folders (train, validation); "
                           "drop --validation_percent\n")
    assert not (tmp_path / "new").exists()


REMOTE = """Traceback (most recent call last):
  File "beam_prep/io/tfrecord.py", line 74, in shard_writer
OSError: [Errno 27] File too large

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "apache_beam/runners/common.py", line 1512, in process
beam_prep.errors.StorageError: cannot write out/train-00000-of-00002.tfrecord.gz: [Errno 27] File too large \
[while running 'WriteShards/WriteShards[train]/ParDo(WriteShardFn)']
"""


def test_the_cause_is_the_last_exception_of_a_workers_traceback():
    assert root_cause(RuntimeError(REMOTE)) == \
        "cannot write out/train-00000-of-00002.tfrecord.gz: [Errno 27] File too large"
    try:
        try:
            raise RuntimeError(REMOTE.replace("beam_prep.errors.StorageError", "ZeroDivisionError"))
        except RuntimeError as e:
            raise RuntimeError("Pipeline failed") from e
    except RuntimeError as outer:
        assert root_cause(outer) == \
            "ZeroDivisionError: cannot write out/train-00000-of-00002.tfrecord.gz: [Errno 27] File too large"


def test_an_error_raised_in_this_process_is_its_own_cause():
    in_step = StorageError("cannot write x: disk full [while running 'WriteShards/W[train]/ParDo(F)']")
    assert root_cause(in_step) == "cannot write x: disk full"
    assert root_cause(ValueError("bad")) == "ValueError: bad"


def test_only_errors_from_the_running_job_are_job_failures():
    assert is_job_failure(RuntimeError(REMOTE))
    assert is_job_failure(StorageError("cannot write x: disk full [while running 'Write']"))
    assert not is_job_failure(StorageError("cannot list gs://b: bucket b does not exist"))
    assert not is_job_failure(OptionsError("--input is required"))


CHILD_WRITES_STDERR = child("writes_stderr")


def test_processes_started_in_a_job_log_write_their_stderr_to_it(tmp_path):
    with JobLog(new_log_path(str(tmp_path)), prepare_images.logging.Formatter()) as log:
        subprocess.run(CHILD_WRITES_STDERR, cwd=REPO, check=True)
        log.record_failure(RuntimeError("the job failed"))
    assert os.path.basename(log.path).startswith("beam-prep-") and log.kept
    text = open(log.path, encoding="utf-8").read()
    assert "a worker traceback" in text and "RuntimeError: the job failed" in text


def test_a_job_log_with_nothing_worth_keeping_is_removed(tmp_path):
    with JobLog(new_log_path(str(tmp_path)), prepare_images.logging.Formatter()) as log:
        prepare_images.logging.getLogger("beam_prep.test").warning("shown on the console, not kept")
    assert not log.kept and os.listdir(tmp_path) == []


# Pillow's messages about an image: each such image is in errors.jsonl, so they are no warning of the job's.

def relay_from_a_worker(severity: str, message: str, location: str) -> None:
    """A worker's log record as the local runner relays it: through Beam's own logging service."""
    from apache_beam.portability.api import beam_fn_api_pb2
    from apache_beam.runners.portability.local_job_service import BeamFnLoggingServicer

    entry = beam_fn_api_pb2.LogEntry(severity=getattr(beam_fn_api_pb2.LogEntry.Severity.Enum, severity),
                                     message=message, log_location=location)
    list(BeamFnLoggingServicer().Logging([beam_fn_api_pb2.LogEntry.List(log_entries=[entry])]))


PILLOW = "/venv/lib/python3.11/site-packages/PIL/TiffImagePlugin.py:1508"


def test_pillows_records_about_an_image_are_in_the_log_and_count_for_nothing(tmp_path):
    """In this process (the in-memory runner) and relayed from a worker process alike."""
    with JobLog(new_log_path(str(tmp_path)), prepare_images.logging.Formatter()) as log:
        prepare_images.logging.getLogger("PIL.TiffImagePlugin").error("More samples per pixel: %s", 5000)
        relay_from_a_worker("ERROR", "More samples per pixel than can be decoded: 5000", PILLOW)
        text = open(log.path, encoding="utf-8").read()
    assert text.count("More samples per pixel") == 2 and PILLOW in text
    assert log.hidden_warnings == 0 and not log.kept and os.listdir(tmp_path) == []


@pytest.mark.parametrize("logged", [
    lambda: prepare_images.logging.getLogger("apache_beam.runners.worker.sdk_worker").error("a bundle failed"),
    lambda: relay_from_a_worker("ERROR", "a bundle failed", "/venv/.../apache_beam/runners/worker/sdk_worker.py:9"),
    lambda: relay_from_a_worker("ERROR", "a picture", "/home/me/PIL_tools/PIL.py:3"),  # not Pillow's
], ids=["beam", "beam-worker", "not-pillow"])
def test_anyone_elses_warnings_keep_the_log(tmp_path, logged):
    with JobLog(new_log_path(str(tmp_path)), prepare_images.logging.Formatter()) as log:
        logged()
    assert log.hidden_warnings == 1 and log.kept and os.path.exists(log.path)


def tiff_with_samples_per_pixel(samples: int) -> bytes:
    """A TIFF whose SamplesPerPixel tag says ``samples``: Pillow logs an error (its logger, level
    ERROR) before refusing to open it."""
    data = bytearray(encode(picture(1, 24, 20), "TIFF"))
    assert data[:2] == b"II"
    ifd = int.from_bytes(data[4:8], "little")
    for i in range(int.from_bytes(data[ifd:ifd + 2], "little")):
        entry = ifd + 2 + 12 * i
        if int.from_bytes(data[entry:entry + 2], "little") == 277:  # SamplesPerPixel, a SHORT
            data[entry + 8:entry + 10] = samples.to_bytes(2, "little")
            return bytes(data)
    raise AssertionError("no SamplesPerPixel tag")


def bad_images_tree(root) -> None:
    """Good images beside the bad ones users have: each bad one fails at decode, into errors.jsonl."""
    make_tree(root, {"a": 4, "b": 4}, size=(24, 20))  # 8 records of FAILING's pixels: over its file limit
    jpeg, png = encode(picture(2, 24, 20)), encode(picture(3, 24, 20), "PNG")
    (root / "a" / "truncated.jpg").write_bytes(jpeg[:len(jpeg) // 2])
    (root / "a" / "damaged.png").write_bytes(png[:40] + b"\0" * 40 + png[80:])
    (root / "b" / "samples.tif").write_bytes(tiff_with_samples_per_pixel(5000))
    (root / "b" / "tags.tif").write_bytes(b"II*\0" + b"\xff" * 60)
    mpo = io.BytesIO()
    picture(4, 24, 20).save(mpo, "MPO", save_all=True, append_images=[picture(5, 24, 20)])
    (root / "b" / "pair.jpg").write_bytes(mpo.getvalue())  # an MPO: its first picture is written


@pytest.mark.parametrize("runner", [("--direct_running_mode", "in_memory"),  # Pillow logs in this process
                                    ("--direct_num_workers", "2")],  # in worker processes, relayed
                         ids=["in_memory", "multi_processing"])
def test_a_clean_run_with_bad_images_prints_its_summary_alone_and_leaves_no_log(tmp_path, tmpdir_env, runner):
    bad_images_tree(tmp_path / "in")
    result = run_prepare("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--image_size", "16",
                         *runner, env=tmpdir_env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert re.fullmatch(r"beam-prep: 9 of 13 images written in .*; 4 failed, 0 skipped\n"
                        r"  train: 9 examples in \d shards?\n"
                        r"  failed at decode: 4 \(see errors.jsonl\)\n"
                        r"(  near duplicates: .* 0 across splits \(see duplicates.jsonl\)\n)?", result.stdout), result.stdout
    errors = [json.loads(line) for line in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()]
    assert [e["relpath"] for e in errors] == ["a/damaged.png", "a/truncated.jpg", "b/samples.tif", "b/tags.tif"]
    assert os.listdir(tmpdir_env["TMPDIR"]) == []


def test_a_failed_run_keeps_its_log_with_pillows_records_and_names_it(tmp_path, tmpdir_env):
    bad_images_tree(tmp_path / "in")
    result = run_with_file_limit("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), *FAILING,
                                 "--direct_num_workers", "2", env=tmpdir_env)
    assert result.returncode == 1, result.stderr
    log = log_named_in(result.stderr.splitlines()[-1])
    assert os.listdir(tmpdir_env["TMPDIR"]) == [os.path.basename(log)]
    text = open(log, encoding="utf-8").read()
    assert "More samples per pixel than can be decoded: 5000" in text and "File too large" in text


# Every command: --version, both spellings of each flag, a typo named with the nearest flag.

@pytest.mark.parametrize("argv", [["--version"], ["prepare", "--version"], ["inspect", "--version"],
                                  ["verify", "--version"], ["bench", "--version"]])
def test_every_command_prints_the_version(capsys, argv):
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's own exit, after printing
        code = e.code
    assert code == 0
    assert capsys.readouterr().out == f"beam-prep {beam_prep.__version__}\n"


@pytest.mark.parametrize("parse,argv,expected", [
    (lambda argv: inspect_output.parser().parse_args(argv), ["OUT", "--per_class", "3", "--max_classes", "2"],
     {"per_class": 3, "max_classes": 2}),
    (lambda argv: inspect_output.parser().parse_args(argv), ["OUT", "--per-class", "3", "--max-classes=2"],
     {"per_class": 3, "max_classes": 2}),
    (verify_output.parse_args, ["OUT", "--max-per-kind", "3"], {"max_per_kind": 3}),
    (verify_output.parse_args, ["OUT", "--max_per_kind=3"], {"max_per_kind": 3}),
    (bench_reader.parse_args, ["OUT", "--batch-size", "8", "--warmup-seconds", "0"],
     {"batch_size": 8, "warmup_seconds": 0}),
    (bench_reader.parse_args, ["OUT", "--batch_size", "8", "--warmup_seconds", "0"],
     {"batch_size": 8, "warmup_seconds": 0}),
])
def test_every_command_takes_both_spellings(parse, argv, expected):
    parsed = vars(parse(argv))
    assert {key: parsed[key] for key in expected} == expected


@pytest.mark.parametrize("command,argv,message", [
    ("inspect", ["OUT", "--per_clas", "3"], "unknown option --per_clas; did you mean --per-class?"),
    ("verify", ["OUT", "--max_per_kin", "3"], "unknown option --max_per_kin; did you mean --max_per_kind?"),
    ("bench", ["OUT", "--batchsize=8"], "unknown option --batchsize; did you mean --batch_size?"),
])
def test_every_command_names_the_nearest_flag_to_a_typo(capsys, command, argv, message):
    with pytest.raises(SystemExit) as raised:
        cli.main([command, *argv])
    assert raised.value.code == 2
    assert capsys.readouterr().err == f"error: {message} (beam-prep {command} --help lists its options)\n"


# A slip: a fraction given as a percent.

def test_a_percent_below_one_warns_with_the_images_it_gives_and_no_shard_is_empty(tmp_path):
    """0.1 (a tenth, thought of as a fraction) puts 1 image of 40 in validation: said, and that
    one image gets one shard, not one per worker."""
    tree = tmp_path / "in"
    make_tree(tree, {"a": 20, "b": 20}, size=(24, 20))
    lone = next(f"a/pick_{i}.jpg" for i in range(100_000) if split_for(f"a/pick_{i}.jpg", 0.1) == "validation")
    (tree / "a" / "img_000.jpg").rename(tree / lone)
    assert [p for p in tree.glob("*/*.jpg") if split_for(p.relative_to(tree).as_posix(), 0.1) == "validation"] \
        == [tree / lone]
    result = run_prepare("--input", str(tree), "--output", str(tmp_path / "out"), "--image_size", "16",
                         "--validation_percent", "0.1", "--direct_num_workers", "2")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ("warning: --validation_percent 0.1 puts 1 of 40 images in validation (0.1%): "
                             "the value is a percent; for a fraction of 0.1, pass 10\n")
    splits = json.loads((tmp_path / "out" / "manifest.json").read_text())["splits"]
    assert {name: (s["num_examples"], len(s["shards"])) for name, s in splits.items()} == \
        {"train": (39, 2), "validation": (1, 1)}
    assert "  validation: 1 example in 1 shard" in result.stdout.splitlines()


# A slip: originals with a fixed-size mode keep only the JPEGs already that size.

def originals_warning(mode: str, size: str) -> str:
    return (f"warning: --image_format original with --resize_mode {mode} keeps only the JPEGs already exactly "
            f"{size} as they are, and re-encodes every other image at that size: --resize_mode none, or "
            "--resize_mode shorter_side --no_upscale, keeps the rest\n")


@pytest.mark.parametrize("mode", ["center_crop", "stretch", "pad"])
def test_originals_with_a_fixed_size_mode_warn_before_any_work(tree, tmp_path, capsys, mode):
    """Said before the output is even looked at: a run refused there still shows it, first.
    (The command's main in this process: refused before any work, it starts nothing.)"""
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    assert prepare_images.main(["--input", str(tree), "--output", str(out), "--image_format", "original",
                                "--resize_mode", mode, "--image_size", "48x64"]) == 2
    assert capsys.readouterr().err == originals_warning(mode, "48x64") + (
        f"error: --output {out} already holds a dataset (1 files); pass --overwrite to replace it\n")


@pytest.mark.parametrize("flags", [("--resize_mode", "none"),
                                   ("--resize_mode", "shorter_side", "--no_upscale"),
                                   ("--image_format", "jpeg")])
def test_originals_that_keep_their_size_or_no_originals_say_nothing(tree, tmp_path, capsys, flags):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    image_format = () if "--image_format" in flags else ("--image_format", "original")
    assert prepare_images.main(["--input", str(tree), "--output", str(out), *image_format, *flags]) == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith("error: ") and "warning" not in stderr, stderr


def test_the_originals_warning_is_printed_once_on_a_whole_run(tmp_path, tmpdir_env):
    make_tree(tmp_path / "in", {"a": 2, "b": 2}, size=(64, 48))
    (tmp_path / "in" / "a" / "other.jpg").write_bytes(encode(picture(9, 32, 24)))
    result = run_prepare("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                         "--image_format", "original", "--image_size", "48x64", env=tmpdir_env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == originals_warning("center_crop", "48x64")
    assert "  originals kept byte for byte: 4" in result.stdout.splitlines()
