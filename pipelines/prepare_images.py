"""Turn ROOT/<label>/<image> into sharded GZIP TFRecords: ``python -m pipelines.prepare_images``.

    beam-prep prepare --input ROOT --output OUT [options] [Beam options]
    python -m pipelines.prepare_images ...           # the same

With no ``--runner`` it runs on Beam's DirectRunner with one worker process per
core (fewer for a small job). The same module is what Dataflow jobs are submitted with
(``--runner DataflowRunner --setup_file ./setup.py ...``). Exit codes: 0 done,
2 bad options or input, unknown flags included (nothing was started), 1 the job
failed (or, with ``--max_failures`` or ``--cross_split_duplicates fail``, the
dataset is written and fails its bound: the summary comes before the line), 130 or 143 stopped by SIGINT or SIGTERM (a local run keeps its finished
shards, and the same command resumes it). A failed job ends with one line on stderr, its cause and the log file
that holds Beam's records and the full traceback (``--verbose`` prints them).
``--help`` lists our options, ``--help_beam`` Beam's. While a local job runs,
its progress is drawn on stderr (``progress_display``).
"""
from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Sequence
from typing import TextIO

if __name__ == "__main__":  # Beam imported, then the run's first workers forked with it
    from beam_prep.cli.early import import_beam_then_start_workers
    import_beam_then_start_workers(sys.argv[1:])

from apache_beam.options.pipeline_options import PipelineOptions

from beam_prep.api import parse_command_line
from beam_prep.cli.joblog import JobFailed, JobLog, is_job_failure, new_log_path, root_cause
from beam_prep.cli.options import PrepareImagesOptions
from beam_prep.cli.spelling import known_spelling
from beam_prep.cli.usage import HELP_BEAM, beam_options_help, prepare_help, prepare_parser
from beam_prep.errors import BeamPrepError, OptionsError, RunInterrupted, WrittenButFailed
from beam_prep.tools.inspection import flat_lines, originals_lines
from beam_prep.wording import count
from beam_prep.write.finish import duplicates
from beam_prep.write.grow.append import describe
from beam_prep.write.plan.config import PrepareConfig, progress_interval
from beam_prep.write.run.beam_compat import WORKER_LOG_RELAY
from beam_prep.write.run.interrupt import signal_of
from beam_prep.write.run.pipeline import RunResult, run
from beam_prep.write.run.warm_pool import close_early
from pipelines.cli import VERSION, VERSION_FLAG, ConsoleFormatter, console_logging
from pipelines.progress_display import ProgressDisplay


def command(*args: str) -> list[str]:
    """``python -m pipelines.prepare_images ARGS`` for a fresh process, run from the repository root.

    The one place tests and benchmarks get the command from, so they all run
    the pipeline the way a user types it.
    """
    return [sys.executable, "-m", "pipelines.prepare_images", *args]


def parser() -> argparse.ArgumentParser:
    """What ``--help`` prints, as every command's ``parser()``: the site's reference is made from it.

    Beam's options classes parse the command line itself (``parse_command_line``).
    """
    return prepare_parser()


def timing(result: RunResult) -> str:
    """``9.4 s (start-up 6.1 s, then 1,150 images/s for 2.1 s, finishing 1.2 s)``.

    A short run spends most of its time starting its workers and finishing the
    job, and its overall rate alone would read as slow. Without the workers'
    reports (a remote runner) only the overall rate can be given.
    """
    phases = result.phases
    if phases is None:
        return f"{result.seconds:.1f} s ({result.images_per_second:,.0f} images/s)"
    finishing = max(result.seconds - phases.startup_seconds - phases.processing_seconds, 0.0)
    return (f"{result.seconds:.1f} s (start-up {phases.startup_seconds:.1f} s, then {phases.rate:,.0f} images/s "
            f"for {phases.processing_seconds:.1f} s, finishing {finishing:.1f} s)")


