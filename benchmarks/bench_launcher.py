"""Launcher benchmark: memory and time to list and plan a large local tree, before any image is read.

Builds (once, cached under ``benchmarks/.cache``) trees of empty files with
image names, ``<label>/<label>_<n>.JPEG`` in 1,000 folders, and runs in a fresh
process each, in turn:

  (a) a bare ``os.scandir`` walk that counts the files: the floor any lister
      in Python pays, as the baseline;
  (b) ``beam-prep prepare --dry_run``, as a user types it: listing, labels,
      splits and the shard plan (it prints the time it planned in);
  (c) the launcher's whole work before the workers start: (b)'s plan, then
      every worker's listing written (``work_files.write_work_files``);
  (d) (b) with ``--metadata``: a CSV table of a row per file (``file_name,label``,
      in the walk's order, not sorted), read, checked and joined with the walk
      on disk (``metadata``, ``listing``);
  (e) (b) with ``--validation_percent 10 --stratify``: every file ranked within
      its label on disk before its split is chosen (``selection``);
  (f) (e) with ``--max_per_class`` half of each label's files: ranked by the cap's
      hash, the kept half ranked again for its split, the rest skipped.
  (g) Hugging Face's layout of the same files: ``<split>/<label>/<file>`` (a tenth in
      ``validation``) with a ``metadata.csv`` in each split folder, found without a flag,
      its ``file_name`` relative to its folder and no label column (labels from the
      folders below the split folder): the tables read and combined, then (d)'s merge.

Peak memory is the process's resident set size (``ru_maxrss``), the figure an
OOM killer acts on. The table gives each size and the ratios (b)/(a) in time,
and each run's peak at the largest size against its peak at the smallest.

With ``--append``, an append's launcher instead, against (b) as its baseline:

  (h) ``beam-prep prepare --append`` of ``APPENDED`` new images to a dataset of as many records as the
      tree has files: a real dataset of a few images whose kept hash file (``hashes-v1.tsv.gz``) is
      made to hold a line for each of the others (synthetic sha256, split, perceptual hash and
      path, sorted by path as beam-prep writes a kept file; made once, cached), from a batch folder
      outside the dataset's input: the launcher checks each new file against them all in a pass over
      the kept lines and searches the new records' near duplicates among them all, comparing none by
      path;
  (h′) the same append from the dataset's own input, which holds the first tree's few images and the
      batch's, and none of the others: every record is read in path order and merged with the
      listing, and every other record's source is reported gone (changed.jsonl).

Both are sampled in the launcher's process alone (its workers are other processes), every 50 ms:
peak RSS, PSS and USS (``psutil``'s ``memory_full_info``); the table gives (h) ÷ (b) for each.

    python -m benchmarks.bench_launcher [--files 200000 2000000] [--repeat 3]
    python -m benchmarks.bench_launcher --append --files 2000000 --repeat 1
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from benchmarks.report import tables
from benchmarks.results import Recording

log = logging.getLogger(__name__)
REPO = pathlib.Path(__file__).resolve().parent.parent
CACHE = REPO / "benchmarks" / ".cache"
LABELS = 1000
_DRY_RUN = "(b) beam-prep prepare --dry_run"
_WITH_TABLE = "(d) (b) with --metadata, a row per file"
_STRATIFIED = "(e) (b) with --validation_percent 10 --stratify"
_CAPPED = "(f) (e) with --max_per_class half of each label"
_SPLIT_TABLES = "(g) (b) with a table in each split folder"
SPLITS = ("train", "validation")

_CHILDREN = {
    "(a) os.scandir walk": """
import json, os, sys, time
start = time.perf_counter()
count, folders = 0, [sys.argv[1]]
while folders:
    with os.scandir(folders.pop()) as it:
        for entry in it:
            if entry.is_dir():
                folders.append(entry.path)
            else:
                entry.stat()
                count += 1
print(json.dumps({"files": count, "seconds": time.perf_counter() - start}))
""",
    "(c) plan + workers' listings": """
import json, sys, tempfile, time
from apache_beam.options.pipeline_options import PipelineOptions
from beam_prep.write.images.imaging import ImageSpec
from beam_prep.write.plan.config import PrepareConfig
from beam_prep.write.run.pipeline import plan_run
from beam_prep.write.plan.work_files import write_work_files
start = time.perf_counter()
config = PrepareConfig(input=sys.argv[1], output=sys.argv[2], spec=ImageSpec())
listing, run_plan = plan_run(config, PipelineOptions([]))
with listing:
    write_work_files(listing, run_plan, sys.argv[2])
