"""Append benchmark: adding 1% to a prepared dataset against preparing that 1% alone.

The corpus (``benchmarks/corpus.py``) of ``--images`` plus ``--percent`` more, split by hard
links into the tree (``--images``) and the new batch (every ``1 / percent``-th image). The tree
is prepared once with the writer benchmark's flags, timed ((w): what a rewrite costs), then the
batch is linked into it too (the grown tree: the first run's input, grown); then, in turns for
``--rounds`` rounds, each run in a fresh process:

  (a) the batch prepared alone into a fresh folder: the baseline;
  (l1) the listing of the batch alone, and (l2) of the grown tree (``list_tree``, after imports);
  (c) ``prepare --append`` of the batch folder, into a fresh copy of the dataset;
  (d) ``prepare --append`` of the grown tree (the first run's input again: only the batch is new);
  (a′) (a) again: each round's baseline is the mean of (a) and (a′), which bracket the appends, so a
      host whose speed drifts within a round (a virtual machine's does, by tens of percent a minute)
      moves the baseline with the appends rather than against them;
  (e) the dataset's records read as an append reads them (``append.read_existing``: its kept files);
  (f) every file of the grown tree hashed as ``--append_check content`` reads it (``append.narrow``'s
      SHA-256s; by default (d) reads only the files whose size or stamp changed, the batch).

The issue's bound: an append costs at most its input's listing plus 1.2x (a), in wall time; the
same sum is shown per CPU-second, which other programs on the machine hardly move. (e) and (f)
are the append's work that grows with the dataset rather than with the batch.

    python -m benchmarks.bench_append [--images 20000] [--percent 1] [--rounds 3] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import shutil
import sys
import tempfile
from collections.abc import Sequence

from benchmarks import CACHE_DIR, REPO_ROOT, machine
from benchmarks.corpus import ensure_corpus
from benchmarks.measure import Measured, run_measured
from benchmarks.report import tables
from benchmarks.results import Recording
from benchmarks.writer_runs import DEFAULT_FLAGS
from pipelines import prepare_images

log = logging.getLogger(__name__)

BOUND = 1.2  # the issue's: an append costs at most the listing plus BOUND x the batch alone
# Children timed after their imports: (seconds, CPU seconds, and a count to check) as JSON on stdout.
_LISTING = """
import json, sys, time
from beam_prep.write.plan.listing import list_tree
start, cpu = time.perf_counter(), time.process_time()
with list_tree(sys.argv[1]) as listing:
    files = listing.listed
