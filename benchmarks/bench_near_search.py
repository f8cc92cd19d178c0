"""Near-duplicate search benchmark: the launcher's time and memory to find every pair within the
threshold among millions of perceptual hashes, and group them.

Hashes are uniform 64-bit values (the search's worst case for a given count: real
hashes cluster, and clusters are few distinct values), a share of them with a
near copy a few bits away, planted so the pairs found can be checked. Each size
and threshold runs once, in a fresh process: ``near.components(near.near_pairs(...))``
on the distinct hashes, as ``near.report`` calls it. Memory is the growth of
the process's peak resident set over its size before the search (the kernel's
high-water mark reset then, ``/proc/self/clear_refs``, and read after, ``VmHWM``);
CPU seconds are the process's, wall seconds the search's.

    python -m benchmarks.bench_near_search [--hashes 1000000 2000000] [--distances 6 10]
"""
from __future__ import annotations

import argparse
import json
import logging
import pathlib
import subprocess
import sys
from collections.abc import Sequence

from benchmarks.bench_duplicates import _PEAK
from benchmarks.report import tables
from benchmarks.results import Recording

log = logging.getLogger(__name__)
REPO = pathlib.Path(__file__).resolve().parent.parent
NEAR_SHARE = 0.01  # of the hashes, with a planted near copy

_SEARCH = _PEAK + """
import json, sys, time
import numpy as np
from beam_prep.write.finish import near
count, distance, share = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
rng = np.random.default_rng(count + distance)
hashes = rng.integers(0, 2**64 - 1, size=count, dtype=np.uint64, endpoint=True)
planted = int(count * share)
flips = np.zeros(planted, dtype=np.uint64)
for bit in range(distance):  # each copy differs from its source in exactly `distance` bits
    flips |= np.uint64(1) << rng.integers(0, 64, size=planted).astype(np.uint64)
hashes[count - planted:] = hashes[:planted] ^ flips
hashes = np.unique(hashes)
before = reset_peak()
start, cpu = time.perf_counter(), time.process_time()
labels = near.components(len(hashes), near.near_pairs(hashes, distance))
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
grouped = int(np.count_nonzero(np.bincount(labels) >= 2))
print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "grown_kb": peak() - before, "groups": grouped,
                  "planted": planted, "plan": near.band_plan(len(hashes), distance)}))
"""


def measure(count: int, distance: int) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", _SEARCH, str(count), str(distance), str(NEAR_SHARE)], cwd=REPO,
                          capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    if report["groups"] < report["planted"] * 0.99:  # a few planted pairs may fall into one group
        raise RuntimeError(f"found {report['groups']} groups, {report['planted']} planted")
    row = {"hashes": count, "distance": distance, "seconds": report["seconds"],
           "cpu_seconds": report["cpu_seconds"], "grown_bytes": report["grown_kb"] * 1024,
           "bands": report["plan"][0], "key_bands": report["plan"][1]}
    log.info("%s", row)
    return row


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hashes", type=int, nargs="+", default=[1_000_000, 2_000_000])
    parser.add_argument("--distances", type=int, nargs="+", default=[6, 10])
    parser.add_argument("--json", type=pathlib.Path, help="also write every run here as JSON")
    args = parser.parse_args(argv)
    recording = Recording("near-search", argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    rows = [measure(count, distance) for distance in args.distances for count in args.hashes]
    results = {"runs": rows}
    print()
    print(tables.near_search(results))
    recording.write(args.json, results)


if __name__ == "__main__":
    main()
