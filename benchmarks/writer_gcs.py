"""The writer benchmark's gs:// mode: the same corpus from local disk and from gs:// at added latencies.

``python -m benchmarks.bench_writer --gcs`` loads the cached corpus into the
test GCS server (``tests/gcs_harness/server.py``: gcp-storage-emulator behind the
gateway that every client goes through) and runs ``python -m
pipelines.prepare_images`` on it, as a user would, with the output on local
disk:

  * from local disk, then from gs:// with 0, 30 and 100 ms added to every
    request (a bucket seen from a VM in its region answers a small read in
    roughly 20-50 ms; from a laptop, 100 ms and more);
  * with both sinks: ``streaming`` (the local default) and ``shuffle`` (the
    Dataflow path; on the local runner each worker process runs one bundle at a
    time, as a Dataflow Python worker gives each vCPU one thread).

Each row reports images/s from command start to ``manifest.json`` written, its
ratio to the same sink at 0 ms and from local disk, the peak memory of the
pipeline's process tree, and the CPU the storage server spent per image
(emulator process plus the gateway's threads in this process): on a 2-core
machine that CPU is taken from the pipeline, which no real GCS would do.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import pathlib
import shutil
import time
from collections.abc import Sequence

import psutil

from benchmarks import CACHE_DIR, IMAGE_SIZE, JPEG_QUALITY, REPO_ROOT, machine
from benchmarks.corpus import Corpus, ensure_corpus
from benchmarks.gcs_server import UPLOAD_THREADS, GcsServer, emulator_cpu_s, scratch_server
from benchmarks.measure import check_manifest, run_measured
from benchmarks.report import tables
from benchmarks.results import Recording
from pipelines import prepare_images

log = logging.getLogger(__name__)

LATENCIES_MS = (0, 30, 100)
SINKS = ("streaming", "shuffle")
GIB = 2**30


@dataclasses.dataclass
class GcsRun:
    sink: str
    source: str  # "local" or "gs"
    latency_ms: int
    images: int
    concurrency: int | None = None  # --read_concurrency, None for the default
    seconds: float = 0.0
    peak_rss_bytes: int = 0
    server_cpu_s: float = 0.0
    command_cpu_s: float = 0.0  # the command's whole process tree's, the server's apart
    error: str | None = None
    all_seconds: list[float] = dataclasses.field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, int, int, int]:
        return self.sink, self.source, self.latency_ms, self.images, self.concurrency or 0

    @property
    def images_per_s(self) -> float | None:
        return None if self.error else self.images / self.seconds

    @property
    def server_ms_per_image(self) -> float | None:
        return None if self.source == "local" else self.server_cpu_s / self.images * 1e3

    @property
    def command_ms_per_image(self) -> float | None:
        return None if self.error or not self.command_cpu_s else self.command_cpu_s / self.images * 1e3

    def to_json(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "images_per_s": self.images_per_s,
                "server_ms_per_image": self.server_ms_per_image, "command_ms_per_image": self.command_ms_per_image}


def upload(server: GcsServer, corpora: Sequence[Corpus]) -> dict[int, str]:
    """Loads each corpus under its own prefix; returns the gs:// roots by size."""
    bucket = server.new_bucket()
    roots = {}
    for corpus in corpora:
        start = time.perf_counter()
        bucket.upload_tree(corpus.root, f"corpus-{corpus.images}", threads=UPLOAD_THREADS)
        log.info("uploaded %d images in %.0f s", corpus.images, time.perf_counter() - start)
        roots[corpus.images] = bucket.url(f"corpus-{corpus.images}")
    return roots


