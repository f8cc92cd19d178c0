"""Writer benchmark: beam-prep's pipeline against the seed notebook's writer and the per-core limit.

On one cached corpus and the same settings (224x224 center output, JPEG q90):

  (a) the seed notebook's tf.data writer, as a subprocess timed start to exit;
  (b) the limit: beam-prep's own per-image kernel (``process_image``) on
      images already in memory, one process's rate times the number of cores,
      and (b') the rate measured with one process per core at once: no
      pipeline on this machine can beat them by more than noise;
  (c) beam-prep as a user runs it (``python -m pipelines.prepare_images``),
      timed start to exit, with the peak memory of its whole process tree; at
      the peers' size, run at each end of a round, the peers between, and the
      round's (c) the mean of the two (``writer_runs.bracketed``: a host whose
      speed drifts within a round moves (c) with the peers);
  (d) the same command keeping the originals (``--resize_mode none
      --image_format original``), and (e) the originals recipe capped at 512
      on the shorter side (``--resize_mode shorter_side --image_size 512
      --no_upscale --image_format original``), and (f) (d) with GZIP (originals
      are uncompressed by default), and (i) (c) without the perceptual hash
      (``--near_duplicate_distance -1``: its cost), each run right after (c)'s
      last run, so their ratios to it are taken on the same machine minutes;
  (g) the hand-written writer a user might write instead
      (``benchmarks/handwritten_writer.py``: Pool + Pillow + TFRecordWriter);
  (h) img2dataset, (j) MosaicML Streaming's MDS (``benchmarks/peer_mds.py``),
      (k) LitData's ``optimize`` (``benchmarks/peer_litdata.py``) and (l) Ray
      Data to TFRecords (``benchmarks/peer_ray.py``), each the same job
      through that tool's documented API, when installed: all but Ray live in
      their own virtualenv (``benchmarks/peers.py`` says how to make it;
      ``--peers_python`` names another);
  (c′) with ``--accelerated DIR``: (c) with the pillow-simd that
      ``bash .ci/build-pillow-simd DIR`` built first on the path (the opt-in
      accelerator, README *Faster resizing*), checked in its manifest;
  (c″) (c) with every JPEG down Pillow's path (``BEAM_PREP_JPEG_PATH=pillow``):
      what the JPEG fast path saves, checked in both runs' manifests.

Every run reports images/s, CPU ms per image (user + system of its whole
process tree) and the PSNR of a sample of its records against the reference
crop (``bench_resize``), but (a), which stretches where the others centre-crop.

Prints a markdown table for the README and writes the numbers as JSON with
``--json``. ``--images 20000 40000`` runs (a) and (c) at both sizes to show how
peak memory grows with the corpus.

    python -m benchmarks.bench_writer --images 20000 --json bench.json

``--gcs`` runs the gs:// mode instead (``benchmarks/writer_gcs.py``): the same
corpus from local disk and from the test GCS server at added latencies, both sinks.
``--formats`` runs the file formats mode (``benchmarks/writer_formats.py``): (c) in
every ``--file_format``, and ``data_source``'s random reads beside ``make_dataset``'s.
``--kernel`` runs (c) with each resize kernel, alternating (``benchmarks/writer_kernel.py``):
this checkout's, Pillow's loops, and another checkout's (``--baseline DIR``), with CPU ms per
image and peak RSS, PSS and USS. ``--profile`` samples (c) with py-spy, launcher and workers, and
says what each stage costs an image (``benchmarks/writer_profile.py``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence

from beam_prep.write.images.imaging import ImageSpec
from benchmarks import CACHE_DIR, IMAGE_SIZE, JPEG_QUALITY, PEERS_INSTALL, REPO_ROOT, machine, peers
from benchmarks.corpus import Corpus, ensure_corpus
from benchmarks.limit import LimitResult, measure_limit
from benchmarks.measure import Measured, run_measured
from benchmarks.report import tables
from benchmarks.report.tables import OURS_VARIANTS, RECORD_LIMIT, WRITER_PEERS
from benchmarks.results import Recording
from benchmarks.writer_runs import (
    DEFAULT_FLAGS,
    RunResult,
    bracketed,
    fmt,
    measured_result,
    median_run,
    paired_ratio,
    run_ours,
)

log = logging.getLogger(__name__)

DEFAULT_IMAGES = 2000
ORIGINALS_RUNS = {
    "(d) originals: `--resize_mode none --image_format original`":
        ("--resize_mode", "none", "--image_format", "original", "--jpeg_quality", str(JPEG_QUALITY)),
    "(e) originals, ≤ 512: `--resize_mode shorter_side --image_size 512 --no_upscale --image_format original`":
        ("--resize_mode", "shorter_side", "--image_size", "512", "--no_upscale", "--image_format", "original",
         "--jpeg_quality", str(JPEG_QUALITY)),
    "(f) (d) with `--compression gzip`":
        ("--resize_mode", "none", "--image_format", "original", "--jpeg_quality", str(JPEG_QUALITY),
         "--compression", "gzip"),
    # Not an originals command: (c) without the perceptual hash each image gets for the near-duplicate
    # search, whose ratio to (c) per CPU-second is the hash's cost (issue: at most 3%).
    "(i) (c) without the perceptual hash: `--near_duplicate_distance -1`":
        (*DEFAULT_FLAGS, "--near_duplicate_distance", "-1"),
}
DEFAULT_SAMPLE = 1500
GIB = 2**30
BUSY_WARNING_PERCENT = 10


def run_seed(corpus: Corpus, workdir: pathlib.Path) -> RunResult:
    """(a): the seed notebook's writer in its own Python process."""
    out = workdir / "seed"
    measured = run_measured(
        [sys.executable, "-m", "benchmarks.seed_notebook", "write",
         "--input", str(corpus.root), "--output", str(out),
         "--image_size", str(IMAGE_SIZE), "--jpeg_quality", str(JPEG_QUALITY)],
        cwd=REPO_ROOT,
    )
    result = measured_result(corpus, measured, out)
    if result.error is None:
        try:
            report = json.loads(measured.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError) as e:
            result.error = f"no JSON report on stdout: {e!r}"
            return result
        result.details = report
        if report["written"] != corpus.images:
            result.error = f"wrote {report['written']} records for {corpus.images} images"
    return result


