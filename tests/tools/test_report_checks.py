"""The manifest's run record checked before the report shows it: a count of the wrong type, or below 0,
a name that is not a string, a group of counts that is not an object, each stops the report with one
line naming the key (the command's exit 2 and no page: tests/tools/test_report.py)."""
from __future__ import annotations

import copy

import pytest

from beam_prep.errors import DatasetError
from beam_prep.tools.report.checks import check_manifest

GOOD = {
    "labels": ["cat", "dog"], "created": "2026-01-01T00:00:00+00:00", "beam_prep_version": "0.1.0",
    "splits": {"train": {"num_examples": 3, "class_counts": {"cat": 2, "dog": 1}, "shard_num_examples": [3]}},
    "counts": {"listed": 4, "written": 3, "failed": 1, "skipped": 0}, "failed_by_stage": {"decode": 1},
    "skipped_by_reason": {}, "options": {"input": "/data/pets", "image_size": 16},
    "duplicates": {"images": 0, "extra_copies": 0, "across_splits": 0, "dropped_by_reason": {"copy": 0},
                   "near": {"distance": 6, "groups": 0, "across_splits": 0}},
    "sources": {"images": 3, "width": {"0": 3, "64": 0}, "height": {"0": 3}, "aspect": {"0": 0, "1.12": 3},
                "upscaled": 0, "cropped": 3, "padded": 0, "converted": 0},
}


def test_a_manifest_beam_prep_writes_passes_and_so_does_an_older_one_without_the_newer_keys():
    check_manifest(GOOD, "m.json")
    check_manifest({k: v for k, v in GOOD.items() if k not in ("sources", "duplicates", "options")}, "m.json")
    check_manifest({**GOOD, "duplicates": {**GOOD["duplicates"], "near": None}}, "m.json")  # no near search
    check_manifest({**GOOD, "counts": {"listed": 10**30}}, "m.json")  # huge, but a count


def _with(key: str, value):
    manifest = copy.deepcopy(GOOD)
    *parents, last = key.split(".")
    at = manifest
    for part in parents:
        at = at[part]
    at[last] = value
    return manifest


@pytest.mark.parametrize("key, value, said", [
    ("labels", [1, "dog"], "labels[0] is 1, not a string"),
    ("splits.train.num_examples", -5, "splits.train.num_examples is -5, not a count"),
    ("splits.train.class_counts.cat", "2", 'splits.train.class_counts.cat is "2", not a count'),
    ("splits.train.class_counts.cat", 2.5, "splits.train.class_counts.cat is 2.5, not a count"),
    ("splits.train.class_counts.cat", True, "splits.train.class_counts.cat is true, not a count"),
    ("splits.train.shard_num_examples", [-1], "splits.train.shard_num_examples[0] is -1, not a count"),
    ("counts", "x", 'counts is "x", not an object of counts'),
    ("counts.failed", -1, "counts.failed is -1, not a count"),
    ("failed_by_stage.decode", None, "failed_by_stage.decode is null, not a count"),
    ("skipped_by_reason", [1], "skipped_by_reason is [1], not an object of counts"),
    ("options", ["--input"], 'options is ["--input"], not an object'),
    ("options.input", 7, "options.input is 7, not a string"),
    ("created", 5, "created is 5, not a string"),
    ("duplicates", [], "duplicates is [], not an object"),
    ("duplicates.near", "x", 'duplicates.near is "x", not an object'),
    ("duplicates.near.groups", -2, "duplicates.near.groups is -2, not a count"),
    ("duplicates.dropped_by_reason", [1], "duplicates.dropped_by_reason is [1], not an object of counts"),
    ("sources.images", "x", 'sources.images is "x", not a count'),
    ("sources.width", {"0": -5}, "sources.width.0 is -5, not a count"),
    ("sources.aspect", [1], "sources.aspect is [1], not an object of counts"),
])
def test_a_value_the_writer_never_writes_is_one_error_naming_its_key(key, value, said):
    with pytest.raises(DatasetError) as raised:
        check_manifest(_with(key, value), "out/manifest.json")
    message = str(raised.value)
    assert message.startswith(f"out/manifest.json: {said}") and "\n" not in message
    assert message.endswith("the manifest is damaged or not one beam-prep wrote (prepare the dataset again)")


def test_a_long_value_is_cut_in_the_message():
    with pytest.raises(DatasetError) as raised:
        check_manifest(_with("created", ["x" * 10_000]), "m.json")
    assert len(str(raised.value)) < 300
