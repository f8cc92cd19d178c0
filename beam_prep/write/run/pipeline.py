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
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import apache_beam as beam
from apache_beam.io.textio import ReadFromText
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions, TestOptions

from beam_prep import wording
from beam_prep.doc_pages import doc_page
from beam_prep.errors import (
    BeamPrepWarning,
    CrossSplitLeakage,
    DatasetError,
    OptionsError,
    RunInterrupted,
    StorageError,
    TooManyFailures,
)
from beam_prep.io.storage import join, read_lines
from beam_prep.write.finish import duplicates, manifest, publication, publish, shrunk_splits
from beam_prep.write.grow import append, label_ids
from beam_prep.write.images import flat, resample
from beam_prep.write.images.examples import unknown_label_report
from beam_prep.write.images.flat import FlatImages
from beam_prep.write.journal import progress, resume
from beam_prep.write.plan import failure_budget, sharding
from beam_prep.write.plan.config import PrepareConfig
from beam_prep.write.plan.listing import Listing, list_tree, read_labels_file
from beam_prep.write.plan.planned import PlannedRun
from beam_prep.write.plan.run_plan import RunPlan
from beam_prep.write.plan.runners import LOCAL_RUNNERS
from beam_prep.write.plan.work_files import write_work_files
from beam_prep.write.run import interrupt, warm_pool, worker_errors
from beam_prep.write.run.beam_compat import batch_fn_api_runner, views_once
from beam_prep.write.run.claim import CLAIM_NAME, claim_output, new_run_id
from beam_prep.write.run.worker_requirements import add_format_requirement
from beam_prep.write.shared import layout
from beam_prep.write.shared.entry import VALIDATION_SPLIT, FileEntry
from beam_prep.write.sinks.shard_sinks import WriteShardsShuffle, WriteShardsStreaming
from beam_prep.write.sinks.steps import ParseEntryFn
from beam_prep.write.sinks.tally import NAMESPACE

if TYPE_CHECKING:
    from apache_beam.runners.runner import PipelineRunner

_LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RunResult:
    """A finished run; a dry run (``--dry_run``) has no manifest, but its plan and, for a
    remote runner, the job it built."""

    manifest: dict[str, Any] | None
    seconds: float
    counters: dict[str, int]
    job: Any = None
    phases: progress.Phases | None = None
    """Start-up and processing apart; local runs only (their workers report progress)."""
    plan: RunPlan | None = None
    kept: int = 0
    """Images in the shards a resumed run kept from the run it continues: none of its work."""
    planned: PlannedRun | None = None
    """A dry run's plan, as the caller reads and prints it."""

    @property
    def images_per_second(self) -> float:
        """The images this run processed (a resumed run's kept ones left out) over its whole time."""
        return (self.manifest["counts"]["listed"] - self.kept) / max(self.seconds, 1e-9)


class NothingToAdd(Exception):
    """An append found nothing the dataset lacks: no new version is made."""

    def __init__(self, additions: append.Additions) -> None:
        super().__init__(append.describe(0, additions.counts(), False))
        self.additions = additions


class _Prepared(NamedTuple):
    """A built job: its run id, the pipeline (None where every shard is kept: nothing to run), and what
    its progress is counted against."""

    run_id: str
    pipeline: beam.Pipeline | None
    plan: RunPlan
    resumable: bool  # the run's folder records what it finishes (streaming sink, local runner)
    kept: tuple[resume.ShardRecord, ...] = ()  # shards a resumed run keeps from the run it continues
    options: dict[str, Any] | None = None  # what a rerun repeats to be the same command (resume.record_options)

    @property
    def all_kept(self) -> bool:
        """Whether a resumed run keeps every shard: its job would write nothing."""
        return bool(self.kept) and len(self.kept) == sum(self.plan.num_shards.values())

    def carried(self) -> progress.Carried:
        """The images finished before the workers start: the kept shards', and those under
        labels missing from --labels_file (failures)."""
        unknown = self.plan.unknown_labels
        return progress.Carried(done=unknown + resume.images_in(self.kept),
                                failed=unknown + sum(len(r.failures) for r in self.kept))


def _runner_name(options: PipelineOptions) -> str | None:
    runner = options.view_as(StandardOptions).runner
    return runner if runner is None or isinstance(runner, str) else type(runner).__name__


