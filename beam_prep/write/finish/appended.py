"""An append's manifest: the dataset's, with the new version's shards after each split's own.

``merge`` is pure, as ``manifest.build`` is: the manifest an append's records would have alone
(``build``'s) and the dataset's, into the one published. Every earlier shard, record count and
label id stays; counts of what happened to files add up over the versions; the options stay the
dataset's (each version says its input).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from beam_prep.model.dataset import DatasetInfo, VersionInfo
from beam_prep.write.finish import duplicates

__all__ = ["merge"]

# Per-shard lists of a split, in the order of its shards: an append's go after the dataset's.
_SHARD_LISTS = ("shards", "shard_num_examples", "shard_bytes", "shard_sha256", "dali_index")
# The run's records that add up over the versions (the others are the latest run's, or the dataset's).
_SUMMED = ("counts", "failed_by_stage", "skipped_by_reason", "originals", "flat_images", "duplicates", "sources",
           "jpeg_path")


def merge(old: Mapping[str, Any], new: Mapping[str, Any], version: int, source: str | None,
          appended: Mapping[str, Any]) -> dict[str, Any]:
    """The dataset's manifest ``old`` with the append's ``new`` added as version ``version``.

    Args:
      old: the dataset's manifest, as published (its versions, or none: version 1 holding all).
      new: ``manifest.build``'s for the append's records alone; its labels are the dataset's,
        new ones after them.
      version: the version the append makes (``old``'s latest plus one).
      source: the append's input (``versions[].input``).
      appended: what the append left out (``append.Additions.counts``), for ``versions[].appended``.

    Returns:
      The manifest to publish.
    """
    history = DatasetInfo.from_json(old, "", "manifest.json").history
    splits: dict[str, Any] = {}
    for name in [*old["splits"], *(s for s in new["splits"] if s not in old["splits"])]:
        splits[name] = _split(old["splits"].get(name), new["splits"].get(name), new["labels"])
    added = DatasetInfo.from_json({**new, "versions": None}, "", "manifest.json")
    latest = VersionInfo(version, {name: (s.shards, s.num_examples, s.class_counts) for name, s in added.splits.items()},
                         len(new["labels"]), new["created"], source, dict(appended))
    out = {**new, "splits": splits, "options": old.get("options", new.get("options"))}
    for key in _SUMMED:
        out[key] = _added(old.get(key), new.get(key))
    found = out["duplicates"]
    if isinstance(found, dict):
        found["examples"] = list(found.get("examples") or [])[:duplicates.EXAMPLES]
        if isinstance(found.get("near"), dict) and isinstance(new["duplicates"].get("near"), dict):
            found["near"]["distance"] = new["duplicates"]["near"]["distance"]  # a setting, not a count
    out["versions"] = [*(v.to_json() for v in history), latest.to_json()]
    return out


def _split(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, labels: list[str]) -> dict[str, Any]:
    """One split: the dataset's shards, then the append's; records and records per label added up."""
    if old is None or new is None:
        return dict(old or new)
    out: dict[str, Any] = {"num_examples": old["num_examples"] + new["num_examples"]}
    for key in _SHARD_LISTS:
        if key in old and key in new:  # a list only where both versions know each shard's
            out[key] = [*old[key], *new[key]]
    if "class_counts" in old and "class_counts" in new:
        out["class_counts"] = {label: old["class_counts"].get(label, 0) + new["class_counts"].get(label, 0)
                               for label in labels}
    return {key: out[key] for key in ("num_examples", "shards", "class_counts", *_SHARD_LISTS[1:]) if key in out}


def _added(old: Any, new: Any) -> Any:
    """Two runs' records of one kind added up: numbers summed, objects key by key, lists one after the
    other; where only one run has it, its own."""
    if old is None or new is None:
        return new if old is None else old
    if isinstance(old, bool) or isinstance(new, bool):
        return new
    if isinstance(old, (int, float)) and isinstance(new, (int, float)):
        return old + new
    if isinstance(old, dict) and isinstance(new, dict):
        return {key: _added(old.get(key), new.get(key)) for key in [*old, *(k for k in new if k not in old)]}
    if isinstance(old, list) and isinstance(new, list):
        return [*old, *new]
    return new
