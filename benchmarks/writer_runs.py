"""One timed run of beam-prep's command, and the figures taken of runs: what the writer benchmark's modes share.

``bench_writer`` (the default mode) and ``writer_formats`` (``--formats``) both time the
command a user types (``run_ours``) and report medians and paired ratios of its results.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import statistics
from collections.abc import Sequence

from beam_prep.write.images.jpeg_path import VARIABLE as JPEG_PATH_VARIABLE
from benchmarks import IMAGE_SIZE, JPEG_QUALITY, REPO_ROOT, peers
from benchmarks.corpus import Corpus
from benchmarks.measure import Measured, check_manifest, directory_bytes, run_measured
from pipelines import prepare_images

# (c), the default command's image options, and the originals commands (d) and (e).
DEFAULT_FLAGS = ("--image_size", str(IMAGE_SIZE), "--jpeg_quality", str(JPEG_QUALITY))


@dataclasses.dataclass
class RunResult:
    """One timed command over a whole corpus; ``error`` says why it has no throughput."""

    images: int
    seconds: float
    peak_rss_bytes: int
    output_bytes: int
    error: str | None = None
    details: dict[str, object] = dataclasses.field(default_factory=dict)
    cpu_seconds: float = 0.0  # the whole process tree's
    psnr: float | None = None  # of a sample of its records against the reference crop

    @property
    def images_per_s(self) -> float | None:
        return None if self.error else self.images / self.seconds

    @property
    def cpu_ms_per_image(self) -> float | None:
        return None if self.error else self.cpu_seconds / self.images * 1e3

    @property
    def images_per_cpu_s(self) -> float | None:
        return None if self.error or not self.cpu_seconds else self.images / self.cpu_seconds

    def to_json(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "images_per_s": self.images_per_s}


def run_ours(corpus: Corpus, workdir: pathlib.Path, flags: Sequence[str] = DEFAULT_FLAGS,
             accelerated: pathlib.Path | None = None, pillow_path: bool = False) -> RunResult:
    """(c), or (d) to (f) with their ``flags``: beam-prep's pipeline, exactly the command a user types;
    (c′) with pillow-simd from ``accelerated`` first on the path of the command and its workers; (c″)
    with every JPEG down Pillow's path (``pillow_path``: ``BEAM_PREP_JPEG_PATH=pillow``). The manifest
    must say the JPEG fast path made the JPEGs in (c), and none in (c″)."""
    out = workdir / "ours"
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    env.pop(JPEG_PATH_VARIABLE, None)
    if accelerated is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(accelerated.resolve()), os.environ.get("PYTHONPATH")]))
    if pillow_path:
        env[JPEG_PATH_VARIABLE] = "pillow"
    measured = run_measured(
        prepare_images.command("--input", str(corpus.root), "--output", str(out), *flags, "--overwrite"),
        cwd=REPO_ROOT, env=env,
    )
    result = measured_result(corpus, measured, out)
    if result.error is None:
        result.error = check_manifest(out / "manifest.json", corpus.images)
    if result.error is None:
        manifest = json.loads((out / "manifest.json").read_text())
        library = manifest.get("imaging_library")
        result.details["imaging_library"] = library
        if (accelerated is not None) != (str(library).startswith("pillow-simd")):
            result.error = f"the run's imaging library was {library}"
        native = (manifest.get("jpeg_path") or {}).get("native", 0)
        result.details["jpeg_path"] = manifest.get("jpeg_path")
        if accelerated is None and tuple(flags) == tuple(DEFAULT_FLAGS) and (native > 0) == pillow_path:
            result.error = f"the run's JPEG fast path made {native} records (the manifest's jpeg_path)"
        originals = manifest.get("originals")
        if originals is not None:
            result.details["originals"] = originals
        # Issue 5 times (c) from command start to the manifest written (the dataset is
        # complete); the process exits about a second later, once Beam stops its workers.
        result.details["exit_seconds"] = measured.seconds
        result.seconds = measured.seconds_until_written(out / "manifest.json")
        if tuple(flags) == tuple(DEFAULT_FLAGS):  # the originals are not 224x224 crops
            result.psnr = peers.record_quality(sorted(out.glob("train-*")), corpus, peers.ours_record)
    return result


def bracketed(first: RunResult, last: RunResult) -> RunResult:
    """A round's (c) from two runs of it, at the round's start and end: their mean seconds and CPU seconds,
    the larger peak RSS, and ``first``'s other figures. This host's speed drifts by tens of percent
    from one minute to the next, and a round runs for minutes: a run at each end moves with the peers
    between them, where one run at the start would stand for the round's first minutes alone. An
    error in either is the result's."""
    if first.error or last.error:
        return first if first.error else last
    return dataclasses.replace(
        first, seconds=(first.seconds + last.seconds) / 2, cpu_seconds=(first.cpu_seconds + last.cpu_seconds) / 2,
        peak_rss_bytes=max(first.peak_rss_bytes, last.peak_rss_bytes),
        details={**first.details, "bracket_seconds": [round(first.seconds, 2), round(last.seconds, 2)],
                 "bracket_cpu_seconds": [round(first.cpu_seconds, 2), round(last.cpu_seconds, 2)]})


def measured_result(corpus: Corpus, measured: Measured, out: pathlib.Path) -> RunResult:
    error = None
    if measured.returncode != 0:
        error = f"exit status {measured.returncode}; stderr ends:\n{measured.stderr_tail}"
    output_bytes = directory_bytes(out) if out.exists() else 0
    return RunResult(corpus.images, measured.seconds, measured.peak_rss_bytes, output_bytes, error,
                     cpu_seconds=measured.cpu_seconds)


def fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def median_run(results: list[RunResult]) -> RunResult:
    """The run with the median time (the first failure if none succeeded); all times in its details."""
    ok = sorted((r for r in results if r.error is None), key=lambda r: r.seconds)
    if not ok:
        return results[0]
    chosen = ok[len(ok) // 2]
    chosen.details["all_seconds"] = [round(r.seconds, 2) for r in ok]
    return chosen


def paired_ratio(ours: list[RunResult], others: list[RunResult], per_cpu: bool = False) -> float | None:
    """The median over rounds of ``other ÷ ours`` (images/s, or images per CPU-second), each round's
    runs taken minutes apart: on a shared machine that holds where the medians of each drift."""
    ratios = []
    for mine, other in zip(ours, others):
        a, b = ((mine.images_per_cpu_s, other.images_per_cpu_s) if per_cpu
                else (mine.images_per_s, other.images_per_s))
        if a and b:
            ratios.append(b / a)
    return statistics.median(ratios) if ratios else None
