"""manifest.json: what a dataset holds, built from what its shards report (``build``, a pure
function: nothing is read or written) and read back (``read``). ``publish`` writes it, last,
so that its presence means complete."""
from __future__ import annotations

import collections
import dataclasses
import datetime
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import beam_prep
from beam_prep.errors import DatasetError
from beam_prep.io.dali_index import index_name
from beam_prep.io.storage import join, read_bytes
from beam_prep.model.dataset import (
    COMPRESSIONS,
    FORMAT_VERSION,
    MANIFEST,
    DatasetInfo,
    SplitInfo,
    VersionInfo,
    parse_manifest,
)
from beam_prep.model.features import LABEL_KEYS, SCHEMA
from beam_prep.write.finish import duplicates
from beam_prep.write.images import imaging, jpeg_path, resample, sources
from beam_prep.write.images.flat import FlatImages
from beam_prep.write.images.imaging import KEPT, ORIGINAL, REENCODE_REASONS
from beam_prep.write.plan.config import PrepareConfig
from beam_prep.write.plan.run_plan import RunPlan
from beam_prep.write.shared import layout
from beam_prep.write.shared.shard_formats import dali_indexed

__all__ = ["FORMAT_VERSION", "build", "read"]

_LOG = logging.getLogger(__name__)


def build(
    config: PrepareConfig,
    plan: RunPlan,
    shards: Iterable[tuple[str, str, int | None] | tuple[str, str, int | None, int | None, str | None]],
    counts: Iterable[tuple[tuple[str, str], int]],
    failures: list[Mapping[str, Any]],
    originals: Iterable[tuple[str, int]] = (),
    copies: Mapping[str, Any] | None = None,
    flat: Iterable[FlatImages] = (),
    resized: Iterable[tuple[str, int]] = (),
    dropped: int | None = None,
    set_apart: int = 0,
) -> dict[str, Any]:
    """The manifest dict; checks that every listed file is written or failed.

    ``shards``: ``(split, name, records[, size, sha256])`` per shard (``publish.ShardReports``);
    a split's ``shard_bytes`` and ``shard_sha256`` are left out unless every shard has them.

    ``originals``: ``(KEPT or a re-encode reason, records)`` rows, with
    ``--image_format original``, which must account for every record written.
    ``copies``: the duplicates found (``duplicates.Duplicates.to_json``).
    ``flat``: the parts of the records of one flat colour (``SinkResult.flat``).
    ``resized``: what resized the images, counted (``resample.counting``; ``resample.summary``).
    ``dropped``: with ``--cross_split_duplicates drop``, the records left out of the shards
    (``drop.rewrite``): ``listed = written + failed + dropped``; ``originals``, ``flat`` and
    ``resized`` count them still (every image converted). None: the action is another.
    ``set_apart``: an append's records left out of the shards as the dataset's own or copies of them
    (``copies``), which ``plan`` counts as ``prepare --append`` counts them, not listed;
    ``originals``, ``flat`` and ``resized`` count them still.

    Raises:
      DatasetError: if the counts do not add up (a record was lost: never write a
        manifest for such a dataset).
    """
    class_counts = collections.Counter()
    for (split, label), n in counts:
        class_counts[split, label] += n
    shard_rows = collections.defaultdict(dict)
    sums = collections.defaultdict(dict)
    for split, name, n, *checksum in shards:  # checksum: (size, sha256) where the sink reports them
        shard_rows[split][name] = n
        sums[split][name] = tuple(checksum) or (None, None)
    splits = {}
    for split, count in plan.num_shards.items():
        # A count of 0: the runner chose how many (WriteImageDataset without num_shards).
        names = (tuple(layout.shard_name(split, i, count, config.shard_suffix, config.version) for i in range(count))
                 if count else tuple(sorted(shard_rows[split])))
        if plan.multi_label:  # a record counts under each of its labels: its shards' counts are the records
            num_examples = sum(n or 0 for n in shard_rows[split].values())
        elif not plan.labels:  # a dataset without labels: its records count under the empty name
            num_examples = class_counts[split, ""]
        else:
            num_examples = sum(class_counts[split, label] for label in plan.labels)
        unreported = [name for name in names if name not in shard_rows[split]]
        if unreported or (num_examples and not names):
            raise DatasetError(
                f"split {split!r} holds {num_examples} records but its writer did not report "
                f"{unreported[0] if unreported else 'any shard file'}: no manifest written")
        splits[split] = SplitInfo(
            name=split, shards=names,
            num_examples=num_examples,
            shard_num_examples=_known(shard_rows[split][name] for name in names),
            class_counts={label: class_counts[split, label] for label in plan.labels},
            root=config.output,
            shard_bytes=_known(sums[split][name][0] for name in names),
            shard_sha256=_known(sums[split][name][1] for name in names),
            dali_index=_dali_index(config, names))
    written = sum(s.num_examples for s in splits.values())
    if written + len(failures) + (dropped or 0) != plan.listed:
        left_out = f", {dropped} dropped" if dropped is not None else ""
        raise DatasetError(
            f"{plan.listed} files listed but {written} written{left_out} and {len(failures)} failed: "
            "records were lost; no manifest written")
    kept_or_not = _originals(config, originals, written + (dropped or 0) + set_apart)
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    info = DatasetInfo(root=config.output, labels=tuple(plan.labels), splits=splits,
                       image=config.spec.info, compression=COMPRESSIONS[config.compression].manifest_name,
                       label_offset=config.label_offset, multi_label=plan.multi_label,
                       extra_features=dict(plan.extra_features), file_format=config.file_format,
                       versions=(VersionInfo.whole(plan.labels, splits, created, config.input or None),))
    dataset = info.to_json()
    by_stage = collections.Counter(f["stage"] for f in failures)
    return {
        "format_version": dataset.pop("format_version"),
        "beam_prep_version": beam_prep.__version__,
        "imaging_library": imaging.library(),
        **resample.summary(resized),
        "created": created,
        **dataset,
        "features": {**{key: kind.value for key, kind in SCHEMA.items() if plan.labels or key not in LABEL_KEYS},
                     **plan.extra_features},
        "counts": {"listed": plan.listed, "written": written, "failed": len(failures),
                   "skipped": plan.skipped, **({"dropped": dropped} if dropped is not None else {})},
        "failed_by_stage": dict(sorted(by_stage.items())),
        "skipped_by_reason": dict(plan.skipped_by_reason),
        **kept_or_not,
        "flat_images": FlatImages().merge(*flat).manifest(),
        **sources.summary(resized),
        **jpeg_path.summary(resized),
        "duplicates": dict(copies) if copies is not None else duplicates.Duplicates().to_json(),
        "sink": plan.sink,
        "options": _options(config),
    }