print(json.dumps({"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu, "count": files}))
"""
_EXISTING = """
import json, sys, time
from beam_prep.write.grow.append import read_existing
from beam_prep.write.shared.spill import SpillFolder
start, cpu = time.perf_counter(), time.process_time()
existing = read_existing(sys.argv[1], SpillFolder())
print(json.dumps({"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
                  "count": existing.records}))
"""
_HASHING = """
import concurrent.futures, json, sys, time
from beam_prep.write.grow.append import _THREADS, _sha256s
from beam_prep.write.plan.listing import list_tree
with list_tree(sys.argv[1]) as listing, concurrent.futures.ThreadPoolExecutor(_THREADS) as pool:
    start, cpu = time.perf_counter(), time.process_time()
    files = len(_sha256s(pool, [entry.path for entry in listing.entries()]))
print(json.dumps({"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu, "count": files}))
"""
RUNS = {
    "a": "(a) the batch prepared alone, into a fresh folder",
    "l1": "(l1) the batch listed",
    "l2": "(l2) the grown tree listed",
    "c": "(c) `prepare --append` of the batch folder",
    "d": "(d) `prepare --append` of the grown tree (the first run's input)",
    "a2": "(a′) the batch prepared alone again, after the appends",
    "e": "(e) the dataset's records read as an append reads them (every shard)",
    "f": "(f) the grown tree's files hashed as an append hashes them (--append_check content)",
}


def make_trees(images: int, new: int, cache: pathlib.Path, workdir: pathlib.Path) -> dict[str, pathlib.Path]:
    """The tree and the batch under ``workdir``, hard links to a corpus of ``images + new`` images; the
    batch is every ``(images + new) // new``-th image, by path."""
    corpus = ensure_corpus(images + new, cache)
    files = corpus.files()
    stride = len(files) // new
    batch = {path for i, path in enumerate(files) if i % stride == stride - 1 and i // stride < new}
    trees = {name: workdir / name for name in ("tree", "batch")}
    for path in files:
        _link(path, trees["batch" if path in batch else "tree"] / path.relative_to(corpus.root))
    return trees


def grow(tree: pathlib.Path, batch: pathlib.Path) -> None:
    """Links the batch's files into the tree, at the same relative paths."""
    for path in sorted(batch.rglob("*.jpg")):
        _link(path, tree / path.relative_to(batch))


def _link(source: pathlib.Path, target: pathlib.Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    os.link(source, target)


def _prepare(*args: str) -> Measured:
    """The command a user types, timed to the manifest written (as the writer benchmark times it)."""
    return run_measured(prepare_images.command(*args), cwd=REPO_ROOT)


def _timed(measured: Measured, out: pathlib.Path, records: int, version: int, unchanged: int = 0) -> dict[str, object]:
    """A prepare run's figures; ``error`` where it failed, its version does not hold ``records``, or an
    append's did not find ``unchanged`` files already in the dataset (and nothing else left out)."""
    row: dict[str, object] = {"seconds": measured.seconds, "cpu_seconds": measured.cpu_seconds,
                              "peak_rss_bytes": measured.peak_rss_bytes, "exit_seconds": measured.seconds,
                              "error": None}
    if measured.returncode != 0:
        row["error"] = f"exit status {measured.returncode}; stderr ends:\n{measured.stderr_tail}"
        return row
    manifest = json.loads((out / "manifest.json").read_text())
    latest = manifest.get("versions", [{}])[-1]
    added = sum(split["num_examples"] for split in latest.get("splits", {}).values())
    if (latest.get("version"), added) != (version, records):
        row["error"] = f"version {latest.get('version')} holds {added} records, not version {version} of {records}"
    left_out = {key: n for key, n in (latest.get("appended") or {}).items() if n and key != "new_labels"}
    if left_out != ({"unchanged": unchanged} if unchanged else {}):
        row["error"] = f"the append left out {left_out}, not {unchanged} files already in the dataset"
    row["seconds"] = measured.seconds_until_written(out / "manifest.json")
    return row


def _child(code: str, path: pathlib.Path, expected: int) -> dict[str, object]:
    """A child's own figures, after its imports; ``error`` where it failed or counted another number."""
    measured = run_measured([sys.executable, "-c", code, str(path)], cwd=REPO_ROOT)
    if measured.returncode != 0:
        return {"error": f"exit status {measured.returncode}; stderr ends:\n{measured.stderr_tail}"}
    report = json.loads(measured.stdout.strip().splitlines()[-1])
    error = None if report["count"] == expected else f"counted {report['count']}, not {expected}"
    return {"seconds": report["seconds"], "cpu_seconds": report["cpu_seconds"],
            "peak_rss_bytes": measured.peak_rss_bytes, "error": error}


def one_round(trees: dict[str, pathlib.Path], dataset: pathlib.Path, images: int, new: int,
              workdir: pathlib.Path) -> dict[str, dict[str, object]]:
    """Each run once, in the order of ``RUNS`` ((a′) after (d)); each append into its own fresh copy of ``dataset``."""
    row: dict[str, dict[str, object]] = {}
    alone = workdir / "alone"
    shutil.rmtree(alone, ignore_errors=True)
    row["a"] = _timed(_prepare("--input", str(trees["batch"]), "--output", str(alone), *DEFAULT_FLAGS), alone, new, 1)
    row["l1"] = _child(_LISTING, trees["batch"], new)
    row["l2"] = _child(_LISTING, trees["tree"], images + new)
    for key, source, unchanged in (("c", trees["batch"], 0), ("d", trees["tree"], images)):
        copy = workdir / f"append-{key}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(dataset, copy)
        row[key] = _timed(_prepare("--input", str(source), "--output", str(copy), "--append"), copy, new, 2,
                          unchanged)
        shutil.rmtree(copy, ignore_errors=True)
    shutil.rmtree(alone, ignore_errors=True)
    row["a2"] = _timed(_prepare("--input", str(trees["batch"]), "--output", str(alone), *DEFAULT_FLAGS), alone, new, 1)
    row["e"] = _child(_EXISTING, dataset, images)
    row["f"] = _child(_HASHING, trees["tree"], images + new)
    for key, result in row.items():
        log.info("%s: %s", RUNS[key], {k: v for k, v in result.items() if k != "error"} | (
            {"error": result["error"]} if result["error"] else {}))
    return row


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=20_000, help="the dataset's images before the append")
    parser.add_argument("--percent", type=float, default=1.0, help="the batch appended, in percent of --images")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache", type=pathlib.Path, default=CACHE_DIR, help="where the corpus is cached")
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    recording = Recording("append", argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    new = max(1, round(args.images * args.percent / 100))
    args.cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="append-", dir=args.cache) as tmp:  # hard links: the corpus's disk
        workdir = pathlib.Path(tmp)
        trees = make_trees(args.images, new, args.cache, workdir)
        dataset = workdir / "dataset"
        first = _timed(_prepare("--input", str(trees["tree"]), "--output", str(dataset), *DEFAULT_FLAGS),
                       dataset, args.images, 1)
        if first["error"]:
            raise SystemExit(f"the dataset was not prepared: {first['error']}")
        grow(trees["tree"], trees["batch"])
        rounds = [one_round(trees, dataset, args.images, new, workdir) for _ in range(args.rounds)]
    failed = [(key, run["error"]) for row in rounds for key, run in row.items() if run["error"]]
    record = {"settings": {"images": args.images, "new": new, "percent": args.percent, "rounds": args.rounds,
                           "flags": list(DEFAULT_FLAGS), "bound": BOUND},
              "labels": RUNS, "dataset": first, "rounds": rounds}
    print(tables.append(record))
    print()
    print(f"Machine: {machine.describe(machine.machine_info())}")
    recording.write(args.json, record)
    if failed:
        raise SystemExit(f"{RUNS[failed[0][0]]} failed: {failed[0][1]}")


if __name__ == "__main__":
    main()
