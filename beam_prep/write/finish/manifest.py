"""manifest.json: what a dataset holds, written last so that its presence means complete."""
from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import logging
from typing import Any, Iterable, Mapping

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

import beam_prep
from beam_prep.errors import DatasetError
from beam_prep.io.storage import join, write_lines
from beam_prep.model import tfds_metadata
from beam_prep.model.dataset import (COMPRESSIONS, FORMAT_VERSION, MANIFEST, DatasetInfo, SplitInfo, labels_lines,
                                     parse_manifest)
from beam_prep.model.features import SCHEMA
from beam_prep.write.finish import duplicates
from beam_prep.write.images import imaging, resample
from beam_prep.write.shared import layout
from beam_prep.write.plan import skipped
from beam_prep.write.images.flat import FlatImages
from beam_prep.write.images.imaging import KEPT, ORIGINAL, REENCODE_REASONS
from beam_prep.write.plan.config import PrepareConfig
from beam_prep.write.plan.run_plan import RunPlan

__all__ = ["FORMAT_VERSION", "build", "error_lines", "finalize", "read"]

_LOG = logging.getLogger(__name__)


def build(
    config: PrepareConfig,
    plan: RunPlan,
    shards: Iterable[tuple[str, str, int | None]],
    counts: Iterable[tuple[tuple[str, str], int]],
    failures: list[Mapping[str, Any]],
    originals: Iterable[tuple[str, int]] = (),
    copies: Mapping[str, Any] | None = None,
    flat: Iterable[FlatImages] = (),
) -> dict[str, Any]:
    """The manifest dict; checks that every listed file is written or failed.

    ``originals``: ``(KEPT or a re-encode reason, records)`` rows, with
    ``--image_format original``, which must account for every record written.
    ``copies``: the duplicates found (``duplicates.Duplicates.to_json``).
    ``flat``: the parts of the records of one flat colour (``SinkResult.flat``).

    Raises:
      DatasetError: if the counts do not add up (a record was lost: never write a
        manifest for such a dataset).
    """
    class_counts = collections.Counter()
    for (split, label), n in counts:
        class_counts[split, label] += n
    shard_rows = collections.defaultdict(dict)
    for split, name, n in shards:
        shard_rows[split][name] = n
    splits = {}
    for split, count in plan.num_shards.items():
        # A count of 0: the runner chose how many (WriteImageDataset without num_shards).
        names = (tuple(layout.shard_name(split, i, count, config.shard_suffix) for i in range(count))
                 if count else tuple(sorted(shard_rows[split])))
        if plan.multi_label:  # a record counts under each of its labels: its shards' counts are the records
            num_examples = sum(n or 0 for n in shard_rows[split].values())
        else:
            num_examples = sum(class_counts[split, label] for label in plan.labels)
        unreported = [name for name in names if name not in shard_rows[split]]
        if unreported or (num_examples and not names):
            raise DatasetError(
                f"split {split!r} holds {num_examples} records but its writer did not report "
                f"{unreported[0] if unreported else 'any shard file'}: no manifest written")
        sizes = tuple(shard_rows[split][name] for name in names)
        splits[split] = SplitInfo(
            name=split, shards=names,
            num_examples=num_examples,
            shard_num_examples=sizes if all(n is not None for n in sizes) else None,
            class_counts={label: class_counts[split, label] for label in plan.labels},
            root=config.output)
    written = sum(s.num_examples for s in splits.values())
    if written + len(failures) != plan.listed:
        raise DatasetError(
            f"{plan.listed} files listed but {written} written and {len(failures)} failed: "
            "records were lost; no manifest written")
    kept_or_not = _originals(config, originals, written)
    info = DatasetInfo(root=config.output, labels=tuple(plan.labels), splits=splits,
                       image=config.spec.info, compression=COMPRESSIONS[config.compression].manifest_name,
                       label_offset=config.label_offset, multi_label=plan.multi_label,
                       extra_features=dict(plan.extra_features), file_format=config.file_format)
    dataset = info.to_json()
    by_stage = collections.Counter(f["stage"] for f in failures)
    return {
        "format_version": dataset.pop("format_version"),
        "beam_prep_version": beam_prep.__version__,
        "imaging_library": imaging.library(),
        "resize_kernel": resample.available(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **dataset,
        "features": {**{key: kind.value for key, kind in SCHEMA.items()}, **plan.extra_features},
        "counts": {"listed": plan.listed, "written": written, "failed": len(failures),
                   "skipped": plan.skipped},
        "failed_by_stage": dict(sorted(by_stage.items())),
        "skipped_by_reason": dict(plan.skipped_by_reason),
        **kept_or_not,
        "flat_images": FlatImages().merge(*flat).to_json(),
        "duplicates": dict(copies) if copies is not None else duplicates.Duplicates().to_json(),
        "sink": plan.sink,
        "options": _options(config),
    }


def _originals(config: PrepareConfig, rows: Iterable[tuple[str, int]], written: int) -> dict[str, Any]:
    """``{"originals": ...}``: how many sources were kept byte for byte and how many re-encoded, by
    reason, with ``--image_format original``; nothing otherwise.

    Raises:
      DatasetError: the rows do not add up to the records written.
    """
    if config.spec.image_format != ORIGINAL:
        return {}
    counts = collections.Counter()
    for reason, n in rows:
        counts[reason] += n
    if sum(counts.values()) != written:
        raise DatasetError(f"{written} records written but {sum(counts.values())} counted as kept or "
                           "re-encoded: no manifest written")
    kept = counts.pop(KEPT, 0)
    return {"originals": {"kept": kept, "reencoded": sum(counts.values()),
                          # In the order they are checked; each row's reason is one of them.
                          "reencoded_by_reason": {reason: counts[reason] for reason in REENCODE_REASONS
                                                  if counts[reason]}}}


def _options(config: PrepareConfig) -> dict[str, Any]:
    options = dataclasses.asdict(config)
    options.update(options.pop("spec"))
    return options


def finalize(
    config: PrepareConfig,
    plan: RunPlan,
    shards: list[tuple[str, str, int | None]],
    counts: list[tuple[tuple[str, str], int]],
    failures: list[Mapping[str, Any]],
    hash_files: list[str],
    originals: Iterable[tuple[str, int]] = (),
    flat: Iterable[FlatImages] = (),
) -> dict[str, Any]:
    """Completes the dataset: checks the counts, finds the duplicates among the records
    (``hash_files``: the sinks' ``SinkResult.hashes``), publishes the shards, writes
    errors.jsonl, skipped.jsonl (from the run's folder), duplicates.jsonl, labels.txt,
    TFDS's metadata where TFDS can read the shards, then the manifest, then removes the
    run's folder. ``originals``, ``flat``: as ``build``'s."""
    work = layout.run_folder(config.output, plan.run_id)
    found = duplicates.find(sorted(hash_files), plan.listed)
    try:
        manifest = build(config, plan, shards, counts, failures, originals, found.to_json(), flat)
        skipped.check(work, plan.skipped)
        layout.publish(config.output, plan.run_id,
                       [name for split in manifest["splits"].values() for name in split["shards"]])
        write_lines(join(config.output, layout.ERRORS), error_lines(failures))
        skipped.publish(work, config.output, plan.skipped)
        duplicates.copy_lines(found, join(config.output, layout.DUPLICATES))
    finally:
        found.close()
    write_lines(join(config.output, layout.LABELS),
                labels_lines(plan.labels, config.labels_txt, config.label_offset))
    write_tfds_metadata(DatasetInfo.from_json(manifest, config.output, MANIFEST))
    with FileSystems.create(join(config.output, MANIFEST), mime_type="application/json") as f:
        f.write(json.dumps(manifest, indent=2, ensure_ascii=False).encode("utf-8"))
    layout.remove_run_folder(config.output, plan.run_id)
    _LOG.info("wrote %s", join(config.output, MANIFEST))
    if manifest["flat_images"]["count"]:
        _LOG.info("records of one flat colour: %s, e.g. %s", manifest["flat_images"]["count"],
                  ", ".join(manifest["flat_images"]["examples"]))
    return manifest


def write_tfds_metadata(info: DatasetInfo) -> None:
    """TFDS's dataset_info.json, features.json and label names, where TFDS can read the shards."""
    reason = tfds_metadata.unsupported(info)
    if reason is not None:
        _LOG.info("no TFDS metadata written: %s", reason)
        return
    for filename, lines in tfds_metadata.metadata_files(info).items():
        write_lines(join(info.root, filename), lines)


def error_lines(failures: Iterable[Mapping[str, Any]]) -> list[str]:
    """errors.jsonl, one JSON object a line, sorted by path so reruns diff cleanly."""
    return [json.dumps(f, ensure_ascii=False, sort_keys=True)
            for f in sorted(failures, key=lambda f: f["path"])]


def read(output: str) -> dict[str, Any]:
    """The whole manifest (the dataset and the run's record), checked as the reader checks it.

    Raises:
      DatasetError: it cannot be read, or the reader could not use it.
    """
    path = join(output, MANIFEST)
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            text = f.read()
    except Exception as e:  # noqa: BLE001
        raise DatasetError(f"cannot read {path}: {e}") from e
    manifest = parse_manifest(text, path)
    DatasetInfo.from_json(manifest, output, path)
    return manifest
