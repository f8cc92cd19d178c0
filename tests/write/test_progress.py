"""A local run's progress: the workers' counts, how they add up, and what the user sees."""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from helpers import REPO, make_tree

from beam_prep.write.journal import progress
from beam_prep.write.journal.progress import Progress, Reporter, Watcher, read_progress
from pipelines.prepare_images import command
from pipelines.progress_display import ProgressDisplay, format_duration, progress_line


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# The workers' side and the sums.

def test_reports_from_every_worker_add_up(tmp_path):
    clock = Clock()
    a, b = Reporter(str(tmp_path), "train-00000", clock), Reporter(str(tmp_path), "train-00001", clock)
    clock.now += 2
    for ok in (True, True, False):
        a.add(ok)
    clock.now += 1
    b.add(True)
    a.flush(), b.flush()
    got = read_progress(str(tmp_path), total=10, carried=progress.Carried(done=1, failed=1))
    # The one under an unknown label failed before any worker began: done and failed from the start.
    assert got == Progress(total=10, done=5, failed=2, started=1000.0, updated=1003.0, carried=1)


def test_a_report_is_written_when_work_starts_then_at_most_every_half_second(tmp_path):
    clock = Clock()
    reporter = Reporter(str(tmp_path), "s", clock)
    assert read_progress(str(tmp_path), 10) == Progress(total=10, started=1000.0)  # begun, none done
    clock.now += progress.WRITE_EVERY_S
    reporter.add(True)
    clock.now += 0.1
    reporter.add(True)  # too soon: not written yet
    assert read_progress(str(tmp_path), 10).done == 1
    reporter.flush()
    assert read_progress(str(tmp_path), 10).done == 2


def test_a_retried_shard_counts_its_images_once(tmp_path):
    first = Reporter(str(tmp_path), "train-00003")
    for _ in range(4):
        first.add(True)
    first.flush()
    retry = Reporter(str(tmp_path), "train-00003")  # the same shard, again from its start
    retry.add(True)
    retry.flush()
    assert read_progress(str(tmp_path), 10).done == 1


def test_unreadable_reports_are_skipped_and_counts_stop_at_the_total(tmp_path):
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "other.json").write_text(json.dumps({"done": 12, "failed": 0, "started": 1.0, "updated": 2.0}))
    (tmp_path / "x.json.123.tmp").write_text("{")
    assert read_progress(str(tmp_path), 10) == Progress(total=10, done=10, failed=0, started=1.0, updated=2.0)
    assert read_progress(str(tmp_path / "gone"), 10) == Progress(total=10)


def test_rate_and_eta_count_from_the_first_worker_start():
    running = Progress(total=100, done=40, failed=1, started=10.0, updated=13.0)
    assert running.rate(now=14.0) == 10.0 and running.eta(now=14.0) == 6.0
    finished = Progress(total=100, done=100, started=10.0, updated=15.0)
    assert finished.rate(now=60.0) == 20.0  # the rate stops with the last image, not with the job
    assert Progress(total=100).rate(now=5.0) is None and Progress(total=100).eta(now=5.0) is None


def test_phases_split_start_up_from_processing():
    phases = progress.phases(Progress(total=120, done=120, started=106.0, updated=108.0), launched=100.0)
    assert (phases.startup_seconds, phases.processing_seconds, phases.rate) == (6.0, 2.0, 60.0)
    assert progress.phases(Progress(total=3), launched=100.0) is None


def test_a_resumed_runs_rate_counts_only_the_images_its_workers_processed():
    """A resumed run's kept shards are done from the start, and no work of its own: counted
    in the rate, they made it look far faster than it was."""
    resumed = Progress(total=100, done=70, failed=2, started=10.0, updated=13.0, carried=40)
    assert resumed.processed == 30
    assert resumed.rate(now=14.0) == 7.5 and resumed.eta(now=14.0) == 4.0
    finished = Progress(total=100, done=100, started=10.0, updated=16.0, carried=40)
    phases = progress.phases(finished, launched=5.0)
    assert (phases.images, phases.processing_seconds, phases.rate) == (60, 6.0, 10.0)
    # Every shard kept: nothing processed, so no processing phase and no rate.
    kept_all = Progress(total=100, done=100, started=10.0, updated=10.5, carried=100)
    assert progress.phases(kept_all, launched=5.0) is None and kept_all.rate(now=11.0) is None


def test_the_carried_images_start_the_count_and_leave_the_rate(tmp_path):
    clock = Clock()
    reporter = Reporter(str(tmp_path), "train-00001", clock)
    clock.now += 4
    for _ in range(8):
        reporter.add(True)
    reporter.flush()
    got = read_progress(str(tmp_path), total=50, carried=progress.Carried(done=30, failed=3))
    assert (got.done, got.failed, got.carried, got.processed) == (38, 3, 30, 8)
    assert got.rate(now=clock.now) == 2.0