def resolve_sink(config: PrepareConfig, options: PipelineOptions) -> str:
    if config.sink != "auto":
        return config.sink
    return "streaming" if _runner_name(options) in LOCAL_RUNNERS else "shuffle"


def _resumable(sink: str, options: PipelineOptions) -> bool:
    """Whether a run keeps what it finished for the same command to resume: the streaming
    sink's shards, on a local runner, whose launcher sees its run folder to the end."""
    return sink == "streaming" and _runner_name(options) in LOCAL_RUNNERS


def local_workers(options: PipelineOptions) -> int:
    """Workers the local runner may run at once (the shard count is rounded up to a multiple):
    ``--direct_num_workers``, or one a core where it is 0 (Beam's meaning, and our default)."""
    if _runner_name(options) not in LOCAL_RUNNERS:
        return 1
    direct = options.view_as(DirectOptions)
    if direct.direct_running_mode == "in_memory":
        return 1
    return direct.direct_num_workers or os.cpu_count() or 1


def _fit_workers(options: PipelineOptions, images: int) -> None:
    """Where the worker count is 0 (one a core: the default), a local job starts one worker per
    ``warm_pool.IMAGES_PER_WORKER`` images it has to convert, up to one a core: a sample of 40 images
    then starts one worker, not one a core, and finishes sooner on less CPU. The shards are
    planned for every core all the same, so the output does not depend on it."""
    direct = options.view_as(DirectOptions)
    if _runner_name(options) not in LOCAL_RUNNERS or direct.direct_running_mode == "in_memory" \
            or direct.direct_num_workers != 0:
        return
    direct.direct_num_workers = warm_pool.workers_for(images, local_workers(options))


def local_runner(options: PipelineOptions, pool: warm_pool.WarmPool | None = None) -> PipelineRunner | None:
    """Beam's batch FnApiRunner, built as DirectRunner builds it, for DirectRunner jobs.

    DirectRunner first tries the Prism runner when it can download it, and Prism
    runs Python transforms in one process: a user would silently lose every core
    but one, and a machine without internet waits for the download to fail. The
    FnApiRunner honours ``--direct_running_mode`` and ``--direct_num_workers``;
    with ``pool``, its worker processes are the pool's, started while the run listed.
    Returns None where the user chose another runner.
    """
    if _runner_name(options) not in (None, "DirectRunner"):
        return None
    return batch_fn_api_runner(options, pool.relay_command() if pool is not None else None)


@contextlib.contextmanager
def _warm_workers(options: PipelineOptions) -> Iterator[warm_pool.WarmPool | None]:
    """The pool of a multi-process local run's workers (``warm_pool``): the command's, started
    before it imported Beam, or a new one, filled once the run has listed (a run of the library
    refused by its checks or its listing starts no process)."""
    direct = options.view_as(DirectOptions)
    if _runner_name(options) not in (None, "DirectRunner") or direct.direct_running_mode != "multi_processing":
        warm_pool.close_early()  # the command guessed from its arguments, and Beam's options say otherwise
        yield None
        return
    with warm_pool.warm_pool() as pool:
        yield pool


def plan_run(config: PrepareConfig, options: PipelineOptions, run_id: str = "",
             labels: list[str] | None = None) -> tuple[Listing, RunPlan]:
    """Lists the tree and decides shard counts; raises before any work if something is wrong.

    ``labels``: --labels_file's lines, read by the caller. Close the listing when done with it. An
    append (``config.append``) plans the files the dataset does not hold (``append.narrow``), its cap
    applied to them (``--max_per_class`` counts the records the dataset holds).

    Raises:
      NothingToAdd: an append whose listing holds nothing the dataset lacks.
    """
    listing = list_tree(config.input, validation_percent=config.validation_percent, labels=labels,
                        label_offset=config.label_offset, recursive=config.recursive, metadata=config.metadata,
                        stratify=config.stratify, max_per_class=None if config.append else config.max_per_class)
    appended = None
    if config.append:
        try:
            existing = append.read_existing(config.output, listing.folder, config.input)
            whole = listing
            listing, additions = append.narrow(config, whole, existing)
        except BaseException:
            listing.close()
            raise
        appended = additions.to_json()
        if not listing.listed:
            whole.close()
            raise NothingToAdd(additions)
    sink = resolve_sink(config, options)
    multiple = local_workers(options) if sink == "streaming" else 1
    record_bytes = sharding.estimated_record_bytes(config.spec, listing.total_bytes / listing.listed)
    split_counts = listing.split_counts()
    max_images = (sharding.max_shard_images(sum(split_counts.values()), multiple)
                  if _resumable(sink, options) else None)
    num_shards = {  # an explicit --num_shards too: no split gets a shard it cannot fill
        split: min(config.num_shards, split_counts[split]) if config.num_shards else sharding.choose_num_shards(
            split_counts[split], record_bytes, config.target_shard_mb, multiple, max_images)
        for split in listing.splits
    }
    if config.overwrite:
        label_ids.warn_if_ids_move(config.output, listing.labels, config.label_offset)
    if config.append:
        append.check_new_names(config.output, existing.info, num_shards, config.version)
    if 0 < config.validation_percent < 1:
        _warn_small_percent(config.validation_percent, split_counts)
    return listing, RunPlan(labels=listing.labels, num_shards=num_shards, listed=listing.listed,
                                  skipped=listing.skipped_count, sink=sink,
                                  skipped_by_reason=listing.skipped_by_reason(), run_id=run_id,
                                  split_counts={split: split_counts[split] for split in listing.splits},
                                  unknown_labels=listing.unknown_labels, multi_label=listing.multi_label,
                                  extra_features=listing.extra_features, appended=appended)