def run_handwritten(corpus: Corpus, workdir: pathlib.Path) -> RunResult:
    """(g): the hand-written Pool + Pillow + TFRecordWriter script."""
    out = workdir / "handwritten"
    measured, report = peers.run_handwritten(corpus, out)
    result = measured_result(corpus, measured, out)
    if result.error is None and report.get("written") != corpus.images:
        result.error = f"wrote {report.get('written')} records for {corpus.images} images"
    if result.error is None:
        result.psnr = peers.record_quality(sorted(out.glob("*.tfrecord.gz")), corpus, peers.ours_record)
    return result


def run_img2dataset(command: str, corpus: Corpus, workdir: pathlib.Path) -> RunResult:
    """(h): img2dataset on a list of file:// paths."""
    out = workdir / "img2dataset"
    measured, report = peers.run_img2dataset(command, corpus, out)
    result = measured_result(corpus, measured, out)
    result.details = escaping_details(measured)
    if result.error is None and report["written"] != corpus.images:
        result.error = f"wrote {report['written']} records for {corpus.images} images"
    if result.error is None:
        result.psnr = peers.record_quality(sorted(out.glob("*.tfrecord")), corpus, peers.img2dataset_record)
    return result


def run_recipe(recipe: peers.Recipe, peers_python: pathlib.Path, corpus: Corpus,
               workdir: pathlib.Path) -> RunResult:
    """(j), (k) or (l): a peer recipe module; its records counted and scored with its own reader."""
    out = workdir / recipe.key
    measured, report = peers.run_recipe(recipe, peers_python, corpus, out)
    result = measured_result(corpus, measured, out)
    result.details = {**report, **escaping_details(measured)}
    if result.error is None and not report:
        result.error = "no JSON report on stdout"
    if result.error is None:
        try:
            if recipe.key == "ray":
                # Ray names its TFRecord files *.tar; they are uncompressed (peer_ray.py).
                files = sorted(path for path in out.iterdir() if path.is_file())
                report["written"] = peers.count_tfrecords(files, "none")
                result.psnr = peers.record_quality(files, corpus, peers.ray_record, compression="")
            else:
                result.psnr = peers.samples_quality(peers.dumped_samples(recipe, peers_python, out), corpus)
        except Exception as e:  # noqa: BLE001 - any failure to read back is the row's error, not the run's
            result.error = f"its records could not be read back: {e!r}"
        result.details["written"] = report.get("written")
    if result.error is None and report.get("written") != corpus.images:
        result.error = f"wrote {report.get('written')} records for {corpus.images} images"
    return result


