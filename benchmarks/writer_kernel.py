"""``bench_writer --kernel``: the default command (c) with each resize kernel, in alternating rounds.

On the cached corpus and (c)'s settings (224x224 centre crops, JPEG q90), in
rounds that take turns so that a shared machine's drift falls on every row:

  * ``kernel``: this checkout, its C extension built (``python setup.py
    build_ext --inplace`` in a checkout; ``pip install -e .`` builds it too);
  * ``kernel, no perceptual hash``: the same with ``--near_duplicate_distance -1``
    (the kernel's cost apart from the near-duplicate hash each image now gets);
  * ``pillow``: the same with ``BEAM_PREP_RESIZE_KERNEL=pillow`` (Pillow's loops);
  * ``pillow-simd``: with ``--accelerated DIR``, the same with that build of
    pillow-simd first on the path of the command and its workers (the kernel
    steps aside for it): the speed the kernel is held to;
  * ``baseline``: with ``--baseline DIR``, the command of another checkout (e.g.
    ``git worktree add ../beam-prep-main main``: today's loader), first on the
    path of the command and its workers; one untimed run first fills its kernel
    cache, so the rounds time its steady state.

Each row gives the median over rounds of images/s (command start to
manifest.json written), CPU ms per image (user + system of the whole process
tree: the figure that holds still on a shared machine), and the peak memory of
the whole tree as RSS (a shared page counted once a process), PSS (shared
pages split between their processes) and USS (pages only one process maps),
and the CPU per image over the first row's (the bar: the default command's
may rise at most 3% over the baseline's).

    python -m benchmarks.bench_writer --kernel [--images 2000] [--repeat 5] [--baseline DIR]
        [--accelerated .ci/pillow-simd] [--json k.json]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import shutil
import tempfile
from collections.abc import Sequence

from beam_prep.write.images import resample
from benchmarks import CACHE_DIR, REPO_ROOT, machine
from benchmarks.corpus import Corpus, ensure_corpus
from benchmarks.measure import check_manifest, run_measured
from benchmarks.report import tables
from benchmarks.results import Recording
from pipelines import prepare_images

DEFAULT_IMAGES = 2000
FLAGS = ("--image_size", "224", "--jpeg_quality", "90")
MIB = 2**20


# This checkout's flag that turns the perceptual hash off (an older baseline has neither hash nor flag):
# the kernel's own cost beside the baseline's, apart from the hash's.
NO_HASH = ("--near_duplicate_distance", "-1")


def variants(baseline: pathlib.Path | None, accelerated: pathlib.Path | None = None,
             ) -> dict[str, tuple[pathlib.Path, dict[str, str], tuple[str, ...]]]:
    """Each variant's checkout, its environment's changes (a ``PYTHONPATH`` goes after the
    checkout, before the caller's) and its extra flags."""
    runs = {}
    if baseline is not None:
        runs["baseline"] = (baseline.resolve(), {}, ())
    runs["kernel"] = (REPO_ROOT, {}, ())
    runs["kernel, no perceptual hash"] = (REPO_ROOT, {}, NO_HASH)
    runs["pillow"] = (REPO_ROOT, {resample.KERNEL_VARIABLE: resample.PILLOW}, ())
    if accelerated is not None:
        runs["pillow-simd"] = (REPO_ROOT, {"PYTHONPATH": str(accelerated.resolve())}, ())
    return runs


def run_variant(corpus: Corpus, workdir: pathlib.Path, checkout: pathlib.Path, env: dict[str, str],
                flags: tuple[str, ...] = ()) -> dict:
    """One timed command of a variant: its figures, or its error."""
    out = workdir / "out"
    shutil.rmtree(out, ignore_errors=True)
    full_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(checkout), env.get("PYTHONPATH"), os.environ.get("PYTHONPATH")]))}
    if resample.KERNEL_VARIABLE not in env:
        full_env.pop(resample.KERNEL_VARIABLE, None)
    measured = run_measured(prepare_images.command("--input", str(corpus.root), "--output", str(out), *FLAGS, *flags,
                                                   "--overwrite"), cwd=checkout, env=full_env, private=True)
    if measured.returncode != 0:
        return {"error": f"exit status {measured.returncode}: {measured.stderr_tail[-2000:]}"}
    error = check_manifest(out / "manifest.json", corpus.images)
    if error:
        return {"error": error}
    manifest = json.loads((out / "manifest.json").read_text())
    seconds = measured.seconds_until_written(out / "manifest.json")
    return {"images_per_s": corpus.images / seconds, "cpu_ms_per_image": measured.cpu_seconds / corpus.images * 1e3,
            "peak_rss_mib": measured.peak_rss_bytes / MIB, "peak_pss_mib": measured.peak_pss_bytes / MIB,
            "peak_uss_mib": measured.peak_uss_bytes / MIB, "resize_kernel": manifest.get("resize_kernel")}


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_writer --kernel",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", action="store_true", help="this mode")
    parser.add_argument("--images", type=int, default=DEFAULT_IMAGES, help=f"corpus size (default {DEFAULT_IMAGES})")
    parser.add_argument("--repeat", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--baseline", type=pathlib.Path, metavar="DIR",
                        help="another checkout to run as the first row (e.g. main, with today's loader)")
    parser.add_argument("--accelerated", type=pathlib.Path, metavar="DIR",
                        help="a pillow-simd build (.ci/pillow-simd) to run as a row of its own")
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    if args.images < 1 or args.repeat < 1:
        parser.error("--images and --repeat must be positive")
    if args.baseline is not None and not (args.baseline / "pipelines" / "prepare_images.py").is_file():
        parser.error(f"--baseline {args.baseline} is not a beam-prep checkout")
    if args.accelerated is not None and not (args.accelerated / "PIL").is_dir():
        parser.error(f"--accelerated {args.accelerated} holds no PIL package: bash .ci/build-pillow-simd DIR")
    if resample.available() != resample.KERNEL:
        parser.error("the kernel is not built in this checkout: python setup.py build_ext --inplace")
    recording = Recording("writer-kernel", argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    corpus = ensure_corpus(args.images, CACHE_DIR)
    runs = variants(args.baseline, args.accelerated)
    results: dict[str, list[dict]] = {name: [] for name in runs}
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="kernel-", dir=CACHE_DIR))
    try:
        if args.baseline is not None:  # its kernel cache filled, untimed
            run_variant(corpus, workdir, *runs["baseline"])
        for round_ in range(args.repeat):
            order = list(runs.items()) if round_ % 2 == 0 else list(reversed(runs.items()))
            for name, (checkout, env, flags) in order:
                results[name].append(run_variant(corpus, workdir, checkout, env, flags))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{machine.describe(machine.machine_info())}\n")
    print(f"{corpus.images} images, {args.repeat} rounds, alternating; medians.\n")
    print(tables.writer_kernel({"results": results}))
    for name, rounds in results.items():
        for r in rounds:
            if "error" in r:
                print(f"{name}: {r['error']}")
    recording.write(args.json, {"images": corpus.images, "rounds": args.repeat, "results": results})