def _dali_index(config: PrepareConfig, shards: tuple[str, ...]) -> tuple[str, ...] | None:
    """Each shard's DALI index file, where the writer wrote them (``shard_formats.dali_indexed``)."""
    if not dali_indexed(config.file_format, config.compression):
        return None
    return tuple(index_name(shard) for shard in shards)


def _known(values: Iterable[Any]) -> tuple[Any, ...] | None:
    """A split's per-shard values, or None where one shard's is not known (the key is left out)."""
    values = tuple(values)
    return values if all(v is not None for v in values) else None


def _originals(config: PrepareConfig, rows: Iterable[tuple[str, int]], written: int) -> dict[str, Any]:
    """``{"originals": ...}``: how many sources were kept byte for byte and how many re-encoded, by
    reason, with ``--image_format original``; nothing otherwise. ``written``: the records made
    (those left out by ``--cross_split_duplicates drop`` included).

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
    del options["perceptual_hash"]  # near_duplicate_distance says it
    return options


def read(output: str) -> dict[str, Any]:
    """The whole manifest (the dataset and the run's record), checked as the reader checks it.

    Raises:
      DatasetError: it cannot be read, or the reader could not use it.
    """
    path = join(output, MANIFEST)
    try:
        text = read_bytes(path)
    except Exception as e:
        raise DatasetError(f"cannot read {path}: {e}") from e
    manifest = parse_manifest(text, path)
    DatasetInfo.from_json(manifest, output, path)
    return manifest