def test_the_folder_goes_when_the_run_ends():
    with progress.progress_folder() as folder:
        Reporter(folder, "s").flush()
    assert not os.path.exists(folder)


def test_a_killed_launchers_folder_is_removed_by_the_next_run():
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process id nobody has now
    parent = tempfile.gettempdir()  # where progress_folder makes its folders
    orphan = os.path.join(parent, f"{progress.FOLDER_PREFIX}{gone.pid}-x")
    live = os.path.join(parent, f"{progress.FOLDER_PREFIX}{os.getpid()}-y")  # a run still going
    for folder in (orphan, live):
        os.makedirs(folder)
    try:
        with progress.progress_folder():
            pass
        assert not os.path.exists(orphan) and os.path.exists(live)
    finally:
        shutil.rmtree(live, ignore_errors=True)


def test_a_watcher_gives_the_last_counts_when_it_ends(tmp_path):
    seen: list[Progress] = []
    with Watcher(str(tmp_path), 5, seen.append, interval=60):
        reporter = Reporter(str(tmp_path), "s")
        reporter.add(True)
        reporter.flush()
    assert [p.done for p in seen] == [1]


def test_a_watcher_reads_the_counts_while_work_goes_on(tmp_path):
    seen: list[Progress] = []
    reporter = Reporter(str(tmp_path), "s")
    with Watcher(str(tmp_path), 5, seen.append, interval=0.02):
        for _ in range(3):
            reporter.add(True)
        reporter.flush()
        deadline = time.time() + 10
        while not (seen and seen[-1].done == 3) and time.time() < deadline:
            time.sleep(0.02)
    assert seen[-1].done == 3 and seen[-1].total == 5


def test_a_failing_display_stops_watching_not_the_job(tmp_path, caplog):
    called = threading.Event()

    def broken(_: Progress) -> None:
        called.set()
        raise ValueError("display bug")

    with Watcher(str(tmp_path), 5, broken, interval=0.01):
        assert called.wait(10)
        time.sleep(0.05)
    assert caplog.text.count("the progress display failed") == 1  # then it is no longer called


# What the user sees.

def test_a_line_says_done_of_listed_rate_eta_and_failures():
    line = progress_line(Progress(total=121, done=57, failed=1, started=100.0, updated=100.4), now=100.5)
    assert line == "beam-prep: 57 of 121 images (47%), 114 images/s, ETA 0:01, 1 failed"
    done = progress_line(Progress(total=1500, done=1500, failed=0, started=100.0, updated=101.0), now=130)
    assert done == "beam-prep: 1,500 of 1,500 images (100%), 1,500 images/s, 0 failed"
    assert (format_duration(75), format_duration(3725)) == ("1:15", "1:02:05")


def test_a_log_gets_a_line_every_interval_and_the_final_counts():
    clock, out = Clock(0.0), io.StringIO()
    display = ProgressDisplay(out, interval=30, clock=clock)
    display(Progress(total=100))  # start-up: nothing to say
    clock.now = 10.0
    display(Progress(total=100, done=10, started=5.0, updated=10.0))
    assert out.getvalue() == ""  # within the first interval
    clock.now = 31.0
    display(Progress(total=100, done=40, started=5.0, updated=31.0))
    clock.now = 45.0
    display(Progress(total=100, done=60, started=5.0, updated=45.0))
    display.close()
    lines = out.getvalue().splitlines()
    assert [re.match(r"beam-prep: (\d+) of 100", line).group(1) for line in lines] == ["40", "60"]


def test_a_run_shorter_than_the_interval_prints_no_progress():
    clock, out = Clock(0.0), io.StringIO()
    display = ProgressDisplay(out, interval=30, clock=clock)
    clock.now = 3.0
    display(Progress(total=10, done=10, started=1.0, updated=2.0))
    display.close()
    assert out.getvalue() == ""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar_with_counts_and_failures():
    out = Terminal()
    display = ProgressDisplay(out, interval=30)
    display(Progress(total=121))  # start-up: no bar yet
    assert out.getvalue() == ""
    display(Progress(total=121, done=57, failed=1, started=time.time(), updated=time.time()))
    display(Progress(total=121, done=121, failed=1, started=time.time(), updated=time.time()))
    display.close()
    text = out.getvalue()
    assert "121/121" in text and "1 failed" in text and "img/s" in text


