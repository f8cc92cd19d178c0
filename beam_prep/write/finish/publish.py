"""The one step that completes a dataset, whichever way its shards were written.

``prepare``'s job (its ``Finalize`` step), a local run completed by its launcher
(``pipeline.finalize_from_records``) and ``WriteImageDataset`` each gather what
the shards report as ``ShardReports`` and hand it to ``complete``: the manifest
is built from the reports alone (``manifest.build``), and only when the counts
add up is the dataset staged and published (``publication``), the manifest last.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_prep import wording
from beam_prep.errors import DatasetError
from beam_prep.io.dali_index import index_name
from beam_prep.io.storage import is_local, join, open_to_read, read_bytes, storage_error, write_bytes, write_lines
from beam_prep.model import dataset_card, tfds_metadata
from beam_prep.model.dataset import MANIFEST, DatasetInfo, labels_lines
from beam_prep.write.finish import appended, drop, duplicates, earlier, manifest, publication
from beam_prep.write.finish.near_beam import NearPairs
from beam_prep.write.finish.near_earlier import Copy
from beam_prep.write.grow.append import COPY_REASON, Additions, found_lines
from beam_prep.write.images import flat
from beam_prep.write.images.flat import FlatImages
from beam_prep.write.journal import resume
from beam_prep.write.plan import skipped
from beam_prep.write.plan.config import DROP, PrepareConfig
from beam_prep.write.plan.listing import stamps
from beam_prep.write.plan.run_plan import RunPlan
from beam_prep.write.shared import kept_hashes, layout

__all__ = ["ShardReports", "begun", "complete", "error_lines", "side_inputs", "write_tfds_metadata"]

_LOG = logging.getLogger(__name__)


class ShardReports(NamedTuple):
    """What the sinks report, over all splits: all the manifest is built from.

    Attributes:
      shards: ``(split, shard file name, number of records or None, size in bytes or None,
        sha256 or None)`` per shard written, the size and sha256 taken as the shard was written.
      class_counts: ``((split, label), number of records)`` rows; a pair may repeat.
      failures: a failure report per listed file that became no record.
      hash_files: the paths of the records' hash files, for the duplicates report.
      originals: ``(KEPT or a re-encode reason, number of records)`` rows
        (``--image_format original``; empty otherwise).
      flat: ``FlatImages`` parts that together count each record of one flat colour once.
      resized: ``(what resized, number of images)`` rows (``resample.counting``'s keys).
      near_pairs: the pairs of perceptual hashes within the run's threshold, found by the
        pipeline (``near_beam.NearPairs``); None: the near search runs here (``near.report``).
    """

    shards: list[tuple[str, str, int | None, int | None, str | None]]
    class_counts: list[tuple[tuple[str, str], int]]
    failures: list[Mapping[str, Any]]
    hash_files: list[str]
    originals: Iterable[tuple[str, int]] = ()
    flat: Iterable[FlatImages] = ()
    resized: Iterable[tuple[str, int]] = ()
    near_pairs: list[tuple[int, int]] | None = None


def side_inputs(written: Any, failures: beam.PCollection, config: PrepareConfig,
                count: int) -> dict[str, beam.pvalue.AsList]:
    """A sink's outputs as a finishing step's side inputs, one per ``ShardReports`` field; the near
    pairs found by Beam transforms over the sink's hash files (``near_beam.NearPairs``).

    Args:
      written: the sink's ``SinkResult``.
      failures: every failure report of the run: the sink's, and any found before it.
      config: the run's configuration (its near-duplicate threshold).
      count: about how many records the run writes (it chooses the search's bands).

    Returns:
      ``ShardReports``' fields by name, for ``beam.Map(fn, **side_inputs(...))``, where
      ``fn`` makes them ``ShardReports(**fields)``.
    """
    near_pairs = {}
    if config.near_duplicate_distance >= 0:
        pairs = written.hashes | "NearPairs" >> NearPairs(config.near_duplicate_distance, count)
        near_pairs = {"near_pairs": beam.pvalue.AsList(pairs)}
    return {**near_pairs, "shards": beam.pvalue.AsList(written.shards),
            "class_counts": beam.pvalue.AsList(written.class_counts),
            "failures": beam.pvalue.AsList(failures),
            "hash_files": beam.pvalue.AsList(written.hashes),
            "originals": beam.pvalue.AsList(written.originals),
            "flat": beam.pvalue.AsList(written.flat),
            "resized": beam.pvalue.AsList(written.resized)}


def complete(config: PrepareConfig, plan: RunPlan, reports: ShardReports,
             options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Completes the dataset from its shards' reports, and returns its manifest.

    Finds the duplicates among the records (for ``WriteImageDataset``'s append, those that are not
    copies of the dataset's records, set apart first: ``copies``); with ``--cross_split_duplicates
    drop``, or copies set apart, writes again the shards that hold a record to leave out (``drop``);
    checks the counts; stages errors.jsonl,
    skipped.jsonl (from the run's folder), duplicates.jsonl, labels.txt, TFDS's metadata where
    TFDS can read the shards, the dataset card (``dataset_card``, unless the folder holds a file of
    its name beam-prep did not write) and the manifest in the run's folder; records the publication and
    carries it out (``publication``): the old dataset's files moved aside, the shards and those
    files moved in, the manifest last, then the run's folder removed. Called again for a run
    whose publication is recorded or done (a retried step: ``begun``), it finishes that one.

    Args:
      config: the run's configuration.
      plan: the run's plan.
      reports: what the shards report.
      options: what a rerun must repeat to be the same command (``resume.record_options``, or the
        transform's), recorded with the publication; None: ``resume.command_options(config)``.

    Returns:
      The manifest written.

    Raises:
      DatasetError: the counts do not add up (a record was lost): nothing is published.
      StorageError: a file could not be read or written.
    """
    recorded = publication.read_record(config.output, plan.run_id)
    if recorded is not None:
        publication.carry_out(config.output, recorded)
        return manifest.read(config.output)
    if _published(config.output, plan.run_id, reports.shards, config.append):
        _LOG.info("run %s's dataset is published already (a step run again)", plan.run_id)
        return manifest.read(config.output)
    work = layout.run_folder(config.output, plan.run_id)
    distance = config.near_duplicate_distance
    dataset = manifest.read(config.output) if config.append else {}
    found, before = earlier.find(config.output, work, dataset, reports.hash_files, plan.listed,
                                 distance if distance >= 0 else None, reports.near_pairs,
                                 config.version if config.append else None, config.append and plan.copies_written)
    dropping = rewritten = None
    try:
        shards, class_counts, copies = reports.shards, reports.class_counts, found.to_json()
        if config.append:
            _refuse_leaks(config, found, work)
        drops = config.cross_split_duplicates == DROP
        if drops or before.copies:
            dropping = drop.choose(found.lines_file if drops else None, config.input,
                                   distance if distance >= 0 else None, before.copies)
            rewritten = drop.rewrite(work, config.file_format, config.compression, plan.multi_label, shards,
                                     class_counts, reports.hash_files, dropping)
            shards, class_counts = rewritten.shards, rewritten.class_counts
            if drops:
                copies = {**copies, **dropping.to_json()}
        plan, counted = _set_apart(plan, before.copies)
        try:
            built = manifest.build(config, counted, shards, class_counts, reports.failures, reports.originals, copies,
                                   reports.flat, reports.resized, dropping.count if drops else None,
                                   len(before.copies))
            if config.append:  # the dataset's manifest, this run's version added
                built = appended.merge(dataset, built, config.version, config.input,
                                       Additions.from_json(plan.appended or {}).counts())
                built[stamps.MANIFEST_KEY] = list(stamps.listed(dataset).values())
            skipped.check(work, plan.skipped)
            steps = publication.Steps()
            staged = _stage(config, plan, built, reports, found, dropping, steps, before)
            moved = rewritten.published_from() if rewritten is not None else {}
            ours = {name for _, name, *_ in shards}
            ours |= {index_name(name) for name in ours}
            made = {e["file"]: e["sha256"] for e in before.entries if e["file"] in before.from_run}
            record = publication.planned(config.output, plan.run_id,
                                         resume.command_options(config) if options is None else options,
                                         {**{name: moved.get(name, name) for split in built["splits"].values()
                                             for name in (*split["shards"], *split.get("dali_index", ()))
                                             if name in ours}, **{name: name for name in made}}, staged,
                                         {**{name: sha256 for split in built["splits"].values()
                                             for name, sha256 in zip(split["shards"], split.get("shard_sha256") or ())
                                             if sha256}, **made}, append=config.append)
            publication.write_record(config.output, record)
            steps.done()
        except BaseException:
            if rewritten is not None:
                rewritten.discard()
            raise
    finally:
        found.close()
        if dropping is not None:
            dropping.close()
    publication.carry_out(config.output, record, steps)
    _LOG.info("wrote %s", join(config.output, MANIFEST))
    if built["flat_images"]["count"]:
        _LOG.info("records of one flat colour: %s (every one in %s)", built["flat_images"]["count"], layout.FLAT)
    return built


def begun(output: str, run_id: str, shards: Iterable[tuple]) -> bool:
    """Whether run ``run_id`` recorded its publication, or finished it (``shards``: its ``ShardReports.shards``):
    a step run again for it (a retried ``Finalize``) then finishes it, and is not refused."""
    return publication.is_recorded(output, run_id) or _published(output, run_id, shards)


def _published(output: str, run_id: str, shards: Iterable[tuple], append: bool = False) -> bool:
    """Whether the run's publication was carried out to the end: its folder holds no file any more,
    and the output's manifest lists exactly the shards it reports (an ``append``'s: among the dataset's;
    never for a run that reports none)."""
    names = {row[1] for row in shards}
    if not names or publication.is_recorded(output, run_id) or not FileSystems.exists(join(output, MANIFEST)):
        return False
    if any(FileSystems.match([join(layout.run_folder(output, run_id), "**")])[0].metadata_list):
        return False
    published = manifest.read(output)
    listed = {name for split in published["splits"].values() for name in split["shards"]}
    return names <= listed if append else listed == names


def _set_apart(plan: RunPlan, found: list[Copy]) -> tuple[RunPlan, RunPlan]:
    """An append's plan with the records ``copies`` set apart (``found``) added to what it left out
    (``appended``), and the plan the manifest counts with: ``found`` counted as ``prepare --append``
    counts the files it leaves out, a copy skipped (``COPY_REASON``), a file of the dataset's, unchanged,
    neither listed nor skipped. Both ``plan`` where none was set apart."""
    if not found:
        return plan, plan
    additions = Additions.from_json(plan.appended or {})
    copied = [copy.appended_row() for copy in found if not copy.unchanged]
    additions.add_copies(copied)
    additions.unchanged += len(found) - len(copied)
    plan = dataclasses.replace(plan, appended=additions.to_json())
    reasons = dict(plan.skipped_by_reason)
    if copied:
        reasons[COPY_REASON] = reasons.get(COPY_REASON, 0) + len(copied)
    return plan, dataclasses.replace(plan, listed=plan.listed - len(found), skipped=plan.skipped + len(copied),
                                     skipped_by_reason=reasons)


def _refuse_leaks(config: PrepareConfig, found: duplicates.Duplicates, work: str) -> None:
    """An append's ``--cross_split_duplicates fail``: new images that copy, or nearly, a record of another
    split refuse the append before anything is published (an old record is never the one to go).

    Raises:
      DatasetError: naming the groups, and where their report is (in the run's folder).
    """
    leaks = duplicates.leakage({"duplicates": found.to_json()})
    if config.cross_split_duplicates != "fail" or not leaks:
        return
    report = join(work, layout.DUPLICATES)
    duplicates.copy_lines(found, report)
    raise DatasetError(f"--cross_split_duplicates fail: {wording.count(leaks, 'group')} of copies or near copies "
                       f"across splits hold a new image (see {report}): nothing published; leave those images out, "
                       "or pass --cross_split_duplicates drop to leave them out of the append")


def _stage(config: PrepareConfig, plan: RunPlan, built: dict[str, Any], reports: ShardReports,
           found: duplicates.Duplicates, dropping: drop.Dropping | None, steps: publication.Steps,
           before: earlier.Earlier) -> list[str]:
    """Writes the files the dataset gains besides its shards into the run's staging folder, the
    manifest last, a step each; returns their names. The manifest lists the kept hash files
    (``before``'s, then this version's)."""
    work = layout.run_folder(config.output, plan.run_id)
    folder = publication.staging_folder(work)
    write_lines(join(folder, layout.ERRORS), error_lines(reports.failures))
    steps.done()
    skipped.publish(work, folder, plan.skipped, dropping.lines() if dropping is not None else ())
    steps.done()
    duplicates.copy_lines(found, join(folder, layout.DUPLICATES))
    steps.done()
    write_lines(join(folder, layout.FLAT), flat.lines(FlatImages().merge(*reports.flat)))
    steps.done()
    write_lines(join(folder, layout.LABELS), labels_lines(plan.labels, config.labels_txt, config.label_offset))
    steps.done()
    kept = kept_hashes.kept_name(config.version)
    built[kept_hashes.MANIFEST_KEY] = [*before.entries, earlier.kept_file(
        reports.hash_files, config.input, join(folder, kept), config.version, dropping)]
    steps.done()
    names = [layout.ERRORS, layout.SKIPPED, layout.DUPLICATES, layout.FLAT, layout.LABELS, kept]
    kept_stamps = stamps.stage(work, folder, config.version)  # none from WriteImageDataset, which lists no tree
    built[stamps.MANIFEST_KEY] = [*built.get(stamps.MANIFEST_KEY, ()), *([kept_stamps] if kept_stamps else [])]
    if kept_stamps is not None:
        names.append(kept_stamps["file"])
        steps.done()
    if config.append:
        for name in (layout.ERRORS, layout.SKIPPED, layout.DUPLICATES, layout.FLAT):
            _after_the_datasets(config.output, folder, name)
        write_lines(join(folder, layout.CHANGED), Additions.from_json(plan.appended or {}).changed_lines(
            found_lines(work)))
        names.append(layout.CHANGED)
        steps.done()
    info = DatasetInfo.from_json(built, config.output, MANIFEST)
    for filename in write_tfds_metadata(info, folder):
        names.append(filename)
        steps.done()
    if _card_is_ours(config.output):
        write_bytes(join(folder, dataset_card.CARD), dataset_card.card(info, built).encode("utf-8"), "text/markdown")
        names.append(dataset_card.CARD)
        steps.done()
    write_bytes(join(folder, MANIFEST), json.dumps(built, indent=2, ensure_ascii=False).encode("utf-8"),
                "application/json")
    steps.done()
    return [*names, MANIFEST]


def _card_is_ours(output: str) -> bool:
    """Whether the run writes the dataset card: ``output`` holds no file of its name (``dataset_card.CARD``),
    or one beam-prep wrote (``dataset_card.is_ours``); another (the user's, a folder, a link) stays as it
    is, said in a warning.

    Raises:
      StorageError: the file cannot be read.
    """
    path = join(output, dataset_card.CARD)
    try:
        if is_local(path):
            if not os.path.lexists(path):
                return True
            ours = os.path.isfile(path) and not os.path.islink(path)
        elif not FileSystems.exists(path):
            return True
        else:
            ours = True
        if ours:
            with open_to_read(path) as f:
                ours = dataset_card.is_ours(f.read(1024).decode("utf-8", "replace"))
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("read", path, e) from e
    if not ours:
        _LOG.warning("%s is not a dataset card beam-prep wrote: left as it is, and no card written "
                     "(move it out of %s to have one)", path, output)
    return ours


def _after_the_datasets(output: str, folder: str, name: str) -> None:
    """An append's report file ``name``, staged in ``folder``: the dataset's lines, then the run's.

    Raises:
      StorageError: a file cannot be read or written.
    """
    old, staged = join(output, name), join(folder, name)
    try:
        if not FileSystems.exists(old):
            return
        ours = read_bytes(staged)
        with FileSystems.create(staged, mime_type="text/plain", compression_type=CompressionTypes.UNCOMPRESSED) as out, \
                open_to_read(old) as theirs:
            shutil.copyfileobj(theirs, out, 1 << 20)
            out.write(ours)
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("write", staged, e) from e


def write_tfds_metadata(info: DatasetInfo, folder: str | None = None) -> list[str]:
    """TFDS's dataset_info.json, features.json and label names, where TFDS can read the shards,
    written into ``folder`` (``info.root`` by default); returns their names, none where it cannot."""
    reason = tfds_metadata.unsupported(info)
    if reason is not None:
        _LOG.info("no TFDS metadata written: %s", reason)
        return []
    written = []
    for filename, lines in tfds_metadata.metadata_files(info).items():
        write_lines(join(folder or info.root, filename), lines)
        written.append(filename)
    return written


def error_lines(failures: Iterable[Mapping[str, Any]]) -> list[str]:
    """errors.jsonl, one JSON object a line, sorted by path so reruns diff cleanly."""
    return [json.dumps(f, ensure_ascii=False, sort_keys=True)
            for f in sorted(failures, key=lambda f: f["path"])]