print(json.dumps({"files": run_plan.listed, "seconds": time.perf_counter() - start}))
""",
}


def ensure_tree(files: int) -> pathlib.Path:
    """``files`` empty files in ``LABELS`` folders, made once and kept in the cache."""
    root = CACHE / f"launcher-tree-{files}"
    done = CACHE / f"launcher-tree-{files}.complete"
    if done.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    start = time.perf_counter()
    labels = [f"n{i:08d}" for i in range(LABELS)]
    for label in labels:
        (root / label).mkdir(parents=True)
    for i in range(files):
        label = labels[i % LABELS]
        os.close(os.open(root / label / f"{label}_{i}.JPEG", os.O_CREAT | os.O_WRONLY, 0o644))
    done.touch()
    log.info("made a tree of %d files in %.0f s", files, time.perf_counter() - start)
    return root


def ensure_table(files: int) -> pathlib.Path:
    """The --metadata table of ``ensure_tree(files)``: a row per file, made once and kept in the cache."""
    table = CACHE / f"launcher-table-{files}.csv"
    if table.exists():
        return table
    labels = [f"n{i:08d}" for i in range(LABELS)]
    partial = table.with_suffix(".partial")
    with open(partial, "w") as f:
        f.write("file_name,label\n")
        for i in range(files):
            label = labels[i % LABELS]
            f.write(f"{label}/{label}_{i}.JPEG,{label}\n")
    partial.rename(table)
    return table


def ensure_split_tree(files: int) -> pathlib.Path:
    """``ensure_tree``'s files as Hugging Face lays them out, a table in each split folder
    (``file_name`` relative to it, no label column): made once and kept in the cache."""
    root = CACHE / f"launcher-split-tree-{files}"
    done = CACHE / f"launcher-split-tree-{files}.complete"
    if done.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    labels = [f"n{i:08d}" for i in range(LABELS)]
    for split in SPLITS:
        for label in labels:
            (root / split / label).mkdir(parents=True)
    tables = {split: open(root / split / "metadata.csv", "w") for split in SPLITS}
    try:
        for table in tables.values():
            table.write("file_name\n")
        for i in range(files):
            label, split = labels[i % LABELS], SPLITS[i % 10 == 0]
            name = f"{label}/{label}_{i}.JPEG"
            os.close(os.open(root / split / name, os.O_CREAT | os.O_WRONLY, 0o644))
            tables[split].write(name + "\n")
    finally:
        for table in tables.values():
            table.close()
    done.touch()
    return root


def _dry_run(name: str, files: int, root: str, output: str, *flags: str) -> dict[str, object]:
    """``beam-prep prepare --dry_run`` in a fresh process: the time it says it planned in, and its peak."""
    out, seconds, rss = _run([sys.executable, "-m", "pipelines.prepare_images", "--input", root,
                              "--output", output, "--dry_run", *flags])
    planned = float(re.search(r"planned in ([\d.]+) s", out).group(1))
    listed = int(re.search(r"lists ([\d,]+) images", out).group(1).replace(",", ""))
    return {"run": name, "files": files, "listed": listed, "seconds": planned, "process_seconds": seconds,
            "peak_rss_bytes": rss}


def _run(command: list[str]) -> tuple[str, float, int]:
    """Runs ``command`` in a fresh process; its stdout, wall seconds and peak RSS."""
    os.sync()
    # A child of a child of ours would fold into RUSAGE_CHILDREN's maximum: run each
    # through a Python that reports its own child's peak alone.
    wrapper = ("import json, resource, subprocess, sys, time; s = time.perf_counter(); "
               "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
               "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
               "print(json.dumps({'rc': p.returncode, 'out': p.stdout, 'err': p.stderr[-2000:], "
               "'seconds': time.perf_counter() - s, 'maxrss': u.ru_maxrss}))")
    done = subprocess.run([sys.executable, "-c", wrapper, *command], cwd=REPO, capture_output=True, text=True,
                          check=True)
    report = json.loads(done.stdout)
    if report["rc"] != 0:
        raise RuntimeError(f"{command} failed: {report['err']}")
    return report["out"], report["seconds"], report["maxrss"] * (1 if sys.platform == "darwin" else 1024)


def measure(files: int) -> list[dict[str, object]]:
    root = str(ensure_tree(files))
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-launcher-") as scratch:
        for name, code in _CHILDREN.items():
            out, seconds, rss = _run([sys.executable, "-c", code, root, os.path.join(scratch, name[1])])
            report = json.loads(out)
            rows.append({"run": name, "files": files, "listed": report["files"], "seconds": report["seconds"],
                         "process_seconds": seconds, "peak_rss_bytes": rss})
        rows.append(_dry_run(_DRY_RUN, files, root, os.path.join(scratch, "out")))
        rows.append(_dry_run(_WITH_TABLE, files, root, os.path.join(scratch, "out"), "--metadata",
                             str(ensure_table(files))))
        stratified = ("--validation_percent", "10", "--stratify")
        rows.append(_dry_run(_STRATIFIED, files, root, os.path.join(scratch, "out"), *stratified))
        cap = max(1, files // LABELS // 2)
        rows.append(_dry_run(_CAPPED, files, root, os.path.join(scratch, "out"), *stratified,
                             "--max_per_class", str(cap)))
        rows.append(_dry_run(_SPLIT_TABLES, files, str(ensure_split_tree(files)), os.path.join(scratch, "out")))
    for row in rows:
        expected = min(files, cap * LABELS) if row["run"] == _CAPPED else files
        if row["listed"] != expected:
            raise RuntimeError(f"{row['run']} listed {row['listed']} of {expected} files")
        log.info("%s", row)
    return rows


APPENDED = 100  # new images an append (h) adds
_APPEND = f"(h) --append of {APPENDED} images to a dataset of as many records"
_OWN_INPUT = "(h′) (h) from the dataset's own input, every other record's source gone"
_SAMPLE_SECONDS = 0.05


def ensure_dataset(records: int) -> pathlib.Path:
    """A dataset of ``records`` records as an append sees it (its kept hash lines), made once and cached:
    a real dataset of a few images, its kept hash file given a synthetic line for each of the others, after
    the real ones and sorted by path as beam-prep writes a kept file (``label_*`` before ``n*``)."""
    import gzip

    import numpy as np

    root = CACHE / f"append-dataset-sorted-{records}"  # an earlier one's synthetic lines were not in path order
    done = CACHE / f"append-dataset-sorted-{records}.complete"
    if done.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    tree = CACHE / "append-first-tree"
    _images(tree, 20, seed=0)
    _run([sys.executable, "-m", "pipelines.prepare_images", "--input", str(tree), "--output", str(root),
          "--image_size", "32", "--direct_running_mode", "in_memory"])
    kept = root / "hashes-v1.tsv.gz"
    real = gzip.decompress(kept.read_bytes())
    rng = np.random.default_rng(0)
    synthetic = records - real.count(b"\n")
    with gzip.GzipFile(kept, "wb", mtime=0, compresslevel=1) as out:
        out.write(real)
        for start in range(0, synthetic, 100_000):
            count = min(100_000, synthetic - start)
            digests = rng.integers(0, 2**63, size=(count, 4), dtype=np.int64)
            pictures = rng.integers(0, 2**63, size=count, dtype=np.int64)
            out.write("".join(
                f"{d[0]:016x}{d[1]:016x}{d[2]:016x}{d[3]:016x}\t{'validation' if (start + i) % 10 == 0 else 'train'}"
                f"\t{p:016x}\t\"n{(start + i) * LABELS // synthetic:08d}/synthetic_{start + i:09d}.JPEG\"\n"
                for i, (d, p) in enumerate(zip(digests.tolist(), pictures.tolist()))).encode())
    data = kept.read_bytes()
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["hash_files"] = [{"version": 1, "file": kept.name, "records": records,
                               "sha256": hashlib.sha256(data).hexdigest()}]
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    done.touch()
    return root


def _images(folder: pathlib.Path, count: int, seed: int) -> pathlib.Path:
    """``count`` small JPEGs of noise in two labels under ``folder`` (made once)."""
    from PIL import Image

    if folder.exists():
        return folder
    for i in range(count):
        path = folder / f"label_{i % 2}" / f"image_{seed}_{i:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.effect_noise((48, 40), 60 + (seed * count + i) % 40).convert("RGB").save(path, quality=90)
    return folder


def _sampled(command: list[str]) -> dict[str, float]:
    """Runs ``command``; its wall seconds and its own process's peak RSS, PSS and USS (not its children's)."""
    import psutil

    os.sync()
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err)
        watched = psutil.Process(process.pid)
        peak = {"rss": 0, "pss": 0, "uss": 0}
        while process.poll() is None:
            try:
                full = watched.memory_full_info()
            except psutil.Error:
                break
            peak = {key: max(value, getattr(full, key)) for key, value in peak.items()}
            time.sleep(_SAMPLE_SECONDS)
        process.wait()
        err.seek(0)
        if process.returncode != 0:
            raise RuntimeError(f"{command} failed: {err.read().decode(errors='replace')[-2000:]}")
    return {"process_seconds": time.perf_counter() - start, **{f"peak_{key}_bytes": value for key, value in peak.items()}}


def measure_append(files: int) -> list[dict[str, object]]:
    """(b), the listing of ``files`` files, then (h), an append to a dataset of ``files`` records."""
    root, dataset = str(ensure_tree(files)), ensure_dataset(files)
    batch = _images(CACHE / "append-batch", APPENDED, seed=1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-launcher-append-") as scratch:
        listing = _sampled([sys.executable, "-m", "pipelines.prepare_images", "--input", root, "--output",
                            os.path.join(scratch, "out"), "--dry_run"])
        rows.append({"run": _DRY_RUN, "files": files, **listing})
        target = os.path.join(scratch, "dataset")
        shutil.copytree(dataset, target)
        appended = _sampled([sys.executable, "-m", "pipelines.prepare_images", "--input", str(batch), "--output",
                             target, "--append"])
        manifest = json.loads(pathlib.Path(target, "manifest.json").read_text())
        added = sum(s["num_examples"] for s in manifest["versions"][-1]["splits"].values())
        if added != APPENDED or manifest["hash_files"][0]["records"] != files:
            raise RuntimeError(f"the append added {added} of {APPENDED} records to {files}")
        rows.append({"run": _APPEND, "files": files, **appended})
        rows.append({"run": _OWN_INPUT, "files": files, **_own_input(dataset, batch, scratch, files)})
    for row in rows:
        log.info("%s", row)
    return rows


def _own_input(dataset: pathlib.Path, batch: pathlib.Path, scratch: str, files: int) -> dict[str, float]:
    """(h′): ``dataset`` copied, its input moved to a folder holding the first tree's images and the
    batch's, appended from that folder (``_sampled``'s figures)."""
    own, target = pathlib.Path(scratch, "own-input"), os.path.join(scratch, "dataset-own")
    shutil.copytree(CACHE / "append-first-tree", own)
    shutil.copytree(batch, own, dirs_exist_ok=True)
    shutil.copytree(dataset, target)
    manifest_path = pathlib.Path(target, "manifest.json")
    manifest = json.loads(manifest_path.read_text())
    manifest["versions"][0]["input"] = str(own)
    manifest_path.write_text(json.dumps(manifest, indent=2))
    measured = _sampled([sys.executable, "-m", "pipelines.prepare_images", "--input", str(own), "--output", target,
                         "--append"])
    latest = json.loads(manifest_path.read_text())["versions"][-1]
    added = sum(s["num_examples"] for s in latest["splits"].values())
    first = sum(1 for _ in (CACHE / "append-first-tree").rglob("*.jpg"))
    if (added, latest["appended"]["gone"]) != (APPENDED, files - first):
        raise RuntimeError(f"the append from the dataset's own input added {added} records and found "
                           f"{latest['appended']['gone']} gone, not {APPENDED} and {files - first}")
    return measured


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, nargs="+", default=[200_000, 2_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--append", action="store_true",
                        help="measure an append's launcher (h) against the listing (b) instead")
    parser.add_argument("--json", type=pathlib.Path, help="also write every run here as JSON")
    args = parser.parse_args(argv)
    recording = Recording("launcher-append" if args.append else "launcher", argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    measured = measure_append if args.append else measure
    rows = [row for _ in range(args.repeat) for files in args.files for row in measured(files)]
    results = {"repeat": args.repeat, "labels": LABELS, "runs": rows}
    print()
    print(tables.launcher_append(results) if args.append else tables.launcher(results))
    recording.write(args.json, results)


if __name__ == "__main__":
    main()
