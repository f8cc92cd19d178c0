"""What a local run records in its folder so that running the same command again resumes it.

A run of the streaming sink (local runners) plans every shard in the launcher,
so a shard is a unit of work that can be kept: when a worker finishes one, it
writes its records' hash file (``layout.hashes_name``, for the duplicates
report) and then ``<shard>.done.json`` beside it (records, size, sha256,
per-label counts, failures, kept and re-encoded originals). The launcher writes
``run.json`` once the run's listings are complete: the options that decide the
records and the plan. A later run of the same command finds the folder, checks
the options against its own, keeps every shard whose file still matches its
record and redoes the rest; since a shard's bytes follow from its listing alone,
the result is the uninterrupted run's.
See docs/guides/messy-trees.md for what is and is not resumed.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import os
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from apache_beam.io.filesystems import FileSystems

import beam_prep
from beam_prep.errors import DatasetError, OptionsError, UnsafeName
from beam_prep.io.storage import is_local, join, open_to_read, read_bytes, read_lines, storage_error, write_lines
from beam_prep.io.tfrecord import Checksum
from beam_prep.model.names import path_under
from beam_prep.write.journal.interrupted import DONE_SUFFIX, RUN_FORMAT, RUN_RECORD
from beam_prep.write.plan.config import PrepareConfig
from beam_prep.write.plan.listing import SPLIT_NAMES, find_split_tables
from beam_prep.write.plan.metadata import file_sha256
from beam_prep.write.shared import layout

__all__ = ["RUN_RECORD", "RunRecord", "ShardRecord", "check_listings", "command_options", "find_resumable",
           "finished_count", "finished_shard", "images_in", "keep_finished", "record_options", "write_record",
           "write_run_record", "write_shard_record"]

_LOG = logging.getLogger(__name__)
# Options that do not change what a run writes: a resumed run may differ in these.
_FREE_OPTIONS = frozenset({"overwrite", "reads", "max_failures", "append_check"})
_FLAG_OF = {"height": "image_size", "width": "image_size", "metadata_sha256": "metadata",
            "split_tables_sha256": "metadata"}
# Options added since RUN_FORMAT 3 was first written, as runs recorded before them had them.
_RECORDED_BEFORE = {"file_format": "tfrecord", "recursive": False, "stratify": False, "max_per_class": None,
                    "append": False, "version": 1}


def command_options(config: PrepareConfig) -> dict[str, Any]:
    """The options of ``config`` that decide a run's records, as JSON values: those a rerun must repeat
    to be the same command (a publication's record names its run's: ``publication``)."""
    options = {k: v for k, v in dataclasses.asdict(config).items() if k not in _FREE_OPTIONS}
    options.update(options.pop("spec"))
    return json.loads(json.dumps(options))


def record_options(config: PrepareConfig, labels: list[str] | None) -> dict[str, Any]:
    """The options that decide a run's records, as JSON values; ``labels`` are --labels_file's lines."""
    options = command_options(config)
    options["labels"] = labels
    # The table's content, not only its path: a table edited since is another run's records.
    options["metadata_sha256"] = file_sha256(config.metadata) if config.metadata else None
    # Likewise the tables found in the split folders (Hugging Face's layout), where there are any.
    tables = find_split_tables(config.input) if not config.metadata else []
    if tables:
        options["split_tables_sha256"] = {path: file_sha256(path) for _, path in tables}
    return json.loads(json.dumps(options))


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """``run.json``: a planned run, as its launcher left it."""

    run_id: str
    options: dict[str, Any]
    overwrite: bool  # the run may replace a dataset in OUTPUT (it was started with --overwrite)
    plan: dict[str, Any]  # RunPlan's fields
    command: list[str] | None = None  # the command that resumes it (``resume_command``), for ``inspect``


# Flags with_local_defaults adds, and those a resuming command leaves out: the paths come first, and
# --overwrite would start over (the run's record says whether it may replace a dataset).
_LOCAL_DEFAULTS = {"runner": "DirectRunner", "direct_running_mode": "multi_processing", "direct_num_workers": 0}
_NOT_REPEATED = frozenset({"input", "output", "overwrite", "dry_run"})


def resume_command(config: PrepareConfig, options: Any) -> list[str]:
    """``beam-prep prepare`` with the flags that resume this run: the paths absolute, its other
    flags as given (``options``: the run's ``PipelineOptions``), --overwrite left out."""
    argv = ["beam-prep", "prepare", "--input", config.input, "--output", config.output]
    for key, value in options.get_all_options(drop_default=True).items():
        if key in _NOT_REPEATED or _LOCAL_DEFAULTS.get(key, object()) == value:
            continue
        if value is True:
            argv.append(f"--{key}")
        elif isinstance(value, (list, tuple)):
            for item in value:
                argv += [f"--{key}", str(item)]
        elif value is not False and value is not None:
            argv += [f"--{key}", str(value)]
    return argv


def write_run_record(work: str, record: RunRecord) -> None:
    """Makes the run resumable: written last, once its listings are complete."""
    body = {"run_format": RUN_FORMAT, "beam_prep_version": beam_prep.__version__, **dataclasses.asdict(record)}
    write_record(join(work, RUN_RECORD), body)


def write_record(path: str, body: Mapping[str, Any]) -> None:
    """Writes a record that a resume reads, so that it is there whole or not at all.

    A process killed while writing it in place would leave it empty or cut
    short: a run or a shard taken for unfinished with no word said. A local
    file is written under a temporary name beside ``path`` and renamed over it
    (atomic on POSIX); an object on gs:// appears whole when it is closed, so
    it is written in place. A killed writer may leave its temporary file,
    which no reader matches and which goes with the run's folder.

    Raises:
      StorageError: naming ``path``, if it cannot be written.
    """
    line = json.dumps(body, ensure_ascii=False)
    if not is_local(path):
        write_lines(path, [line])
        return
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(line + "\n")
        os.replace(temporary, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise storage_error("write", path, e) from e


def _read_run_record(work: str, run_id: str) -> RunRecord | None:
    """The record of run ``run_id`` in ``work``, or None where it cannot be resumed. A record is data in
    the output folder: one naming another run (``../../victim``) or a split the writer never makes
    (``../../x``) would put the run's files, and its shards, outside it; it is not this run's."""
    try:
        body = json.loads(read_bytes(join(work, RUN_RECORD)).decode("utf-8"))
        if body.pop("run_format") != RUN_FORMAT:
            return None
        body.pop("beam_prep_version", None)
        record = RunRecord(**body)
        splits = {*record.plan.get("num_shards", {}), *record.plan.get("split_counts", {})}
        if record.run_id != run_id or record.plan.get("run_id") != run_id or not splits <= set(SPLIT_NAMES):
            return None
        return record
    except Exception:  # noqa: BLE001 - missing, unreadable, damaged or from another version: not resumable
        return None


def find_resumable(output: str, leftovers: list[str], options: Mapping[str, Any]) -> RunRecord | None:
    """The unfinished run in ``output`` that this run continues, or None where there is none.

    Raises:
      OptionsError: an unfinished run that cannot be continued (from another
        version, stopped while listing, several of them) or that was started
        with other options, naming the option, and saying that --overwrite
        starts over.
    """
    if not leftovers:
        return None
    if len(leftovers) > 1:
        raise OptionsError(f"--output {output} holds the files of {len(leftovers)} unfinished runs "
                           f"({', '.join(leftovers)}); pass --overwrite to start over")
    (run_id,) = leftovers
    record = _read_run_record(layout.run_folder(output, run_id), run_id)
    if record is None:
        raise OptionsError(f"--output {output} holds the files of unfinished run {run_id}, which cannot be "
                           "resumed (stopped while listing, made by another beam-prep version, or damaged); "
                           "pass --overwrite to start over")
    # --file_format first: another format has another default --compression too, which follows from it.
    for key in sorted(set(record.options) | set(options), key=lambda k: (k != "file_format", k)):
        then, now = record.options.get(key, _RECORDED_BEFORE.get(key)), options.get(key)
        if then != now:
            flag = _FLAG_OF.get(key, key)
            raise OptionsError(f"--output {output} holds unfinished run {run_id}, started with --{flag} "
                               f"{_shown(key, then, record.options)} where this run has {_shown(key, now, options)}; "
                               "run it with the same options to resume it, or pass --overwrite to start over")
    return record


def check_listings(work: str, listings: Iterable[str], root: str) -> None:
    """Checks that every file the listings ``listings`` of run folder ``work`` name lies under ``root``
    (the run's ``--input``), before a resumed run reads them: the listings are data in the output folder,
    and a line naming a file elsewhere (``/home/me/private.jpg``) would be read into the shards.

    Raises:
      OptionsError: naming the listing, the line and the path, and saying that --overwrite starts over.
    """
    if not root:  # WriteImageDataset's elements: no folder they lie under
        return
    for name in listings:
        where = join(work, name)
        for number, line in enumerate(read_lines(where), 1):
            try:
                path = json.loads(line).get("path")
            except (ValueError, AttributeError):
                path = None
            try:
                path_under(root, path, where, f"line {number}'s path")
            except UnsafeName as e:
                raise OptionsError(f"{e}; the unfinished run cannot be resumed: pass --overwrite to start "
                                   "over") from e


def _shown(key: str, value: Any, options: Mapping[str, Any]) -> str:
    if key == "metadata_sha256":
        return f"{options.get('metadata')} (sha256 {value[:12] if value else None})"
    if key == "split_tables_sha256":
        return ", ".join(f"{path} (sha256 {sha[:12]})" for path, sha in (value or {}).items()) or "(none)"
    if key in _FLAG_OF:
        return f"{options.get('height')}x{options.get('width')}"
    return "(none)" if value is None else json.dumps(value, ensure_ascii=False)


@dataclasses.dataclass(frozen=True)
class ShardRecord:
    """``<shard>.done.json``: a finished shard, and everything the manifest needs of it."""

    name: str
    records: int
    size: int
    sha256: str
    class_counts: dict[str, int]
    failures: list[dict[str, Any]]
    originals: dict[str, int]  # --image_format original: KEPT or a re-encode reason -> records
    # Records of one flat colour (``flat.FlatImages.to_json``); absent from older runs' records.
    flat: dict[str, Any] = dataclasses.field(default_factory=dict)
    # What resized its images, counted (``resample.counting``); absent from older runs' records.
    resized: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def images(self) -> int:
        """The shard's listed images: its records and its failures."""
        return self.records + len(self.failures)


def done_name(shard: str) -> str:
    return shard + DONE_SUFFIX


def write_shard_record(work: str, record: ShardRecord) -> None:
    """Marks a shard finished: written after the shard's file and its hash file are complete and in place."""
    write_record(join(work, done_name(record.name)), dataclasses.asdict(record))


def finished_shard(work: str, name: str) -> ShardRecord | None:
    """The record of shard ``name`` if it is finished, else None; ``keep_finished`` has checked it.

    A record naming another shard is not this one's (damaged, or written by someone else into
    the output folder): its name would reach the manifest, so the shard is written again."""
    try:
        record = ShardRecord(**json.loads(read_bytes(join(work, done_name(name))).decode("utf-8")))
    except Exception:  # noqa: BLE001 - not finished, or its record cut short: written again
        return None
    return record if record.name == name else None


def finished_records(work: str, names: list[str], threads: int = 8) -> list[ShardRecord]:
    """The records of shards ``names``, in that order, read ``threads`` at a time: a local run's
    outputs, which the launcher turns into the manifest once its workers are done.

    Raises:
      DatasetError: naming a shard with no record, i.e. not written.
    """
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="beam-prep-records") as pool:
        records = list(pool.map(lambda name: finished_shard(work, name), names))
    missing = [name for name, record in zip(names, records) if record is None]
    if missing:
        raise DatasetError(f"{len(missing)} of {len(names)} shards were not written, e.g. {missing[0]}")
    return records


def images_in(records: Iterable[ShardRecord]) -> int:
    """The listed images of shards ``records``: what a resumed run keeps of them."""
    return sum(record.images for record in records)


def keep_finished(work: str, names: list[str], threads: int = 8) -> list[ShardRecord]:
    """Checks every finished shard of ``names`` against its record, ``threads`` at a time, and
    returns the records of those kept. One whose file is missing, of another size or another
    sha256, or whose hash file is missing, loses its record, so that the workers write it
    again, with a warning naming it."""
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="beam-prep-check") as pool:
        return [record for record in pool.map(lambda name: _keep(work, name), names) if record is not None]


