"""The image-tree-to-TFRecords job: plan in the launcher, then one Beam pipeline.

Data flows one way: listing (here, before the pipeline) -> imaging -> examples ->
sinks -> errors, labels and manifest (last).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple

import apache_beam as beam
from apache_beam.io.textio import ReadFromText
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions, TestOptions

from beam_prep import layout, manifest, progress, sharding
from beam_prep.beam_compat import batch_fn_api_runner
from beam_prep.claim import CLAIM_NAME, claim_output, new_run_id
from beam_prep.errors import DatasetError, StorageError
from beam_prep.listing import (
    UNKNOWN_LABEL,
    FileEntry,
    Listing,
    list_tree,
    order_key,
    read_labels_file,
)
from beam_prep.options import PrepareConfig
from beam_prep.records import unknown_label_report
from beam_prep.storage import join, write_lines
from beam_prep.transforms import NAMESPACE, ParseEntryFn, WriteShardsShuffle, WriteShardsStreaming

if TYPE_CHECKING:
    from apache_beam.runners.runner import PipelineRunner

_LOG = logging.getLogger(__name__)
LOCAL_RUNNERS = frozenset({None, "DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner",
                           "PrismRunner", "FnApiRunner"})


@dataclasses.dataclass(frozen=True)
class RunResult:
    """A finished run; a dry run (``--dry_run``) has no manifest but the job it built."""

    manifest: dict[str, Any] | None
    seconds: float
    counters: dict[str, int]
    job: Any = None
    phases: progress.Phases | None = None
    """Start-up and processing apart; local runs only (their workers report progress)."""

    @property
    def images_per_second(self) -> float:
        return self.manifest["counts"]["listed"] / max(self.seconds, 1e-9)


class _Prepared(NamedTuple):
    """A built job: its run id, the pipeline, and what its progress is counted against."""

    run_id: str
    pipeline: beam.Pipeline
    listed: int
    unknown_labels: int  # images that fail without a worker reading them


def _runner_name(options: PipelineOptions) -> str | None:
    runner = options.view_as(StandardOptions).runner
    return runner if runner is None or isinstance(runner, str) else type(runner).__name__


def resolve_sink(config: PrepareConfig, options: PipelineOptions) -> str:
    if config.sink != "auto":
        return config.sink
    return "streaming" if _runner_name(options) in LOCAL_RUNNERS else "shuffle"


def local_workers(options: PipelineOptions) -> int:
    """Workers the local runner runs at once (the shard count is rounded up to a multiple)."""
    if _runner_name(options) not in LOCAL_RUNNERS:
        return 1
    direct = options.view_as(DirectOptions)
    if direct.direct_running_mode == "in_memory":
        return 1
    return direct.direct_num_workers or os.cpu_count() or 1


def local_runner(options: PipelineOptions) -> PipelineRunner | None:
    """Beam's batch FnApiRunner, built as DirectRunner builds it, for DirectRunner jobs.

    DirectRunner first tries the Prism runner when it can download it, and Prism
    runs Python transforms in one process: a user would silently lose every core
    but one, and a machine without internet waits for the download to fail. The
    FnApiRunner honours ``--direct_running_mode`` and ``--direct_num_workers``.
    Returns None where the user chose another runner.
    """
    if _runner_name(options) not in (None, "DirectRunner"):
        return None
    return batch_fn_api_runner(options)


def plan(config: PrepareConfig, options: PipelineOptions, run_id: str = "") -> tuple[Listing, manifest.Plan]:
    """Lists the tree and decides shard counts; raises before any work if something is wrong."""
    labels = read_labels_file(config.labels_file) if config.labels_file else None
    listing = list_tree(config.input, validation_percent=config.validation_percent, labels=labels,
                        label_offset=config.label_offset)
    sink = resolve_sink(config, options)
    multiple = local_workers(options) if sink == "streaming" else 1
    mean_bytes = sum(e.size for e in listing.entries) / len(listing.entries)
    record_bytes = sharding.estimated_record_bytes(config.spec, mean_bytes)
    num_shards = {
        split: config.num_shards or sharding.choose_num_shards(
            n, record_bytes, config.target_shard_mb, multiple)
        for split, n in listing.split_counts().items()
    }
    num_shards = {split: num_shards[split] for split in listing.splits}
    return listing, manifest.Plan(labels=listing.labels, num_shards=num_shards,
                                  listed=len(listing.entries), skipped=len(listing.skipped),
                                  sink=sink, skipped_by_reason=listing.skipped_by_reason(), run_id=run_id)


def write_work_files(listing: Listing, run_plan: manifest.Plan, work: str) -> None:
    """The listings the sinks read, in the run's folder ``work``: one per shard (streaming)
    or one in all (shuffle).

    Files under a label missing from --labels_file go to their own listing, to be
    reported, never dropped.
    """
    known = [e for e in listing.entries if e.label_id != UNKNOWN_LABEL]
    write_lines(join(work, layout.UNKNOWN_LABELS), (e.to_json() for e in listing.unknown_label_entries))
    if run_plan.sink == "shuffle":
        write_lines(join(work, layout.LISTING), (e.to_json() for e in known))
        return
    by_split: dict[str, list[FileEntry]] = collections.defaultdict(list)
    for e in known:
        by_split[e.split].append(e)
    for split, count in run_plan.num_shards.items():
        # Dealt in key order: shard sizes differ by one record at most, so no worker
        # finishes its shards long before another (hash % count left 5% between shards).
        ordered = sorted(by_split[split], key=lambda e: order_key(e.relpath))
        for index in range(count):
            write_lines(join(work, layout.shard_listing_name(split, index)),
                        (e.to_json() for e in ordered[index::count]))


def build(p: beam.Pipeline, config: PrepareConfig, run_plan: manifest.Plan,
          progress_folder: str | None = None) -> None:
    """The job's transforms; with ``progress_folder`` (local runners), workers report there."""
    sink = WriteShardsStreaming if run_plan.sink == "streaming" else WriteShardsShuffle
    work = layout.run_folder(config.output, run_plan.run_id)
    written = p | "WriteShards" >> sink(config.spec, config.reads, work, config.compression, run_plan.num_shards,
                                        progress_folder)
    label_failures = (
        p
        | "ReadUnknownLabels" >> ReadFromText(join(work, layout.UNKNOWN_LABELS), validate=False)
        | "ParseUnknownLabels" >> beam.ParDo(ParseEntryFn())
        | "UnknownLabels" >> beam.Map(unknown_label_report))
    failures = (written.failures, label_failures) | "AllFailures" >> beam.Flatten()
    _ = (p
         | "Once" >> beam.Create([None])
         | "Finalize" >> beam.Map(
             lambda _, shard_rows, count_rows, failure_rows: manifest.finalize(
                 config, run_plan, shard_rows, count_rows, failure_rows),
             beam.pvalue.AsList(written.shards), beam.pvalue.AsList(written.class_counts),
             beam.pvalue.AsList(failures)))