def run_one(server: GcsServer, run: GcsRun, source: str, workdir: pathlib.Path) -> GcsRun:
    out = workdir / "out"
    server.gateway.set_latency(run.latency_ms / 1e3)
    here = psutil.Process()  # the gateway's threads
    cpu_before = emulator_cpu_s(server) + sum(here.cpu_times()[:2])
    try:
        measured = run_measured(
            prepare_images.command(
                "--input", source, "--output", str(out), "--image_size", str(IMAGE_SIZE),
                "--jpeg_quality", str(JPEG_QUALITY), "--sink", run.sink, "--overwrite",
                *(["--read_concurrency", str(run.concurrency)] if run.concurrency is not None else [])),
            cwd=REPO_ROOT, env=server.env())
    finally:
        server.gateway.set_latency(0.0)
    server_cpu = emulator_cpu_s(server) + sum(here.cpu_times()[:2]) - cpu_before
    result = dataclasses.replace(run, peak_rss_bytes=measured.peak_rss_bytes, server_cpu_s=server_cpu,
                                 command_cpu_s=measured.cpu_seconds)
    if measured.returncode != 0:
        result.error = f"exit status {measured.returncode}; stderr ends:\n{measured.stderr_tail}"
        return result
    result.error = check_manifest(out / "manifest.json", run.images)
    if result.error is None:
        result.seconds = measured.seconds_until_written(out / "manifest.json")
    shutil.rmtree(out)
    return result


def median(runs: list[GcsRun]) -> GcsRun:
    ok = sorted((r for r in runs if r.error is None), key=lambda r: r.seconds)
    if not ok:
        return runs[0]
    chosen = ok[len(ok) // 2]
    chosen.all_seconds = [round(r.seconds, 2) for r in ok]
    return chosen


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gcs", action="store_true", help="this mode (as bench_writer passes it)")
    parser.add_argument("--images", type=int, nargs="+", default=[20000], metavar="N",
                        help="corpus sizes for the streaming sink (default 20000)")
    parser.add_argument("--shuffle_images", type=int, default=5000, metavar="N",
                        help="corpus size for the shuffle sink, which holds every record in the local "
                             "runner's memory (default 5000; 0 skips it)")
    parser.add_argument("--latencies", type=int, nargs="+", default=list(LATENCIES_MS), metavar="MS")
    parser.add_argument("--sweep", type=int, nargs="+", default=[], metavar="N",
                        help="also run the streaming sink from gs:// at the largest latency with each "
                             "--read_concurrency N, at the first --images size")
    parser.add_argument("--repeat", type=int, default=1, help="rounds, taking turns; rows are medians")
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here as JSON")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    recording = Recording("writer-gcs", argv, module="benchmarks.bench_writer")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    info = machine.machine_info()
    plan = [(sink, size) for size in args.images for sink in ("streaming",)]
    if args.shuffle_images:
        plan.append(("shuffle", args.shuffle_images))
    sizes = sorted({size for _, size in plan})
    corpora = {size: ensure_corpus(size, CACHE_DIR) for size in sizes}
    attempts: dict[tuple, list[GcsRun]] = {}
    with scratch_server("gcs-") as (server, workdir):
        roots = upload(server, list(corpora.values()))
        for _ in range(args.repeat):
            for sink, size in plan:
                runs = [GcsRun(sink, "local", 0, size)]
                runs += [GcsRun(sink, "gs", ms, size) for ms in args.latencies]
                if sink == "streaming" and size == args.images[0]:
                    runs += [GcsRun(sink, "gs", max(args.latencies), size, n) for n in args.sweep]
                for run in runs:
                    source = str(corpora[size].root) if run.source == "local" else roots[size]
                    result = run_one(server, run, source, workdir)
                    log.info("%s: %s images/s%s", run.key, result.images_per_s,
                             f" ({result.error})" if result.error else "")
                    attempts.setdefault(run.key, []).append(result)
    results = {key: median(runs) for key, runs in attempts.items()}
    print()
    for corpus in corpora.values():
        print(f"Corpus: {corpus.images:,} JPEGs in {corpus.classes} classes, "
              f"{corpus.total_bytes / corpus.images / 1e3:.0f} KB on average")
    print(f"Settings: {IMAGE_SIZE}×{IMAGE_SIZE}, JPEG q{JPEG_QUALITY}, GZIP, output on local disk, default "
          "read options; wall time from command start to manifest.json written; medians of "
          f"{args.repeat} run(s) taking turns.")
    print()
    print(tables.writer_gcs({"runs": [r.to_json() for r in results.values()]}))
    print()
    print(f"Machine: {machine.describe(info)}")
    for r in results.values():
        if r.error:
            print(f"\n{r.key} failed: {r.error}")
    if args.json:
        recording.write(args.json, {"repeat": args.repeat, "runs": [r.to_json() for r in results.values()]})


if __name__ == "__main__":
    main()
