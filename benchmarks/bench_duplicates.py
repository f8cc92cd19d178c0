"""Duplicates benchmark: the manifest step's memory and time to find copies among millions of records.

Writes (once, cached under ``benchmarks/.cache``) the hash files a run leaves in
its folder (``duplicates.hash_line``: sha256, split, source path; one file per
shard of 10,000 records, ImageNet-like paths), where a share of the records
has one copy, in the other split for half of them. Then, each in a fresh
process, in turn:

  (a) the baseline, what a first version would do: every line into a dict
      keyed by its sha256, holding its split and path, then the keys held twice;
  (b) ``duplicates.find``, as the manifest step calls it.

Memory is the growth of the process's peak resident set size over its size
just before the search (after imports): the kernel's high-water mark is reset
then (``/proc/self/clear_refs``, Linux) and read after (``VmHWM``). That is
what the search itself adds, the figure the README bounds at 40 bytes a record. The table gives it per
record, and how it grows from the smallest size to each larger one.

    python -m benchmarks.bench_duplicates [--records 1000000 2000000] [--shares 0.01 1.0]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence

from benchmarks.report import tables
from benchmarks.results import Recording

log = logging.getLogger(__name__)
REPO = pathlib.Path(__file__).resolve().parent.parent
CACHE = REPO / "benchmarks" / ".cache"
RECORDS_PER_FILE = 10_000

# In each child: its resident size now, with the kernel's peak reset to it; its peak since.
_PEAK = """
def _status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status("VmRSS")
def peak():
    return _status("VmHWM")
"""

_SEARCHES = {
    "(a) dict of every sha256 (baseline)": _PEAK + """
import collections, json, sys, time
files = sorted(sys.argv[2:])
before = reset_peak()
start = time.perf_counter()
groups = collections.defaultdict(list)
for path in files:
    with open(path, encoding="utf-8") as f:
        for line in f:
            sha, split, name = line.rstrip("\\n").split("\\t", 2)
            groups[sha].append((split, json.loads(name)))
copies = sum(len(g) - 1 for g in groups.values() if len(g) > 1)
seconds = time.perf_counter() - start
print(json.dumps({"extra_copies": copies, "seconds": seconds, "grown_kb": peak() - before}))
""",
    "(b) beam_prep duplicates.find": _PEAK + """
import json, sys, time
from beam_prep.write.finish import duplicates
files = sorted(sys.argv[2:])
before = reset_peak()
start = time.perf_counter()
found = duplicates.find(files, int(sys.argv[1]))
seconds = time.perf_counter() - start
after = peak()
found.close()
print(json.dumps({"extra_copies": found.extra_copies, "seconds": seconds, "grown_kb": after - before}))
""",
}


def ensure_hash_files(records: int, share: float) -> list[str]:
    """``records`` lines in files of ``RECORDS_PER_FILE``; ``share`` of the records are one of a pair."""
    from beam_prep.write.finish.duplicates import hash_line

    folder = CACHE / f"duplicates-{records}-{share}"
    done = CACHE / f"duplicates-{records}-{share}.complete"
    if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        start = time.perf_counter()
        pairs = int(records * share) // 2
        rng = _random(records)
        lines: list[str] = []
        index = 0
        for i in range(records - pairs):
            sha = rng.randbytes(32).hex()
            label = f"n{i % 1000:08d}"
            lines.append(hash_line(sha, "train", f"/data/images/train/{label}/{label}_{i}.JPEG"))
            if i < pairs:  # its copy: in validation for every other pair
                split = "validation" if i % 2 else "train"
                lines.append(hash_line(sha, split, f"/data/images/{split}/{label}/copy_{label}_{i}.JPEG"))
            while len(lines) >= RECORDS_PER_FILE:
                (folder / f"shard-{index:05d}.sha256.txt").write_text(
                    "".join(f"{line}\n" for line in lines[:RECORDS_PER_FILE]))
                del lines[:RECORDS_PER_FILE]
                index += 1
        if lines:
            (folder / f"shard-{index:05d}.sha256.txt").write_text("".join(f"{line}\n" for line in lines))
        done.touch()
        log.info("wrote hash files of %d records in %.0f s", records, time.perf_counter() - start)
    return sorted(str(p) for p in folder.glob("*.sha256.txt"))


def _random(seed: int):
    import random

    return random.Random(seed)


def measure(records: int, share: float) -> list[dict[str, object]]:
    files = ensure_hash_files(records, share)
    expected = int(records * share) // 2
    rows = []
    for name, code in _SEARCHES.items():
        os.sync()
        done = subprocess.run([sys.executable, "-c", code, str(records), *files], cwd=REPO, capture_output=True,
                              text=True, check=True)
        report = json.loads(done.stdout)
        if report["extra_copies"] != expected:
            raise RuntimeError(f"{name} found {report['extra_copies']} copies, not {expected}")
        grown = report["grown_kb"] * 1024
        rows.append({"search": name, "records": records, "share": share, "seconds": report["seconds"],
                     "grown_bytes": grown})
        log.info("%s", rows[-1])
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, nargs="+", default=[1_000_000, 2_000_000])
    parser.add_argument("--shares", type=float, nargs="+", default=[0.01, 1.0],
                        help="share of the records that are one of a pair")
    parser.add_argument("--json", type=pathlib.Path, help="also write every run here as JSON")
    args = parser.parse_args(argv)
    recording = Recording("duplicates", argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    rows = [row for share in args.shares for records in args.records for row in measure(records, share)]
    results = {"searches": list(_SEARCHES), "runs": rows}
    print()
    print(tables.duplicates(results))
    recording.write(args.json, results)


if __name__ == "__main__":
    main()