def test_a_terminal_that_reports_no_size_still_gets_a_bar(monkeypatch):
    """Some pseudo-terminals say 0x0, where tqdm sizes a bar to an empty line (0 columns), or,
    on sys.stderr, hides it (0 rows)."""
    import pty
    import select

    master, replica = pty.openpty()
    try:
        assert os.get_terminal_size(replica).columns == 0  # a new pty has no size
        with os.fdopen(os.dup(replica), "w") as stream:
            monkeypatch.setattr(sys, "stderr", stream)  # as verify's and bench's bars are drawn
            display = ProgressDisplay(stream, interval=30)
            display(Progress(total=121, done=121, failed=1, started=time.time(), updated=time.time()))
            display.close()
        text = ""
        while select.select([master], [], [], 1.0)[0]:  # all the bar wrote, however the pty splits it
            text += os.read(master, 65536).decode()
            if "121/121" in text:
                break
    finally:
        os.close(master)
        os.close(replica)
    assert "121/121" in text and "1 failed" in text


def test_a_bar_stops_where_a_failed_job_got():
    out = Terminal()
    display = ProgressDisplay(out, interval=30)
    display(Progress(total=121, done=30, failed=0, started=time.time(), updated=time.time()))
    display(Progress(total=121, done=57, failed=2, started=time.time(), updated=time.time()))
    display.close()
    assert "57/121" in out.getvalue() and "2 failed" in out.getvalue() and "121/121" not in out.getvalue()


# A real run, on the multi-process DirectRunner.

def test_a_run_on_a_non_terminal_prints_progress_from_its_workers_before_the_summary(tmp_path):
    make_tree(tmp_path / "in", {"a": 12, "b": 12}, size=(24, 24))
    out = tmp_path / "out"
    result = subprocess.run(
        command("--input", str(tmp_path / "in"), "--output", str(out), "--image_size", "16",
                "--direct_num_workers", "2", "--progress_interval", "0.2"),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    summary = next(i for i, line in enumerate(lines) if " images written in " in line)
    counts = [int(m.group(1)) for line in lines[:summary]
              if (m := re.fullmatch(r"beam-prep: (\d+) of 24 images \(\d+%\).*, 0 failed", line))]
    assert any(0 < n <= 24 for n in counts), result.stdout
    assert counts[-1] == 24 and counts == sorted(counts), result.stdout
    assert re.match(r"beam-prep: 24 of 24 images written in [\d.]+ s "
                    r"\(start-up [\d.]+ s, then [\d,]+ images/s for [\d.]+ s, finishing [\d.]+ s\); 0 failed", lines[summary]), lines[summary]
    # The workers' reports went with the run; the dataset is only the dataset.
    assert not [n for n in os.listdir(os.environ["TMPDIR"]) if n.startswith("beam-prep-progress-")]
    assert sorted(os.listdir(out)) == ["README.md", "duplicates.jsonl", "errors.jsonl", "flat.jsonl", "hashes-v1.tsv.gz", "labels.txt", "manifest.json",
                                       "skipped.jsonl", "stamps-v1.tsv.gz", "train-00000-of-00002.tfrecord.gz",
                                       "train-00001-of-00002.tfrecord.gz"]


@pytest.mark.slow  # runs a pipeline in this process
@pytest.mark.parametrize("sink", ["streaming", "shuffle"])
def test_the_python_api_times_both_sinks_phases(tmp_path, sink):
    from beam_prep.api import parse_command_line
    from beam_prep.write.run.pipeline import run

    make_tree(tmp_path / "in", {"a": 3, "b": 3}, size=(16, 16))
    options, config = parse_command_line(["--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                                          "--image_size", "16", "--sink", sink,
                                          "--direct_running_mode", "in_memory"])
    seen: list[Progress] = []
    result = run(config, options, on_progress=seen.append, progress_interval=0.01)
    assert result.phases is not None and result.phases.images == 6
    assert 0 < result.phases.startup_seconds < result.seconds
    assert all(p.total == 6 and 0 <= p.done <= 6 for p in seen) and seen[-1].done == 6


def test_the_summary_gives_start_up_processing_and_finishing_apart():
    from beam_prep.write.run.pipeline import RunResult
    from pipelines.prepare_images import timing

    manifest = {"counts": {"listed": 121}}
    phased = RunResult(manifest, 9.4, {}, phases=progress.Phases(6.1, 2.1, 2415))
    assert timing(phased) == "9.4 s (start-up 6.1 s, then 1,150 images/s for 2.1 s, finishing 1.2 s)"
    # A remote runner's workers report nothing here: the overall rate is all there is.
    assert timing(RunResult(manifest, 9.4, {})) == "9.4 s (13 images/s)"
    # Without phases, a resumed run's overall rate leaves out the images it kept.
    assert timing(RunResult(manifest, 9.4, {}, kept=27)) == "9.4 s (10 images/s)"


def test_where_nobody_watches_a_reporter_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    silent = progress.reporter(None, "train-00000")
    silent.add(True)
    silent.flush()
    assert not isinstance(silent, Reporter) and os.listdir(tmp_path) == []
