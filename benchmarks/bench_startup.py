"""Start-up benchmark: what the resize kernel costs before a run's first image.

Each figure beside its baseline, measured in the same command:

* a worker's load of the kernel (the C extension's import, in a fresh Python
  process after numpy and Pillow), its time, CPU and private memory (USS). There
  is no cold case: the kernel is built at install time, nothing at run time;
* the whole command on the sample tree (``pipelines.make_sample``), start to
  exit, in alternating rounds: the default against
  ``BEAM_PREP_RESIZE_KERNEL=pillow`` (no kernel: the command as it was before it);
* the command's fixed cost, from its own summary line (start-up, until the first
  image's work; finishing, after the last), on the sample tree and on corpus
  trees of ``--images`` images, in alternating rounds: the default (workers
  started as the command starts, ``warm_pool``) against
  ``BEAM_PREP_WARM_WORKERS=0`` (Beam starts them once the pipeline runs). For
  each, how close the run's wall time comes to what its CPU allows on every
  core: its CPU seconds ÷ (cores × its wall seconds).

    python -m benchmarks.bench_startup [--rounds 5] [--images 10000 20000] [--json startup.json]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from beam_prep.write.images import resample
from beam_prep.write.run import warm_pool
from benchmarks import CACHE_DIR, REPO_ROOT, machine
from benchmarks.corpus import ensure_corpus
from benchmarks.measure import run_measured
from benchmarks.report import tables
from benchmarks.results import Recording

_LOAD = """
import json, sys, time
import numpy, PIL.Image, psutil
process = psutil.Process()
uss = process.memory_full_info().uss
start, cpu = time.perf_counter(), time.process_time()
from beam_prep.write.images import resample
kernel = resample.available()
print(json.dumps({"kernel": kernel, "seconds": time.perf_counter() - start,
                  "cpu": time.process_time() - cpu, "uss_mb": (process.memory_full_info().uss - uss) / 2**20}))
"""


def kernel_load() -> dict:
    """One fresh process's load of the kernel."""
    done = subprocess.run([sys.executable, "-c", _LOAD], cwd=REPO_ROOT, capture_output=True, text=True,
                          env=dict(os.environ), check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def command_seconds(sample: pathlib.Path, work: pathlib.Path, env: dict[str, str]) -> float:
    out = pathlib.Path(tempfile.mkdtemp(dir=work))
    measured = run_measured([sys.executable, "-m", "pipelines.prepare_images", "--input", str(sample),
                             "--output", str(out / "out")], cwd=REPO_ROOT, env=env)
    if measured.returncode != 0:
        sys.exit(f"the command failed:\n{measured.stderr}")
    return measured.seconds


# The command's summary: "written in 2.1 s (start-up 1.0 s, then 152 images/s for 0.8 s, finishing 0.4 s)".
_PHASES = re.compile(r"written in ([\d.]+) s \(start-up ([\d.]+) s, then [\d,]+ images/s for ([\d.]+) s, "
                     r"finishing ([\d.]+) s\)")
WARM = "workers started with the command"
COLD = f"workers started by Beam ({warm_pool.WARM_VARIABLE}=0)"


def command_phases(tree: pathlib.Path, work: pathlib.Path, env: dict[str, str]) -> dict[str, float]:
    """One run of the command on ``tree``: its wall and CPU seconds, and the phases its summary gives."""
    out = pathlib.Path(tempfile.mkdtemp(dir=work))
    measured = run_measured([sys.executable, "-m", "pipelines.prepare_images", "--input", str(tree),
                             "--output", str(out / "out")], cwd=REPO_ROOT, env=env)
    if measured.returncode != 0:
        sys.exit(f"the command failed:\n{measured.stderr_tail}")
    match = _PHASES.search(measured.stdout)
    if match is None:
        sys.exit(f"no phases in the command's summary:\n{measured.stdout}")
    run_s, startup, _, finishing = map(float, match.groups())
    shutil.rmtree(out)
    return {"wall s": measured.seconds, "CPU s": measured.cpu_seconds, "start-up s": startup,
            "finishing s": finishing, "fixed s": startup + finishing,
            "before the run s": measured.seconds - run_s,
            "CPU ÷ (cores × wall)": measured.cpu_seconds / ((os.cpu_count() or 1) * measured.seconds)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--images", type=int, nargs="*", default=[],
                        help="also the fixed cost on corpus trees of these sizes (e.g. 10000 20000)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    recording = Recording("startup", argv)
    if resample.available() != resample.KERNEL:
        sys.exit(f"no kernel to measure here: {resample.available()}")
    results: dict[str, list[float]] = {}
    phases: dict[str, dict[str, dict[str, list[float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as folder:
        work = pathlib.Path(folder)
        sample = work / "sample"
        subprocess.run([sys.executable, "-m", "pipelines.make_sample", str(sample)], cwd=REPO_ROOT,
                       check=True, capture_output=True)
        trees = {"sample": sample, **{f"{n:,} images": ensure_corpus(n, CACHE_DIR).root for n in args.images}}
        for round_ in range(args.rounds):
            for tree_name, tree in trees.items():
                runs = {WARM: {}, COLD: {warm_pool.WARM_VARIABLE: "0"}}
                for name, env in (runs.items() if round_ % 2 == 0 else reversed(runs.items())):
                    for key, value in command_phases(tree, work, {**os.environ, **env}).items():
                        phases.setdefault(tree_name, {}).setdefault(name, {}).setdefault(key, []).append(value)
        for round_ in range(args.rounds):
            load = kernel_load()
            results.setdefault("load: s", []).append(load["seconds"])
            results.setdefault("load: CPU s", []).append(load["cpu"])
            results.setdefault("load: memory MB (USS)", []).append(load["uss_mb"])
            runs = {"command, without the kernel": {resample.KERNEL_VARIABLE: resample.PILLOW},
                    "command, with the kernel": {}}
            for name, env in (runs.items() if round_ % 2 == 0 else reversed(runs.items())):
                results.setdefault(name, []).append(command_seconds(sample, work, {**os.environ, **env}))
    record = {"kernel": resample.available(), "rounds": args.rounds, "seconds": results, "phases": phases,
              "cores": os.cpu_count()}
    print(f"{machine.describe(machine.machine_info())}\n")
    print(tables.startup(record))
    recording.write(args.json, record)


if __name__ == "__main__":
    main()
