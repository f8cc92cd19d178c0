"""The append benchmark: run small, as the lead runs it large, and its table's ratios to the bound."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
from helpers import REPO

from benchmarks.report import tables


def _run(seconds: float, cpu: float) -> dict:
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_rss_bytes": 1, "error": None}


def test_the_table_sets_each_append_against_its_listing_plus_the_bound_times_the_batch_alone():
    row = {"a": _run(10.0, 4.0), "l1": _run(0.0, 0.0), "l2": _run(2.0, 1.0), "c": _run(11.0, 4.8),
           "d": _run(15.0, 7.0), "e": _run(1.0, 0.5), "f": _run(3.0, 2.0)}
    record = {"settings": {"images": 20000, "new": 200, "percent": 1.0, "rounds": 1, "flags": ["--image_size", "224"],
                           "bound": 1.2},
              "labels": {key: f"({key}) run {key}" for key in row}, "dataset": _run(100.0, 200.0), "rounds": [row]}
    table = tables.append(record)
    assert "| (c) run c | 11.00 | 4.80 | 1.10× | 1.20× |" in table
    # (c): 11 / (0 + 1.2 x 10), 4.8 / (1.2 x 4); (d): 15 / (2 + 12), 7 / (1 + 4.8); ÷ (w): 11 / 100.
    assert "| (c) run c | (l1) + 1.2 × (a) | 0.92× | 1.00× | 0.11× |" in table
    assert "| (d) run d | (l2) + 1.2 × (a) | 1.07× | 1.21× | 0.15× |" in table
    row["d"] = {"error": "exit status 1"}
    assert "| (d) run d | failed | | | |" in tables.append(record)


def test_a_round_with_the_batch_alone_run_again_takes_the_mean_of_both_as_its_baseline():
    """(a) and (a′) bracket the appends: the bound uses their mean."""
    row = {"a": _run(12.0, 5.0), "l1": _run(0.0, 0.0), "l2": _run(2.0, 1.0), "c": _run(11.0, 4.8),
           "d": _run(15.0, 7.0), "a2": _run(8.0, 3.0), "e": _run(1.0, 0.5), "f": _run(3.0, 2.0)}
    record = {"settings": {"images": 20000, "new": 200, "percent": 1.0, "rounds": 1, "flags": ["--image_size", "224"],
                           "bound": 1.2},
              "labels": {key: f"({key}) run {key}" for key in row}, "dataset": _run(100.0, 200.0), "rounds": [row]}
    # The baseline is (12 + 8) / 2 = 10 s and (5 + 3) / 2 = 4 CPU s: the figures of the test above.
    assert "| (d) run d | (l2) + 1.2 × (a) | 1.07× | 1.21× | 0.15× |" in tables.append(record)
    row["a2"] = {"error": "exit status 1"}
    assert "| (d) run d | (l2) + 1.2 × (a) | — |" in tables.append(record)


@pytest.mark.slow  # runs the benchmark: pipelines in processes of their own
def test_the_benchmark_runs_small_and_records_each_run(tmp_path: pathlib.Path):
    out = tmp_path / "append.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_append", "--images", "40", "--percent", "10",
                           "--rounds", "1", "--cache", str(tmp_path / "cache"), "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["benchmark"] == "append" and "--images 40" in record["command"]
    results = record["results"]
    assert results["settings"]["new"] == 4 and results["dataset"]["error"] is None
    (row,) = results["rounds"]
    assert set(row) == set(results["labels"]) and not [key for key, run in row.items() if run["error"]]
    assert all(run["seconds"] > 0 and run["cpu_seconds"] >= 0 for run in row.values())
    assert "| (c) `prepare --append` of the batch folder | (l1) + 1.2 × (a) |" in done.stdout
    assert not list((tmp_path / "cache").glob("append-*"))  # its trees and datasets removed