def _warn_small_percent(percent: float, split_counts: dict[str, int]) -> None:
    """Below 1, --validation_percent may be a fraction typed as a percent (0.1 for a tenth):
    allowed (0.5% of a million images is 5,000), but said, with what it gives."""
    total = sum(split_counts.values())
    warnings.warn(BeamPrepWarning(
        f"--validation_percent {percent:g} puts {split_counts.get(VALIDATION_SPLIT, 0):,} of "
        f"{wording.count(total, 'image')} in validation ({percent:g}%): the value is a percent; "
        f"for a fraction of {percent:g}, pass {percent * 100:g}"), stacklevel=2)


def build(p: beam.Pipeline, config: PrepareConfig, run_plan: RunPlan,
          progress_folder: str | None = None, finalize: bool = True, options: dict[str, Any] | None = None) -> None:
    """The job's transforms; with ``progress_folder`` (local runners), workers report there.
    ``options``: the run's ``resume.record_options``, recorded with its publication.

    Without ``finalize`` the job only writes the shards, and the launcher completes the
    dataset from the shards' records once it is done (``finalize_from_records``): what a
    local run does, as each step the runner schedules costs it a round of messages with
    every worker.
    """
    sink = WriteShardsStreaming if run_plan.sink == "streaming" else WriteShardsShuffle
    work = layout.run_folder(config.output, run_plan.run_id)
    written = p | "WriteShards" >> sink(config.spec, config.reads, work, config.compression, run_plan.num_shards,
                                        progress_folder, config.file_format, config.version)
    if not finalize:
        return
    label_failures = (
        p
        | "ReadUnknownLabels" >> ReadFromText(join(work, layout.UNKNOWN_LABELS), validate=False)
        | "ParseUnknownLabels" >> beam.ParDo(ParseEntryFn())
        | "UnknownLabels" >> beam.Map(unknown_label_report))
    failures = (written.failures, label_failures) | "AllFailures" >> beam.Flatten()
    _ = (p
         | "Once" >> beam.Create([None])
         | "Finalize" >> beam.Map(_complete, config, run_plan, options,
                                  **publish.side_inputs(written, failures, config, run_plan.listed)))


def _complete(_: None, config: PrepareConfig, run_plan: RunPlan, options: dict[str, Any] | None,
              **reported: Any) -> dict[str, Any]:
    """The job's ``Finalize`` step: ``publish.complete`` with the sink's reports."""
    return publish.complete(config, run_plan, publish.ShardReports(**reported), options)


