"""The manifest's run record, checked before the report uses it: each count it shows a whole number, 0 or
more, each name a string, each group of counts an object. A manifest beam-prep did not write, or damaged,
stops the report with one line naming the key, before any page is written.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from beam_prep.errors import DatasetError

__all__ = ["check_manifest"]

# Objects of counts (name -> count), as the report reads them.
_COUNT_GROUPS = ("counts", "failed_by_stage", "skipped_by_reason", "duplicates.dropped_by_reason",
                 "sources.width", "sources.height", "sources.aspect")
# Single counts.
_COUNTS = ("duplicates.extra_copies", "duplicates.images", "duplicates.across_splits", "duplicates.near.distance",
           "duplicates.near.groups", "duplicates.near.across_splits", "sources.images", "sources.upscaled",
           "sources.cropped", "sources.padded", "sources.converted")
_TEXTS = ("created", "beam_prep_version", "imaging_library", "options.input")
_OBJECTS = ("options", "duplicates", "duplicates.near", "sources")
_MISSING = object()


def check_manifest(manifest: Mapping[str, Any], where: str) -> None:
    """Checks what the report reads of ``manifest`` (the file ``where``); each key may be missing (an older
    run's manifest), never of another type.

    Raises:
      DatasetError: the first key that is not what beam-prep writes, with its value and what to do.
    """
    for key in _OBJECTS:
        value = _at(manifest, key)
        if value is not _MISSING and value is not None and not isinstance(value, Mapping):
            _bad(where, key, value, "an object")
    for key in _TEXTS:
        value = _at(manifest, key)
        if value is not _MISSING and value is not None and not isinstance(value, str):
            _bad(where, key, value, "a string")
    labels = manifest.get("labels")
    if isinstance(labels, list):
        for i, name in enumerate(labels):
            if not isinstance(name, str):
                _bad(where, f"labels[{i}]", name, "a string")
    for key in _COUNTS:
        _check_count(where, key, _at(manifest, key))
    for key in _COUNT_GROUPS:
        _check_counts(where, key, _at(manifest, key))
    splits = manifest.get("splits")
    if isinstance(splits, Mapping):
        for name, split in splits.items():
            if not isinstance(split, Mapping):
                _bad(where, f"splits.{name}", split, "an object")
            _check_count(where, f"splits.{name}.num_examples", split.get("num_examples", _MISSING))
            _check_counts(where, f"splits.{name}.class_counts", split.get("class_counts", _MISSING))
            numbers = split.get("shard_num_examples")
            if isinstance(numbers, list):
                for i, n in enumerate(numbers):
                    _check_count(where, f"splits.{name}.shard_num_examples[{i}]", n)


def _at(manifest: Mapping[str, Any], key: str) -> Any:
    value: Any = manifest
    for part in key.split("."):
        if not isinstance(value, Mapping):
            return _MISSING  # its parent's type is checked on its own
        value = value.get(part, _MISSING)
    return value


def _check_counts(where: str, key: str, value: Any) -> None:
    if value is _MISSING or value is None:
        return
    if not isinstance(value, Mapping):
        _bad(where, key, value, "an object of counts")
    for name, n in value.items():
        _check_count(where, f"{key}.{name}", n)


def _check_count(where: str, key: str, value: Any) -> None:
    if value is _MISSING or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return
    _bad(where, key, value, "a count (a whole number, 0 or more)")


def _bad(where: str, key: str, value: Any, what: str) -> None:
    shown = json.dumps(value, ensure_ascii=False, default=str)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise DatasetError(f"{where}: {key} is {shown}, not {what}: the manifest is damaged or not one beam-prep "
                       "wrote (prepare the dataset again)")
