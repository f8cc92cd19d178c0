"""``bench_gcs_clients``'s summary: CPU over the floor (local files, the same work), and each ratio
taken within its own round, so that a busy round moves both sides of it."""
from __future__ import annotations

import pytest

from benchmarks.bench_gcs_clients import BASELINE, LOCAL, summarise
from benchmarks.report.tables import gcs_clients

OTHER = "(e) another client"


def _run(client: str, round_: int, cpu_us: float, rate: float) -> dict:
    return {"client": client, "round": round_, "latency_ms": 30.0, "cpu_us_per_object": cpu_us,
            "system_us_per_object": cpu_us / 10, "objects_per_s": rate}


def test_ratios_are_of_the_cpu_over_the_floor_within_each_round():
    runs = [_run(LOCAL, 0, 1000, 100), _run(BASELINE, 0, 1300, 200), _run(OTHER, 0, 1150, 100),
            # A busy round: everything costs more, the ratios hold.
            _run(LOCAL, 1, 2000, 50), _run(BASELINE, 1, 2600, 100), _run(OTHER, 1, 2400, 100)]
    rows = {row["client"]: row for row in summarise(runs, [LOCAL, BASELINE, OTHER])}
    other = rows[OTHER]
    assert other["over_floor_us"] == pytest.approx((150 + 400) / 2)
    assert other["over_floor_vs_baseline_median"] == pytest.approx((0.5 + 400 / 600) / 2)
    assert other["over_floor_vs_baseline_worst"] == pytest.approx(400 / 600)
    assert (other["rate_vs_baseline_median"], other["rate_vs_baseline_worst"]) == (0.75, 0.5)
    assert rows[BASELINE]["over_floor_vs_baseline_worst"] == 1.0
    table = gcs_clients({"objects": 6, "min_bytes": 10_000, "max_bytes": 200_000, "concurrency": 32,
                         "python_loops": 1, "released_kb": 1, "rounds": 2, "baseline": BASELINE,
                         "rows": list(rows.values())})
    assert "| (e) another client | 30 ms | 1,775 | 178 | 275 | 0.58, 0.67 | 100 | 0.75, 0.50 |" in table
