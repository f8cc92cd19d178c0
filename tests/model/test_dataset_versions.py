"""A dataset's versions in its manifest: version 1 for a first run (or a manifest written before
versions), each read back exactly with ``at_version``. Manifests made by the dataset model: no pipeline."""
from __future__ import annotations

import json

import pytest

from beam_prep.errors import DatasetError
from beam_prep.model.dataset import DatasetInfo, ImageInfo, SplitInfo, VersionInfo

SHARDS = tuple(f"train-0000{i}-of-00003.tfrecord.gz" for i in range(3))


def _info(versions: tuple[VersionInfo, ...] = ()) -> DatasetInfo:
    train = SplitInfo("train", SHARDS, 9, shard_num_examples=(4, 3, 2), class_counts={"ant": 5, "bee": 3, "cat": 1},
                      root="/ds", shard_bytes=(40, 30, 20), shard_sha256=("a", "b", "c"))
    return DatasetInfo(root="/ds", labels=("ant", "bee", "cat"), image=ImageInfo(8, 8), splits={"train": train},
                       versions=versions)


TWO = (VersionInfo(1, {"train": (SHARDS[:2], 7, {"ant": 4, "bee": 3})}, 2, "2026-01-01T00:00:00+00:00", "/in"),
       VersionInfo(2, {"train": (SHARDS[2:], 2, {"ant": 1, "cat": 1})}, 3, "2026-02-01T00:00:00+00:00", "/new"))


def _read(manifest: dict) -> DatasetInfo:
    return DatasetInfo.from_json(json.loads(json.dumps(manifest)), "/ds", "/ds/manifest.json")


def test_a_manifest_without_versions_holds_version_1_with_everything():
    manifest = {**_info().to_json(), "created": "2025-05-05T00:00:00+00:00", "options": {"input": "/in"}}
    assert "versions" not in manifest  # a description made without versions writes none
    info = _read(manifest)
    (only,) = info.history
    assert (only.version, only.created, only.input, only.num_labels) == (1, "2025-05-05T00:00:00+00:00", "/in", 3)
    assert only.added == {"train": (SHARDS, 9, {"ant": 5, "bee": 3, "cat": 1})}
    assert info.version == 1 and info.at_version(1) == info and info.at_version(None) == info


def test_an_earlier_version_holds_its_shards_records_and_labels_only():
    info = _read(_info(TWO).to_json())
    assert info.history == TWO and info.version == 2
    first = info.at_version(1)
    train = first.splits["train"]
    assert first.labels == ("ant", "bee") and first.version == 1
    assert (train.shards, train.num_examples, train.class_counts) == (SHARDS[:2], 7, {"ant": 4, "bee": 3})
    assert (train.shard_num_examples, train.shard_bytes, train.shard_sha256) == ((4, 3), (40, 30), ("a", "b"))
    assert train.files == ("/ds/" + SHARDS[0], "/ds/" + SHARDS[1])
    assert info.at_version(2) == info


def test_a_split_an_append_brought_is_not_in_earlier_versions():
    validation = SplitInfo("validation", ("validation-00000-of-00001.tfrecord.gz",), 1)
    info = _info((TWO[0], VersionInfo(2, {**TWO[1].added, "validation": (validation.shards, 1, None)}, 3)))
    info = _read({**info.to_json(), "splits": {**info.to_json()["splits"], "validation": validation.to_json()}})
    assert list(info.at_version(1).splits) == ["train"]
    assert list(info.splits) == ["train", "validation"]


@pytest.mark.parametrize("version", [0, 3, -1, "1", 1.0, True])
def test_a_version_that_does_not_exist_is_one_line_naming_the_versions(version):
    with pytest.raises(DatasetError, match=rf"^/ds has no version {version!r}: it has versions 1-2$"):
        _info(TWO).at_version(version)
    with pytest.raises(DatasetError, match=r"^/ds has no version 2: it has version 1$"):
        _info().at_version(2)


@pytest.mark.parametrize("edit,reason", [
    (lambda v: v.__setitem__(1, {**v[1], "version": 3}), r"versions\[1\] is version 3, not 2"),
    (lambda v: v[1]["splits"]["train"]["shards"].reverse(), r"the versions' shards of split 'train' are not its"),
    (lambda v: v[1]["splits"].update(test={"shards": [], "num_examples": 0}), r"version 2 adds to split 'test', which splits lacks"),
    (lambda v: v.clear(), r"versions is empty"),
    (lambda v: v[1].update(num_labels=1), r"version 2 has 1 labels, of 3"),
])
def test_damaged_versions_are_refused_in_one_line(edit, reason):
    manifest = _info(TWO).to_json()
    manifest["versions"][1]["splits"]["train"]["shards"] = list(SHARDS[1:])  # a list edit can reverse
    manifest["versions"][0]["splits"]["train"]["shards"] = list(SHARDS[:1])
    edit(manifest["versions"])
    with pytest.raises(DatasetError, match=rf"^/ds/manifest.json is damaged: {reason}"):
        _read(manifest)


def test_versions_that_are_not_a_list_or_lack_a_key_are_malformed():
    for versions in ({"1": {}}, [{"version": 1}]):
        with pytest.raises(DatasetError, match=r"^/ds/manifest.json(: versions is| is incomplete or malformed)"):
            _read({**_info().to_json(), "versions": versions})