def summary(result: RunResult) -> str:
    m = result.manifest
    counts = m["counts"]
    dropped = f", {counts['dropped']:,} dropped" if "dropped" in counts else ""
    lines = [f"beam-prep: {counts['written']:,} of {count(counts['listed'], 'image')} written in {timing(result)}; "
             f"{counts['failed']:,} failed{dropped}, {counts['skipped']:,} skipped"]
    latest = (m.get("versions") or [{}])[-1]
    if latest.get("appended") is not None:
        added = sum(s["num_examples"] for s in latest["splits"].values())
        lines.append(f"  version {latest['version']}: {describe(added, latest['appended'])}")
    for split, s in m["splits"].items():
        lines.append(f"  {split}: {count(s['num_examples'], 'example')} in {count(len(s['shards']), 'shard')}")
    for stage, n in m["failed_by_stage"].items():
        lines.append(f"  failed at {stage}: {n:,} (see errors.jsonl)")
    for reason, n in m.get("skipped_by_reason", {}).items():
        lines.append(f"  skipped, {reason}: {n:,} (see skipped.jsonl)")
    lines += originals_lines(m.get("originals"))
    lines += flat_lines(m.get("flat_images"))
    copies = m.get("duplicates", {})
    dropping = "dropped" in copies
    if copies.get("extra_copies"):
        kept = "those across splits dropped" if dropping and copies["across_splits"] else "written all the same"
        lines.append(f"  duplicates: {count(copies['extra_copies'], 'extra copy', 'extra copies')} of "
                     f"{count(copies['images'], 'image')}, {copies['across_splits']:,} across splits "
                     f"({kept}; see duplicates.jsonl)")
    exact, near_conflicts = duplicates.label_conflicts(m)
    if exact:
        files = (copies.get("label_conflicts") or {}).get("files", 0)
        lines.append(f"  same image under different labels: {count(exact, 'image')} ({count(files, 'file')}) "
                     "(see the warning; \"labels_differ\": true in duplicates.jsonl)")
    near = copies.get("near") or {}
    if near.get("groups"):
        differ = f", {near_conflicts:,} under different labels" if near_conflicts else ""
        lines.append(f"  near duplicates: {count(near['groups'], 'group')} of {count(near['files'], 'file')} "
                     f"within {near['distance']} bits, {near['across_splits']:,} across splits{differ} "
                     "(see duplicates.jsonl)")
    leaks = duplicates.leakage(m)
    if leaks and dropping:
        lines.append(f"  cross-split leakage dropped: {count(copies['dropped'], 'file')}, copies or near copies "
                     "of a file in another split, left out (see skipped.jsonl)")
        lines += [f"  dropped, {reason}: {n:,} (see skipped.jsonl)" for reason, n in copies["dropped_by_reason"].items()]
    elif leaks:
        pairs = ", ".join(f"{pair} {n:,}" for pair, n in duplicates.split_pairs(m).items())
        lines.append(f"  cross-split leakage: {count(leaks, 'group')} of copies or near copies in two splits "
                     f"(groups per pair of splits: {pairs}); see duplicates.jsonl, or beam-prep inspect")
    return "\n".join(lines)


def run_with_progress(config: PrepareConfig, options: PipelineOptions, console: TextIO) -> RunResult:
    """The job, its progress drawn on ``console`` while it runs."""
    interval = progress_interval(options.view_as(PrepareImagesOptions).progress_interval)
    display = ProgressDisplay(console, interval)
    try:
        return run(config, options, on_progress=display, progress_interval=display.poll_interval)
    finally:
        display.close()


def run_verbose(config: PrepareConfig, options: PipelineOptions) -> RunResult:
    """Beam's log on stderr as it comes; a failed job's traceback too, then its cause."""
    try:
        return run_with_progress(config, options, sys.stderr)
    except Exception as e:
        if not is_job_failure(e):
            raise
        traceback.print_exception(e, file=sys.stderr)
        raise JobFailed(root_cause(e)) from e


def run_logged(config: PrepareConfig, options: PipelineOptions) -> RunResult:
    """Beam's log and workers' stderr go to a log file; a failed job becomes one line naming it."""
    try:
        log = JobLog(new_log_path(), ConsoleFormatter())
    except OSError as e:
        print(f"beam-prep: cannot create a log file ({e}); Beam's log goes to stderr", file=sys.stderr)
        return run_verbose(config, options)
    interrupted = False
    try:
        with log:
            try:
                return run_with_progress(config, options, log.console)
            except KeyboardInterrupt:
                # The workers' own tracebacks of a Ctrl-C are in the log: not worth a line.
                interrupted = True
                raise
            except Exception as e:
                if not is_job_failure(e):
                    raise
                log.record_failure(e)
                where = "full log" if log.complete else "log, cut short as it could not be written"
                raise JobFailed(f"{root_cause(e)} ({where}: {log.path})") from e
    finally:
        if log.kept and not log.failure_recorded and not interrupted:
            print(f"beam-prep: Beam logged warnings or errors ({log.hidden_warnings}), see {log.path}",
                  file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    finally:
        close_early()  # workers started for a run that never took them (refused options, help)


def _main(argv: list[str]) -> int:
    flags = known_spelling(argv[:argv.index("--")] if "--" in argv else argv, [HELP_BEAM, VERSION_FLAG])
    console_logging(verbose="--verbose" in flags)
    # Workers relay that they cannot parse our options (they only need Beam's): noise.
    logging.getLogger(WORKER_LOG_RELAY).setLevel(logging.ERROR)
    if HELP_BEAM in flags:
        print(beam_options_help(), end="")
        return 0
    if "-h" in flags or "--help" in flags:
        print(prepare_help(), end="")
        return 0
    if VERSION_FLAG in flags:
        print(VERSION)
        return 0
    try:
        options, config = parse_command_line(argv)
        verbose = options.view_as(PrepareImagesOptions).verbose
        result = (run_verbose if verbose else run_logged)(config, options)
    except OptionsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except WrittenButFailed as e:  # the dataset is written: its summary, then why the run fails
        print(summary(e.result))
        print(f"error: {e}", file=sys.stderr)
        return 1
    except BeamPrepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except RunInterrupted as e:
        print(f"interrupted: {e}", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt as e:  # before the job started: listing, or writing the run's listings
        print("interrupted before any image was processed; nothing was kept", file=sys.stderr)
        return 128 + signal_of(e)
    if result.manifest is not None:
        print(summary(result))
    elif result.planned is not None:  # none: a dry run of an append with nothing to add, which said so
        print(result.planned)
    return 0


if __name__ == "__main__":
    sys.exit(main())