def _keep(work: str, name: str) -> ShardRecord | None:
    record = finished_shard(work, name)
    if record is None:
        return None
    checksum = Checksum()
    try:
        with open_to_read(join(work, name)) as f:
            while chunk := f.read(1 << 20):
                checksum.update(chunk)
        problem = None if (checksum.size, checksum.hexdigest()) == (record.size, record.sha256) else \
            "no longer matches its recorded size and sha256"
        if problem is None and not FileSystems.exists(join(work, layout.hashes_name(name))):
            problem = f"has lost its hash file {layout.hashes_name(name)}"
    except Exception as e:  # noqa: BLE001 - each filesystem raises its own types.
        problem = f"cannot be read ({e})"
    if problem is None:
        return record
    _LOG.warning("shard %s was finished but %s: writing it again", name, problem)
    FileSystems.delete([join(work, done_name(name))])
    return None


def finished_count(work: str, shard_names: list[str]) -> int:
    """How many of ``shard_names`` have a finished record in ``work`` (not checked against their files)."""
    try:
        found = {m.path.rsplit("/", 1)[-1] for m in FileSystems.match([join(work, "*" + DONE_SUFFIX)])[0].metadata_list}
    except Exception:  # noqa: BLE001 - a folder that cannot be listed holds nothing we can keep
        return 0
    return sum(done_name(name) in found for name in shard_names)