def finalize_from_records(config: PrepareConfig, run_plan: RunPlan,
                          options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Completes a streaming-sink dataset from its shards' records (``resume.ShardRecord``),
    their hash files and the listed files of unknown labels: the same rows the job's own
    ``Finalize`` gathers.

    Raises:
      DatasetError: a shard was not written, or the counts do not add up.
    """
    work = layout.run_folder(config.output, run_plan.run_id)
    names = _shard_names(config, run_plan)
    splits = [split for split, count in run_plan.num_shards.items() for _ in range(count)]
    records = resume.finished_records(work, names)
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    originals: collections.Counter[str] = collections.Counter()
    resized: collections.Counter[str] = collections.Counter()
    failures = []
    for split, record in zip(splits, records):
        counts.update({(split, label): n for label, n in record.class_counts.items()})
        originals.update(record.originals)
        resized.update(record.resized)
        failures += record.failures
    failures += [unknown_label_report(FileEntry.from_json(line))
                 for line in read_lines(join(work, layout.UNKNOWN_LABELS))]
    shards = [(split, record.name, record.records, record.size, record.sha256)
              for split, record in zip(splits, records)]
    hash_files = [join(work, layout.hashes_name(name)) for name in names]
    return publish.complete(config, run_plan, publish.ShardReports(
        shards=shards, class_counts=list(counts.items()), failures=failures, hash_files=hash_files,
        originals=list(originals.items()), flat=[FlatImages.from_json(r.flat) for r in records],
        resized=list(resized.items())), options)


def run(config: PrepareConfig, options: PipelineOptions,
        on_progress: Callable[[progress.Progress], None] | None = None,
        progress_interval: float = 0.5) -> RunResult:
    """Claims the output folder, plans, runs the pipeline to completion and returns the manifest it wrote.

    A local run (streaming sink) that stops before it completes keeps its
    finished shards in its folder, and the same call again resumes it (see
    ``resume``). A dry run (``--dry_run``) lists and plans, and claims and
    writes nothing; for a remote runner it also builds the job.

    On a local runner, ``on_progress`` is called every ``progress_interval``
    seconds while the job runs, from another thread, with the images the workers
    have finished (``progress.Progress``); elsewhere it is never called (the
    runner's counters carry the same numbers).

    Raises:
      OutputBusy: another run holds the output folder.
      OptionsError, StorageError: before any work starts.
      DatasetError: if the finished dataset's counts do not add up, or another
        run took the output folder over while this one ran.
      RunInterrupted: a local run was stopped by Ctrl-C or SIGTERM; its workers
        are stopped and what it finished is kept.
      TooManyFailures: more files failed than ``config.max_failures`` allows; the
        dataset was written all the same, and the error holds the ``RunResult``.
      CrossSplitLeakage: ``config.cross_split_duplicates`` is ``fail`` and copies lie in
        two splits; the dataset was written all the same, and the error holds the ``RunResult``.
    """
    start = time.perf_counter()
    launched = time.time()  # wall time: the workers' reports are in it
    options = views_once(options)  # the caller's options, values shared
    local = _runner_name(options) in LOCAL_RUNNERS
    if options.view_as(TestOptions).dry_run:
        return _dry_run(config, options, local, start)
    with interrupt.signals_as_interrupts() as stopping, claim_output(config.output, new_run_id()) as claim, \
            _progress_folder(local) as folder, _warm_workers(options) as pool:
        started = pool.started if pool is not None else None
        if started is not None:
            stopping.append(started)
        if _finish_publications(config):
            return _finished(config, time.perf_counter() - start, {}, None, None)
        if config.append:  # the version after the dataset's as it is now, another run's publication finished
            config = dataclasses.replace(config, version=append.read_dataset(config.output)[0].version + 1)
        try:
            job = _prepare(config, options, claim.run_id, write=True, progress_folder=folder, pool=pool)
        except NothingToAdd as e:
            return _nothing_to_add(config, e, time.perf_counter() - start)
        result = None
        try:
            if not job.all_kept:  # a resumed run whose shards are all written has only its dataset to finish
                with _watching(folder, job, on_progress, progress_interval), worker_errors.typed_errors():
                    result = job.pipeline.run()
                    result.wait_until_finish()
            if job.resumable:
                finalize_from_records(config, job.plan, job.options)
        except BaseException as e:
            # A local job ends with this process; a remote one (Dataflow) may still be
            # running after its launcher stops waiting, so its files are left to it.
            if not (local and _end_local_run(config, job, e, started)):
                raise
        stopping.over = True  # published: a signal now stops nothing
        if claim.lost:
            raise DatasetError(f"another run took {config.output} over while run {job.run_id} ran, so the "
                               "folder may hold both runs' files: run again with --overwrite")
        phases = None
        if folder is not None:
            phases = progress.phases(progress.read_progress(folder, job.plan.listed, job.carried()), launched)
    counters: dict[str, int] = {}
    for c in result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"] if result else ():
        counters[c.key.metric.name] = counters.get(c.key.metric.name, 0) + (c.committed or 0)
    return _finished(config, time.perf_counter() - start, counters, phases, resume.images_in(job.kept))


def _finish_publications(config: PrepareConfig) -> bool:
    """Finishes the publications of runs stopped while publishing into the output (under its claim,
    before anything else: ``publication.finish_unfinished``); whether one was this command's, which
    then has nothing left to do (with --overwrite, a run starts over all the same). The same command
    is the same ``resume.record_options``: --labels_file's lines and the tables' content included."""
    leftovers = layout.unfinished_runs(config.output, CLAIM_NAME)
    finished = publication.finish_unfinished(config.output, leftovers, config.overwrite)
    if config.overwrite or not finished:
        return False
    options = resume.record_options(config, _labels(config))
    return any(p.options == options for p in finished)


def _finished(config: PrepareConfig, seconds: float, counters: dict[str, int],
              phases: progress.Phases | None, kept: int | None) -> RunResult:
    """The result of a run whose dataset is published: its manifest read back, said as a finished run says it.
    ``kept``: the images a resumed run kept; None: all of them (its publication was all it finished).

    Raises:
      TooManyFailures, CrossSplitLeakage: as ``run``.
    """
    written = manifest.read(config.output)
    _warn_if_many_flat(written)
    _warn_if_labels_conflict(written)
    for warning in shrunk_splits.messages(written, config.validation_percent):
        warnings.warn(BeamPrepWarning(warning), stacklevel=2)
    _warn_if_resized_by_pillow(written)
    result = RunResult(written, seconds, counters, phases=phases,
                       kept=written["counts"]["listed"] if kept is None else kept)
    too_many = failure_budget.exceeded(config.max_failures, written["counts"], config.output)
    if too_many is not None:
        raise TooManyFailures(too_many, result)
    leaking = duplicates.leakage_error(config.cross_split_duplicates, written, config.output)
    if leaking is not None:
        raise CrossSplitLeakage(leaking, result)
    return result


def _nothing_to_add(config: PrepareConfig, nothing: NothingToAdd, seconds: float, dry_run: bool = False) -> RunResult:
    """An append with nothing new: said in one warning, and the dataset as it was (no new version)."""
    additions = nothing.additions
    warnings.warn(BeamPrepWarning(
        f"nothing to add to {config.output} from {config.input} ({append.describe(0, additions.counts(), False)}): "
        f"no version {config.version} made"), stacklevel=3)
    written = None if dry_run else manifest.read(config.output)
    return RunResult(written, seconds, {}, kept=written["counts"]["listed"] if written else 0)


def _warn_if_many_flat(written: dict[str, Any]) -> None:
    """Many records of one flat colour are more likely a problem than blank sources: said, with what to do
    (flat.jsonl and the summary name them)."""
    found = written.get("flat_images") or {}
    count = int(found.get("count") or 0)
    if flat.is_many(count, written["counts"]["written"]):
        warnings.warn(BeamPrepWarning(
            f"{count:,} of {wording.count(written['counts']['written'], 'record')} show one flat colour "
            f"(each named in {layout.FLAT}): {flat.advice(found, (written.get('options') or {}).get('background'))}"),
            stacklevel=2)


def _warn_if_labels_conflict(written: dict[str, Any]) -> None:
    """The same bytes under two labels contradict themselves, whatever split they are in: said, with a
    few. (Near copies under two labels are counted, not warned about: two similar photos of two
    classes are no contradiction.)"""
    exact, _ = duplicates.label_conflicts(written)
    if not exact:
        return
    shown = duplicates.describe_conflicts(written)
    warnings.warn(BeamPrepWarning(
        f"same image under different labels: {wording.count(exact, 'image')} with the same bytes filed under two "
        f"labels or more{f' (e.g. {shown})' if shown else ''}: a contradiction the model learns both ways; each is in "
        f"{layout.DUPLICATES} with \"labels_differ\": true: give it one label, or leave it out "
        f"({doc_page('guides/messy-trees.md', 'The same image under two labels')})"), stacklevel=2)


def _warn_if_resized_by_pillow(written: dict[str, Any]) -> None:
    """The workers' resize fallback, said once on the launcher's console: their own logs may show
    nowhere, and the images are the same but took more CPU."""
    reasons = written.get("resize_fallback") or []
    if reasons:
        kernel = written.get("resize_kernel")
        by_pillow = kernel.get(resample.PILLOW) if isinstance(kernel, dict) else None
        images = f"{by_pillow:,} images were" if by_pillow is not None else "every image was"
        warnings.warn(BeamPrepWarning(
            f"{images} resized with Pillow's own loops (the same pixels, more CPU): {'; '.join(reasons)}"),
            stacklevel=2)


def _dry_run(config: PrepareConfig, options: PipelineOptions, local: bool, start: float) -> RunResult:
    """Lists and plans, claiming and writing nothing; a remote runner also builds the job and stops
    before submitting it."""
    try:
        if local:
            listing, run_plan = plan_run(config, options, labels=_labels(config))
            listing.close()
            return _planned(config, run_plan, start, RunResult(None, 0.0, {}, plan=run_plan))
        job = _prepare(config, options, new_run_id(), write=False)
    except NothingToAdd as e:
        return _nothing_to_add(config, e, time.perf_counter() - start, dry_run=True)
    result = job.pipeline.run()
    return _planned(config, job.plan, start, RunResult(None, 0.0, {}, getattr(result, "job", None), plan=job.plan))


def _planned(config: PrepareConfig, run_plan: RunPlan, start: float, result: RunResult) -> RunResult:
    """``result`` with its time, and the plan as the caller reads it, logged."""
    seconds = time.perf_counter() - start
    planned = PlannedRun.of(run_plan, config.input, config.output, seconds, job_built=result.job is not None)
    _LOG.info("%s", planned)
    return dataclasses.replace(result, seconds=seconds, planned=planned)


def _end_local_run(config: PrepareConfig, job: _Prepared, error: BaseException,
                   started: interrupt.Started | None) -> bool:
    """After a local job stopped early: the worker processes it started (``started``) stopped, and
    no other; its folder kept where it can be resumed, else removed. An interrupt becomes
    ``RunInterrupted``, saying what was kept, or what is left of its publication; returns True
    where it came once the dataset was published whole (the run is done: its folder is gone)."""
    if started is not None:
        started.stop()
    if isinstance(error, KeyboardInterrupt):
        with contextlib.suppress(StorageError):  # unlisted: said as an interrupt before publishing
            if job.run_id not in layout.unfinished_runs(config.output, CLAIM_NAME):
                return True
            if publication.is_recorded(config.output, job.run_id):
                raise RunInterrupted(f"stopped while publishing its dataset into {config.output}: run the same "
                                     "command again to finish publishing it", interrupt.signal_of(error),
                                     resumable=True) from None
    work = layout.run_folder(config.output, job.run_id)
    if not job.resumable:
        _remove_quietly(config.output, job.run_id)
        if isinstance(error, KeyboardInterrupt):
            raise RunInterrupted("nothing was kept (only the streaming sink resumes); run the same command "
                                 "again to start over", interrupt.signal_of(error), resumable=False) from None
        return False
    names = _shard_names(config, job.plan)
    done = resume.finished_count(work, names)
    again = ("run the same command without --overwrite to resume, or with it to start over" if config.overwrite
             else "run the same command again to resume, or pass --overwrite to start over")
    if isinstance(error, KeyboardInterrupt):
        raise RunInterrupted(f"{done} of {len(names)} shards written; {again}", interrupt.signal_of(error),
                             resumable=True) from None
    _LOG.warning("run %s kept %d of %d shards, finished before it failed: %s", job.run_id, done, len(names), again)
    return False


def _shard_names(config: PrepareConfig, run_plan: RunPlan) -> list[str]:
    return [layout.shard_name(split, i, count, config.shard_suffix, config.version)
            for split, count in run_plan.num_shards.items() for i in range(count)]


def _labels(config: PrepareConfig) -> list[str] | None:
    return read_labels_file(config.labels_file) if config.labels_file else None


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
    with progress.Watcher(folder, job.plan.listed, on_progress, job.carried(), interval):
        yield


def _prepare(config: PrepareConfig, options: PipelineOptions, run_id: str,
             write: bool, progress_folder: str | None = None, pool: warm_pool.WarmPool | None = None) -> _Prepared:
    """Checks the output folder, then lists and plans, or takes the plan of the unfinished run
    this one resumes; with ``write``, clears unfinished runs and writes this run's listings. An
    append that cannot resume the unfinished run (other options) starts afresh, as ``--overwrite``
    would (which an append does not take): that run published nothing.
    Returns the pipeline, built (its workers ``pool``'s, fitted to the run), and its plan."""
    labels = _labels(config)
    leftovers = layout.unfinished_runs(config.output, CLAIM_NAME)
    resumable = _resumable(resolve_sink(config, options), options)
    recorded = resume.record_options(config, labels)
    resumed = None
    kept: list[resume.ShardRecord] = []
    if write and resumable and not config.overwrite:
        try:
            resumed = resume.find_resumable(config.output, leftovers, recorded)
        except OptionsError:
            if not config.append:  # --overwrite starts over, which an append does not take
                raise
            resumed = None  # an append the unfinished one cannot be resumed by starts afresh: its files go
    if resumed is not None:
        layout.check_output(config.output, config.overwrite or resumed.overwrite, [], config.append)
        run_plan = RunPlan(**resumed.plan)
        names = _shard_names(config, run_plan)
        work = layout.run_folder(config.output, run_plan.run_id)
        resume.check_listings(work, [layout.UNKNOWN_LABELS, *(layout.shard_listing_name(split, i) for split, count
                                                             in run_plan.num_shards.items() for i in range(count))],
                              config.input)
        kept = resume.keep_finished(work, names)
        _LOG.warning("resuming run %s: %d of %d shards already written (%s of %s images); it uses the listing "
                     "that run made (--overwrite lists afresh)", run_plan.run_id, len(kept), len(names),
                     f"{resume.images_in(kept):,}", f"{sum(run_plan.split_counts.values()):,}")
    else:
        layout.check_output(config.output, config.overwrite, leftovers, config.append)
        listing, run_plan = plan_run(config, options, run_id, labels)
        with listing:
            if write:
                if leftovers and config.append:
                    _LOG.warning("removing the files of unfinished run %s, stopped before it completed: this "
                                 "append does not resume it", ", ".join(leftovers))
                layout.remove_unfinished_runs(config.output, leftovers)
                _write_run_folder(config, listing, run_plan, resume.RunRecord(
                    run_id, recorded, config.overwrite, dataclasses.asdict(run_plan),
                    resume.resume_command(config, options)) if resumable else None)
        _LOG.info("run %s: listed %d images (%d labels, splits %s), skipped %d; sink %s, shards %s",
                  run_id, run_plan.listed, len(run_plan.labels), ", ".join(run_plan.num_shards),
                  run_plan.skipped, run_plan.sink, run_plan.num_shards)
    if _runner_name(options) not in LOCAL_RUNNERS:
        add_format_requirement(options, config.file_format)  # remote workers need the format's library
    _fit_workers(options, (sum(run_plan.split_counts.values()) or run_plan.listed) - resume.images_in(kept))
    if pool is not None:
        pool.fit(local_workers(options))
    job = _Prepared(run_plan.run_id, None, run_plan, resumable, tuple(kept), recorded)
    if job.all_kept:  # a resumed run whose shards are all written only publishes: no pipeline is built
        return job
    p = beam.Pipeline(runner=local_runner(options, pool), options=options)
    build(p, config, run_plan, progress_folder, finalize=not resumable, options=recorded)
    return job._replace(pipeline=p)


def _write_run_folder(config: PrepareConfig, listing: Listing, run_plan: RunPlan,
                      record: resume.RunRecord | None) -> None:
    """The run's listings, then its record (``run.json``, where it can be resumed): a folder
    without its record is one whose launcher stopped while listing, and holds nothing to keep."""
    work = layout.run_folder(config.output, run_plan.run_id)
    try:
        write_work_files(listing, run_plan, work)
        if record is not None:
            resume.write_run_record(work, record)
    except BaseException:
        _remove_quietly(config.output, run_plan.run_id)
        raise


def _remove_quietly(output: str, run_id: str) -> None:
    """A failed run's files go with it, unless its publication is recorded (the next run into the folder
    finishes it); if they cannot, the next run reports them as unfinished."""
    try:
        if publication.is_recorded(output, run_id):
            _LOG.warning("run %s stopped while it published its dataset: the next run into %s finishes it",
                         run_id, output)
            return
        layout.remove_run_folder(output, run_id)
    except StorageError as e:
        _LOG.warning("could not remove the failed run's files: %s", e)
