"""Listing benchmark: how long the launcher takes to list a large gs:// tree.

Fills the test GCS server (``tests/gcs_harness/server.py``, which pages listings
1,000 names at a time as GCS does) with an ImageNet-shaped tree of tiny objects
(``images/<label>/<label>_<n>.JPEG``), then times, in a fresh process each, with
0 and 30 ms added to every request:

  (a) Beam's ``FileSystems.match(root/**)``, the serial page-by-page listing
      beam-prep used before, as the baseline;
  (b) ``listing.list_tree``, as the launcher runs it (folders listed concurrently).

It reports the wall time after imports, the lister's own CPU, the requests the
gateway saw, and the emulator's CPU, which on a 2-core machine is taken from
the lister (the gateway's, in this process, is not counted).

    python -m benchmarks.bench_listing [--objects 100000] [--labels 1000] [--latencies 0 30]
"""
from __future__ import annotations

import argparse
import logging
import pathlib
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from benchmarks.gcs_server import UPLOAD_THREADS, GcsServer, run_child, scratch_server
from benchmarks.report import tables
from benchmarks.results import Recording

log = logging.getLogger(__name__)
# The child's own peak resident set: VmHWM starts again at exec, where getrusage's
# ru_maxrss keeps the parent's peak at the fork (this process's, with its 100,000 names).
_PEAK = """
def peak_rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
"""
_CHILDREN = {
    "(a) Beam FileSystems.match": """
import json, sys, time
{PEAK}from apache_beam.io.filesystems import FileSystems
start, cpu = time.perf_counter(), time.process_time()
files = FileSystems.match([sys.argv[1] + "/**"])[0].metadata_list
print(json.dumps({"seconds": time.perf_counter() - start, "cpu_s": time.process_time() - cpu,
                  "files": len(files), "peak_rss_mb": peak_rss_mb()}))
""",
    "(b) beam-prep list_tree": """
import json, sys, time
{PEAK}from beam_prep.write.plan.listing import list_tree
start, cpu = time.perf_counter(), time.process_time()
listing = list_tree(sys.argv[1])
print(json.dumps({"seconds": time.perf_counter() - start, "cpu_s": time.process_time() - cpu,
                  "files": listing.listed, "peak_rss_mb": peak_rss_mb()}))
""",
}
_CHILDREN = {name: code.replace("{PEAK}", _PEAK) for name, code in _CHILDREN.items()}


def _time_child(server: GcsServer, name: str, code: str, root: str, ms: int, expected: int) -> dict[str, object]:
    run = run_child(server, code, [root], ms)
    if run.report["files"] != expected:
        raise RuntimeError(f"{name} listed {run.report['files']} of {expected} objects")
    row = {"lister": name, "latency_ms": ms, **run.report, "requests": run.requests,
           "emulator_cpu_s": run.emulator_cpu_s}
    log.info("%s", row)
    return row


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--labels", type=int, default=1000)
    parser.add_argument("--latencies", type=int, nargs="+", default=[0, 30], metavar="MS")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    recording = Recording("listing", argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    rows = []
    with scratch_server("listing-") as (server, _):
        bucket = server.new_bucket()
        labels = [f"n{i:08d}" for i in range(args.labels)]
        names = [f"images/{labels[i % args.labels]}/{labels[i % args.labels]}_{i}.JPEG"
                 for i in range(args.objects)]
        start = time.perf_counter()
        with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
            list(pool.map(lambda name: bucket.write_bytes(name, b"x"), names))
        log.info("uploaded %d objects in %.0f s", len(names), time.perf_counter() - start)
        for _ in range(args.repeat):
            for ms in args.latencies:
                for name, code in _CHILDREN.items():
                    rows.append(_time_child(server, name, code, bucket.url("images"), ms, args.objects))
    print()
    print(f"Listing {args.objects:,} objects in {args.labels:,} label folders (`listing.list_tree`, "
          "a fresh process, after its imports):")
    print()
    results = {"objects": args.objects, "labels": args.labels, "rows": rows}
    print(tables.listing(results))
    recording.write(args.json, results)


if __name__ == "__main__":
    main()