def escaping_details(measured: Measured) -> dict[str, object]:
    """A run measured with ``escaping``: its CPU is the larger of these two lower bounds (measure.py says
    why), and the processes it left behind that were reaped here."""
    return {"orphans_reaped": measured.orphans_reaped, "cpu_seconds_rusage": measured.cpu_seconds_rusage,
            "cpu_seconds_sampled": measured.cpu_seconds_sampled}


def _ratio(ours: RunResult, other: float | None) -> str:
    mine = ours.images_per_s
    return "—" if mine is None or not other else f"{mine / other:.2f}×"


def table(limit: LimitResult, runs: dict[int, tuple[RunResult, RunResult]],
          peer_runs: dict[str, RunResult] | None = None) -> str:
    """The markdown table, grouped by run: (a) per size, the peers, (b), (c) per size.

    "(c) ÷ row" is our throughput over the row's, at the same corpus size for
    (a), at the largest size for the peers and (b); "per CPU-s" the same ratio
    of images per CPU-second of the whole process tree.
    """
    largest = runs[max(runs)][1]
    lines = [
        "| run | images | wall s | images/s | (c) ÷ row | CPU ms per image | (c) ÷ row per CPU-s "
        "| PSNR dB | peak RSS GiB | output MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [_run_row("(a) seed notebook writer (tf.data, GZIP)", seed, ours) for seed, ours in _by_size(runs)]
    for name, result in (peer_runs or {}).items():
        lines.append(_run_row(WRITER_PEERS[name], result, largest))
    for label, rate, seconds in (
        (f"(b) limit: `process_image` {limit.per_core:,.0f}/s × {limit.cores} cores",
         limit.images_per_s, limit.serial_seconds),
        (f"(b′) limit measured: {limit.cores} processes at once", limit.parallel_images_per_s,
         limit.parallel_seconds),
    ):
        lines.append(f"| {label} | {limit.sample:,} | {fmt(seconds)} | {fmt(rate)} | {_ratio(largest, rate)} "
                     f"| {limit.serial_cpu_seconds / limit.sample * 1e3:.2f} (kernel alone) | — | — | — | — |")
    lines.append(f"| {RECORD_LIMIT.format(per_core=limit.record_per_core, cores=limit.cores)} | {limit.sample:,} "
                 f"| {fmt(limit.record_seconds)} | {fmt(limit.record_images_per_s)} "
                 f"| {_ratio(largest, limit.record_images_per_s)} "
                 f"| {limit.record_cpu_seconds / limit.sample * 1e3:.2f} (one process) | — | — | — | — |")
    lines += [_run_row("(c) beam-prep `pipelines.prepare_images`", ours, None) for _, ours in _by_size(runs)]
    return "\n".join(lines)



def originals_table(ours: dict[int, list[RunResult]], originals: dict[str, dict[int, list[RunResult]]],
                    followed: dict[int, list[RunResult]] | None = None) -> str:
    """(c) and the originals runs: images/s and CPU, each as a median of rounds and as the median
    of each round's ratio to (c): to the (c) run the originals follow in that round (``followed``; its
    last, where (c) brackets the peers), not the bracket's mean, half of which ran minutes before them."""
    lines = [
        "| run | images | wall s | images/s | ÷ (c) | images per CPU-s | ÷ (c) per CPU-s | peak RSS GiB "
        "| output MB | kept, re-encoded |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for size in sorted(ours):
        rows = [("(c) beam-prep default: 224×224 centre crops, JPEG q90", ours[size])]
        rows += [(name, by_size[size]) for name, by_size in originals.items()]
        paired = (followed or ours)[size]
        for name, results in rows:
            chosen = median_run(results)
            is_c = results is ours[size]
            counts = chosen.details.get("originals")
            kept = f"{counts['kept']:,}, {counts['reencoded']:,}" if counts else "—"
            lines.append(
                f"| {name} | {chosen.images:,} | {fmt(chosen.seconds)} "
                f"| {'failed' if chosen.error else fmt(chosen.images_per_s)} "
                f"| {'—' if is_c else _times(paired_ratio(paired, results))} "
                f"| {fmt(chosen.images_per_cpu_s)} "
                f"| {'—' if is_c else _times(paired_ratio(paired, results, per_cpu=True))} "
                f"| {fmt(chosen.peak_rss_bytes / GIB, 2)} | {fmt(chosen.output_bytes / 1e6)} | {kept} |")
    return "\n".join(lines)


def accelerated_line(runs: tuple[RunResult, RunResult], peer_runs: dict[str, RunResult]) -> str | None:
    """(c′)'s own ratios: images per CPU-second against (c), the seed writer (a) and the peers; None
    without a successful (c′) (a failed one is reported with the peers)."""
    fast = peer_runs.get("accelerated")
    if fast is None or fast.error:
        return None
    seed, ours = runs
    against = [("(c)", ours), ("(a) the seed writer", seed),
               *((WRITER_PEERS[name], result) for name, result in peer_runs.items() if name not in OURS_VARIANTS)]
    ratios = ", ".join(f"{fast.images_per_cpu_s / other.images_per_cpu_s:.2f}× {name}"
                       for name, other in against if other.images_per_cpu_s)
    return f"(c′) with pillow-simd, images per CPU-second: {ratios}"


def per_round(ours: list[RunResult], seeds: list[RunResult], peer_attempts: dict[str, list[RunResult]]
              ) -> dict[str, list[dict[str, float | None]]]:
    """Each round's seconds and CPU seconds of (c) (its bracketed mean), (a) and each peer at the peers'
    size, in round order (None where a run failed): what "(c) ÷ the peer in the worse round" is taken from."""
    def row(result: RunResult) -> dict[str, float | None]:
        failed = result.error is not None
        return {"seconds": None if failed else result.seconds, "cpu_seconds": None if failed else result.cpu_seconds}

    return {"ours": [row(r) for r in ours], "seed": [row(r) for r in seeds],
            **{name: [row(r) for r in results] for name, results in peer_attempts.items()}}


def _times(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:.2f}×"


def _by_size(runs: dict[int, tuple[RunResult, RunResult]]) -> list[tuple[RunResult, RunResult]]:
    return [runs[size] for size in sorted(runs)]


def _run_row(name: str, result: RunResult, ours: RunResult | None) -> str:
    rate = "failed" if result.error else fmt(result.images_per_s)
    ratio = "—" if ours is None else _ratio(ours, result.images_per_s)
    cpu_ratio = "—"
    if ours is not None and result.cpu_ms_per_image and ours.cpu_ms_per_image:
        cpu_ratio = f"{result.cpu_ms_per_image / ours.cpu_ms_per_image:.2f}×"
    return (
        f"| {name} | {result.images:,} | {fmt(result.seconds)} | {rate} | {ratio} "
        f"| {fmt(result.cpu_ms_per_image, 2)} | {cpu_ratio} | {fmt(result.psnr, 2)} "
        f"| {fmt(result.peak_rss_bytes / GIB, 2)} | {fmt(result.output_bytes / 1e6)} |"
    )


def memory_growth(runs: dict[int, tuple[RunResult, RunResult]]) -> dict[str, float | None] | None:
    """Peak RSS at the largest size over the smallest: ~1 means memory does not grow with the corpus."""
    if len(runs) < 2:
        return None
    small, large = runs[min(runs)], runs[max(runs)]

    def growth(i: int) -> float | None:
        if small[i].error or large[i].error or not small[i].peak_rss_bytes:
            return None
        return large[i].peak_rss_bytes / small[i].peak_rss_bytes

    return {"from_images": min(runs), "to_images": max(runs), "seed": growth(0), "ours": growth(1)}


def _corpus_line(corpus: Corpus) -> str:
    how = "cached; built" if corpus.cached else "built"
    per_1000 = corpus.build_seconds / corpus.images * 1000
    return (
        f"Corpus: {corpus.images:,} JPEGs in {corpus.classes} classes, mean "
        f"{corpus.mean_width:.0f}×{corpus.mean_height:.0f} px, {corpus.total_bytes / corpus.images / 1e3:.0f} KB "
        f"({how} in {corpus.build_seconds:.1f} s with {corpus.build_processes} processes, "
        f"{per_1000:.1f} s per 1,000 images)"
    )


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument(
        "--images", type=int, nargs="+", action="extend", metavar="N",
        help=f"corpus size; give two (e.g. --images 20000 40000) to see memory growth (default {DEFAULT_IMAGES})",
    )
    parser.add_argument(
        "--sample", type=int, default=DEFAULT_SAMPLE,
        help=f"images timed for the per-core limit (b) (default {DEFAULT_SAMPLE})",
    )
    parser.add_argument(
        "--repeat", type=int, default=1,
        help="runs of (b), (a) and (c) taking turns; each row is the median (default 1)",
    )
    parser.add_argument(
        "--accelerated", type=pathlib.Path, metavar="DIR",
        help="also run (c′): (c) with the pillow-simd built by `bash .ci/build-pillow-simd DIR` "
             "(.ci/run builds one in .ci/pillow-simd)",
    )
    parser.add_argument(
        "--peers_python", type=pathlib.Path, default=peers.PEERS_PYTHON, metavar="PATH",
        help="the interpreter of the peers' virtualenv: img2dataset, MosaicML Streaming and LitData "
             f"(default .venv-peers/bin/python; made with: {PEERS_INSTALL})",
    )
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    if args.accelerated is not None and not (args.accelerated / "PIL").is_dir():
        parser.error(f"--accelerated {args.accelerated} holds no PIL package: build pillow-simd there with "
                     f"bash .ci/build-pillow-simd {args.accelerated}")
    # Not a default on the argument: action="extend" would add to it.
    args.images = sorted(set(args.images or [DEFAULT_IMAGES]))
    if args.images[0] < 1 or args.sample < 1 or args.repeat < 1:
        parser.error("--images, --sample and --repeat must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--gcs" in argv:
        from benchmarks import writer_gcs

        writer_gcs.main(argv)
        return
    if "--formats" in argv:
        from benchmarks import writer_formats

        writer_formats.main(argv)
        return
    if "--profile" in argv:
        from benchmarks import writer_profile

        writer_profile.main(argv)
        return
    if "--kernel" in argv:
        from benchmarks import writer_kernel

        writer_kernel.main(argv)
        return
    args = _parse_args(argv)
    recording = Recording("writer", argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    info = machine.machine_info()
    info["busy_percent_before"] = machine.busy_percent()
    corpora = {size: ensure_corpus(size, CACHE_DIR) for size in args.images}
    spec = ImageSpec(height=IMAGE_SIZE, width=IMAGE_SIZE, jpeg_quality=JPEG_QUALITY)
    limits: list[LimitResult] = []
    attempts: dict[int, tuple[list[RunResult], list[RunResult]]] = {size: ([], []) for size in corpora}
    img2dataset = peers.img2dataset_command(args.peers_python)
    recipes = {key: recipe for key, recipe in peers.RECIPES.items()
               if peers.importable(recipe.python(args.peers_python), recipe.package)}
    peer_attempts: dict[str, list[RunResult]] = {"handwritten": [], **({"img2dataset": []} if img2dataset else {}),
                                                 **{key: [] for key in recipes},
                                                 **({"accelerated": []} if args.accelerated else {}),
                                                 "pillow_path": []}
    originals: dict[str, dict[int, list[RunResult]]] = {name: {size: [] for size in corpora}
                                                         for name in ORIGINALS_RUNS}
    followed: dict[int, list[RunResult]] = {size: [] for size in corpora}
    load: list[float] = []
    # Host noise on shared machines moves every row by 10-20% from one minute to the
    # next: with --repeat, (b), (a) and (c) take turns and each row is the median.
    for _ in range(args.repeat):
        limits.append(measure_limit(corpora[max(corpora)].files(), args.sample, spec))
        log.info("limit: %.0f images/s per core, %.0f measured on %d cores",
                 limits[-1].per_core, limits[-1].parallel_images_per_s, limits[-1].cores)
        for size, corpus in corpora.items():
            workdir = pathlib.Path(tempfile.mkdtemp(prefix="run-", dir=CACHE_DIR))
            try:
                attempts[size][0].append(run_seed(corpus, workdir))
                ours = last = run_ours(corpus, workdir)
                if size == max(corpora):
                    if args.accelerated:
                        peer_attempts["accelerated"].append(
                            run_ours(corpus, workdir, accelerated=args.accelerated))
                    peer_attempts["pillow_path"].append(run_ours(corpus, workdir, pillow_path=True))
                    peer_attempts["handwritten"].append(run_handwritten(corpus, workdir))
                    if img2dataset:
                        peer_attempts["img2dataset"].append(run_img2dataset(img2dataset, corpus, workdir))
                    for key, recipe in recipes.items():
                        peer_attempts[key].append(run_recipe(recipe, args.peers_python, corpus, workdir))
                    # (c) again at the round's end: the two bracket the peers (``bracketed``).
                    last = run_ours(corpus, workdir)
                    ours = bracketed(ours, last)
                attempts[size][1].append(ours)
                followed[size].append(last)  # the (c) run the originals below follow
                load.append(os.getloadavg()[0])
                for name, flags in ORIGINALS_RUNS.items():
                    originals[name][size].append(run_ours(corpus, workdir, flags))
                    load.append(os.getloadavg()[0])
            finally:
                shutil.rmtree(workdir)
    # (b) and (b′) each take their own median: one round's slow parallel pass must
    # not ride along with the round whose serial pass is the median.
    limit = dataclasses.replace(sorted(limits, key=lambda r: r.per_core)[len(limits) // 2],
                                parallel_seconds=statistics.median(r.parallel_seconds for r in limits))
    ours_rounds = {size: list(ours) for size, (_, ours) in attempts.items()}
    runs = {size: (median_run(seeds), median_run(ours)) for size, (seeds, ours) in attempts.items()}
    peer_runs = {name: median_run(results) for name, results in peer_attempts.items()}

    print()
    for corpus in corpora.values():
        print(_corpus_line(corpus))
    print(f"Settings: {IMAGE_SIZE}×{IMAGE_SIZE}, JPEG quality {JPEG_QUALITY}, GZIP TFRecords "
          "(MDS and LitData's chunks for (j) and (k), uncompressed for (l)); "
          "wall time from command start to exit for (a), to manifest.json written for (c); page cache warm; "
          "peak RSS summed over the process tree. "
          "(a) stretches with nearest neighbour and encodes with optimize_size, as the notebook does; "
          "(b) and (c) centre-crop with bicubic.")
    print()
    print(table(limit, runs, peer_runs))
    if not img2dataset:
        print(f"\n(h) img2dataset is not installed: {PEERS_INSTALL} puts it beside the table")
    for key, recipe in peers.RECIPES.items():
        if key not in recipes:
            print(f"\n{WRITER_PEERS[key].split(' ', 1)[0]} {recipe.distribution} is not importable by "
                  f"{recipe.python(args.peers_python)}: {recipe.install_hint()} puts it beside the table")
    line = accelerated_line(runs[max(runs)], peer_runs)
    if line:
        print(f"\n{line}")
    rounds = per_round(ours_rounds[max(corpora)], attempts[max(corpora)][0], peer_attempts)
    print(f"\n{tables.writer_rounds(rounds)}")
    print()
    print("Originals beside (c), run after it in each round; ÷ (c) is the median of the rounds' ratios; "
          "CPU is the whole process tree's:")
    print()
    print(originals_table(ours_rounds, originals, followed))
    print()
    print(f"Machine: {machine.describe(info)}")
    print(f"Load average (1 min) after each (c) to (f) run: min {min(load):.1f}, median "
          f"{statistics.median(load):.1f}, max {max(load):.1f} on {os.cpu_count()} cores")
    if info["busy_percent_before"] > BUSY_WARNING_PERCENT:
        print(f"WARNING: the CPUs were {info['busy_percent_before']:.0f}% busy before the benchmark started; "
              "other work on the machine lowers and scatters these numbers.")
    growth = memory_growth(runs)
    if growth:
        print(
            f"Memory growth {growth['from_images']:,} → {growth['to_images']:,} images (peak RSS ratio): "
            f"(c) ours {fmt(growth['ours'], 2)}×, (a) seed {fmt(growth['seed'], 2)}×"
        )
    for size, (_, ours) in sorted(runs.items()):
        if ours.error is None:
            print(f"(c) at {size:,} images: manifest written at {ours.seconds:.1f} s, process exit at "
                  f"{ours.details['exit_seconds']:.1f} s (Beam stopping its worker processes)")
    for size, (seed, _) in sorted(runs.items()):
        if seed.error is None:
            inside = seed.details["write_seconds"]
            print(f"(a) at {size:,} images: {inside:.1f} s in the notebook's write loop "
                  f"({size / inside:,.0f} images/s), {seed.seconds - inside:.1f} s starting Python, "
                  "importing TensorFlow and listing files")
    if limit.failed:
        print(f"\n(b) process_image rejected {limit.failed} of {limit.sample} sample images "
              f"(timed all the same), e.g. {limit.first_error}")
    for name, result in peer_runs.items():
        if result.error:
            print(f"\n{WRITER_PEERS[name]} failed: {result.error}")
    for size, (seed, ours) in sorted(runs.items()):
        for name, result in (("(a) seed", seed), ("(c) ours", ours)):
            if result.error:
                print(f"\n{name} at {size:,} images failed: {result.error}")

    if args.json:
        peer_versions = {"img2dataset": peers.img2dataset_version(img2dataset) if img2dataset else None,
                         **{recipe.distribution: peers.distribution_version(recipe.python(args.peers_python),
                                                                            recipe.distribution)
                            for recipe in recipes.values()}}
        recording.write(args.json, {
            "busy_percent_before": info["busy_percent_before"],
            "img2dataset": peer_versions["img2dataset"],
            "peer_versions": peer_versions,
            "settings": {"image_size": IMAGE_SIZE, "jpeg_quality": JPEG_QUALITY},
            "corpora": [corpus.summary() for corpus in corpora.values()],
            "limit": limit.to_json(),
            "runs": [
                {"images": size, "seed": seed.to_json(), "ours": ours.to_json()}
                for size, (seed, ours) in sorted(runs.items())
            ],
            "peers": {name: result.to_json() for name, result in peer_runs.items()},
            "rounds": rounds,
            "memory_growth": growth,
            "originals": [
                {"name": name, "images": size, "runs": [r.to_json() for r in results],
                 "ratio_to_ours": paired_ratio(ours_rounds[size], results),
                 "ratio_to_ours_per_cpu": paired_ratio(ours_rounds[size], results, per_cpu=True)}
                for name, by_size in originals.items() for size, results in sorted(by_size.items())
            ],
            "load_average": load,
        }, other_versions={name: version for name, version in peer_versions.items() if version})


if __name__ == "__main__":
    main()
