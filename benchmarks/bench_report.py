"""``beam-prep report`` on a dataset of 20,000 records: the page's time and size.

Prepares a synthetic tree (``--images`` pictures of 16x16 in 100 classes, one in a hundred copied
into another file so that duplicates.jsonl has groups, some across splits) once, then times
``make_report`` in this process (TensorFlow imported already) and the command in a fresh process
(its TensorFlow import included), taking turns, and records the page's size.

    python -m benchmarks.bench_report [--images 20000] [--repeat 3] [--json report.json]
"""
from __future__ import annotations

import argparse
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from benchmarks.report import tables
from benchmarks.results import Recording

CLASSES = 100
SIDE = 16


def make_dataset(folder: pathlib.Path, images: int) -> pathlib.Path:
    """A tree of ``images`` pictures (and a copy of every hundredth) prepared into ``folder / "out"``."""
    import beam_prep
    from beam_prep.tools.sample import picture

    tree = folder / "tree"
    for i in range(images):
        label = tree / f"class{i % CLASSES:03d}"
        label.mkdir(parents=True, exist_ok=True)
        picture(i, SIDE, SIDE).save(label / f"img_{i:06d}.png")
        if i % 100 == 0:
            shutil.copy(label / f"img_{i:06d}.png", label / f"copy_{i:06d}.png")
    out = folder / "out"
    beam_prep.prepare(str(tree), str(out), image_size=SIDE, validation_percent=10,
                      direct_running_mode="in_memory")
    return out


def _in_process(out: pathlib.Path) -> tuple[float, float, object]:
    from beam_prep.tools.report import make_report

    wall, cpu = time.perf_counter(), time.process_time()
    report = make_report(str(out))
    return time.perf_counter() - wall, time.process_time() - cpu, report


def _command(out: pathlib.Path) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipelines.cli", "report", str(out)], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parent.parent)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="also write the results here as JSON")
    args = parser.parse_args(argv)
    recording = Recording("report", argv)
    import tensorflow  # noqa: F401 - imported before the in-process timings, as a notebook has it

    with tempfile.TemporaryDirectory() as folder:
        out = make_dataset(pathlib.Path(folder), args.images)
        runs: dict[str, list[float]] = {"report_seconds": [], "report_cpu_seconds": [], "command_seconds": [],
                                        "command_cpu_seconds": []}
        report = None
        for _ in range(args.repeat):
            wall, cpu, report = _in_process(out)
            runs["report_seconds"].append(wall)
            runs["report_cpu_seconds"].append(cpu)
            wall, cpu = _command(out)
            runs["command_seconds"].append(wall)
            runs["command_cpu_seconds"].append(cpu)
        data = report.data
        results = {"records": sum(s.num_examples for s in data.summary.splits), "classes": CLASSES,
                   "image_side": SIDE, "repeat": args.repeat, "page_bytes": report.size,
                   "gallery_images": sum(len(images) for images in data.gallery.images),
                   "leak_pairs": data.leaks.pair_count, "pairs_shown": len(data.leaks.pairs),
                   "groups": data.leaks.group_count, **runs}
    recording.write(args.json, results)
    print(tables.report_page(results))


if __name__ == "__main__":
    main()