def run(config: PrepareConfig, options: PipelineOptions,
        on_progress: Callable[[progress.Progress], None] | None = None,
        progress_interval: float = 0.5) -> RunResult:
    """Claims the output folder, plans, runs the pipeline to completion and returns the manifest it wrote.

    On a local runner, ``on_progress`` is called every ``progress_interval``
    seconds while the job runs, from another thread, with the images the workers
    have finished (``progress.Progress``); elsewhere it is never called (the
    runner's counters carry the same numbers).

    Raises:
      OutputBusy: another run holds the output folder.
      OptionsError, StorageError: before any work starts.
      DatasetError: if the finished dataset's counts do not add up, or another
        run took the output folder over while this one ran.
    """
    start = time.perf_counter()
    launched = time.time()  # wall time: the workers' reports are in it
    if options.view_as(TestOptions).dry_run:
        # The runner builds the whole job and stops before submitting it: nothing is
        # written, so no claim is needed.
        p = _prepare(config, options, new_run_id(), write=False).pipeline
        result = p.run()
        return RunResult(None, time.perf_counter() - start, {}, getattr(result, "job", None))
    local = _runner_name(options) in LOCAL_RUNNERS
    with claim_output(config.output, new_run_id()) as claim, _progress_folder(local) as folder:
        job = _prepare(config, options, claim.run_id, write=True, progress_folder=folder)
        run_id = job.run_id
        try:
            with _watching(folder, job, on_progress, progress_interval):
                result = job.pipeline.run()
                result.wait_until_finish()
        except BaseException:
            # A local job ends with this process; a remote one (Dataflow) may still be
            # running after its launcher stops waiting, so its files are left to it.
            if local:
                _remove_quietly(config.output, run_id)
            raise
        if claim.lost:
            raise DatasetError(f"another run took {config.output} over while run {run_id} ran, so the "
                               "folder may hold both runs' files: run again with --overwrite")
        phases = None
        if folder is not None:
            phases = progress.phases(progress.read_progress(folder, job.listed, job.unknown_labels), launched)
    counters: dict[str, int] = {}
    for c in result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]:
        counters[c.key.metric.name] = counters.get(c.key.metric.name, 0) + (c.committed or 0)
    return RunResult(manifest.read(config.output), time.perf_counter() - start, counters, phases=phases)


@contextlib.contextmanager
def _progress_folder(local: bool) -> Iterator[str | None]:
    """Where a local job's workers report progress; None for a remote job, whose workers cannot reach it."""
    if not local:
        yield None
        return
    with progress.progress_folder() as folder:
        yield folder


@contextlib.contextmanager
def _watching(folder: str | None, job: _Prepared,
              on_progress: Callable[[progress.Progress], None] | None, interval: float) -> Iterator[None]:
    if folder is None or on_progress is None:
        yield
        return
    with progress.Watcher(folder, job.listed, on_progress, job.unknown_labels, interval):
        yield


def _prepare(config: PrepareConfig, options: PipelineOptions, run_id: str,
             write: bool, progress_folder: str | None = None) -> _Prepared:
    """Checks the output folder, lists and plans; with ``write``, clears unfinished runs and
    writes this run's listings. Returns the pipeline, built, and what it will count."""
    leftovers = layout.unfinished_runs(config.output, CLAIM_NAME)
    layout.check_output(config.output, config.overwrite, leftovers)
    listing, run_plan = plan(config, options, run_id)
    if write:
        layout.remove_unfinished_runs(config.output, leftovers)
        write_work_files(listing, run_plan, layout.run_folder(config.output, run_id))
    unknown_labels = len(listing.unknown_label_entries)
    del listing  # the workers read the listings from files: keep no copy here
    _LOG.info("run %s: listed %d images (%d labels, splits %s), skipped %d; sink %s, shards %s",
              run_id, run_plan.listed, len(run_plan.labels), ", ".join(run_plan.num_shards),
              run_plan.skipped, run_plan.sink, run_plan.num_shards)
    p = beam.Pipeline(runner=local_runner(options), options=options)
    build(p, config, run_plan, progress_folder)
    return _Prepared(run_id, p, run_plan.listed, unknown_labels)


def _remove_quietly(output: str, run_id: str) -> None:
    """A failed run's files go with it; if they cannot, the next run reports them as unfinished."""
    try:
        layout.remove_run_folder(output, run_id)
    except StorageError as e:
        _LOG.warning("could not remove the failed run's files: %s", e)
