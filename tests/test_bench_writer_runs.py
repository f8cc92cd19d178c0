"""The writer benchmark's (c) at each end of a round: ``bracketed`` takes their mean."""
from __future__ import annotations

from benchmarks.writer_runs import RunResult, bracketed


def test_a_bracketed_run_is_the_mean_of_both_and_the_larger_memory():
    first = RunResult(20000, 20.0, 300, 5, details={"jpeg_path": {"native": 20000}}, cpu_seconds=30.0, psnr=36.5)
    last = RunResult(20000, 30.0, 400, 5, cpu_seconds=40.0, psnr=36.5)
    both = bracketed(first, last)
    assert (both.seconds, both.cpu_seconds, both.peak_rss_bytes) == (25.0, 35.0, 400)
    assert both.images_per_s == 800 and both.details["jpeg_path"] == {"native": 20000}
    assert both.details["bracket_seconds"] == [20.0, 30.0] and both.details["bracket_cpu_seconds"] == [30.0, 40.0]
    assert (first.seconds, first.cpu_seconds) == (20.0, 30.0)  # neither run is changed


def test_a_failed_run_fails_the_round():
    ok = RunResult(20000, 20.0, 300, 5, cpu_seconds=30.0)
    failed = RunResult(20000, 1.0, 1, 0, error="exit status 1")
    assert bracketed(ok, failed).error == "exit status 1" and bracketed(failed, ok).error == "exit status 1"


def test_the_originals_are_set_against_the_c_run_they_follow_not_the_brackets_mean():
    """The originals run right after (c)'s last run: each round's ratio is to that run (100 images/s),
    not to the mean of both (c) runs (66.7 images/s), the first minutes before them."""
    from benchmarks.bench_writer import originals_table

    first, last = RunResult(1000, 20.0, 300, 5, cpu_seconds=20.0), RunResult(1000, 10.0, 300, 5, cpu_seconds=10.0)
    originals = {"(d) originals": {1000: [RunResult(1000, 5.0, 300, 5, cpu_seconds=5.0)]}}
    table = originals_table({1000: [bracketed(first, last)]}, originals, {1000: [last]})
    (row,) = [line for line in table.splitlines() if line.startswith("| (d) originals")]
    assert row.split(" | ")[4] == "2.00×" and row.split(" | ")[6] == "2.00×"


def test_the_rounds_line_sets_c_against_each_peer_round_by_round_the_worse_first():
    from benchmarks.report import tables

    def runs(*cpu):
        return [{"seconds": 1.0, "cpu_seconds": c} for c in cpu]

    rounds = {"ours": runs(10.0, 20.0), "seed": runs(30.0, 50.0), "mds": runs(19.0, 44.0),
              "pillow_path": runs(12.0, 24.0), "litdata": runs(None, 40.0)}
    line = tables.writer_rounds(rounds)
    assert "(a) 2.50×, 3.00×" in line and "(j) 1.90×, 2.20×" in line
    assert "(k) 2.00×." in line and "pillow" not in line  # a failed round left out; (c)'s variants are not peers
