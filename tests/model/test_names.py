"""The one rule for names read from a dataset (``model/names.py``): a shard name is a plain file name in the
dataset folder, a path from duplicates.jsonl lies under the run's input; anything else is refused in one line
naming the file, the field and the value. Checked on the manifest model itself: no reader, no pipeline."""
from __future__ import annotations

import json
import re

import pytest

from beam_prep.errors import DatasetError, UnsafeName
from beam_prep.model.dataset import DatasetInfo, ImageInfo, SplitInfo, parse_manifest
from beam_prep.model.names import check_file_name, path_under

GOOD = "train-00000-of-00002.tfrecord.gz"
# Each hostile name and the reason the message gives.
HOSTILE = [
    ("../../victim/evil.txt", "climbs out of the folder with '..'"),
    ("..", "climbs out of the folder with '..'"),
    ("/etc/passwd", "is an absolute path"),
    ("C:evil.txt", "is an absolute path"),
    ("\\\\server\\share\\evil.txt", "is an absolute path"),
    ("sub/evil.txt", "holds a path separator (a file in another folder)"),
    ("sub\\evil.txt", "holds a path separator (a file in another folder)"),
    ("train\x00/../../victim/evil.txt", "holds a control character (NUL, a line break...)"),
    ("\uff0e\uff0e\uff0f\uff0e\uff0e\uff0fvictim\uff0fevil.txt", "climbs out of the folder with '..'"),  # fullwidth
    ("\u2025", "climbs out of the folder with '..'"),  # two dot leader: '..' once normalised
    (".", "names the folder itself"),
    ("", "is empty"),
]


def _manifest(shards) -> dict:
    info = DatasetInfo(root="", labels=("ant", "bee"), image=ImageInfo(8, 8),
                       splits={"train": SplitInfo("train", (GOOD, "placeholder"), 2, (1, 1))})
    manifest = info.to_json()
    manifest["splits"]["train"]["shards"] = shards
    return manifest


@pytest.mark.parametrize(("name", "why"), HOSTILE)
def test_a_manifest_naming_a_shard_outside_its_folder_is_refused_naming_the_file_field_and_value(name, why):
    text = json.dumps(_manifest([GOOD, name]))
    with pytest.raises(UnsafeName) as caught:
        DatasetInfo.from_json(parse_manifest(text, "/data/ds/manifest.json"), "/data/ds", "/data/ds/manifest.json")
    assert str(caught.value) == (f"/data/ds/manifest.json: splits.train.shards[1] is {name!r}, which {why}: a "
                                 "dataset names only files in its own folder, by their plain names")
    assert "\n" not in str(caught.value) and isinstance(caught.value, DatasetError)


@pytest.mark.parametrize(("name", "why"), HOSTILE[:2])
def test_a_manifest_naming_a_dali_index_outside_its_folder_is_refused(name, why):
    manifest = _manifest([GOOD, "placeholder"])
    manifest["splits"]["train"]["dali_index"] = [GOOD + ".idx", name]
    with pytest.raises(UnsafeName) as caught:
        DatasetInfo.from_json(manifest, "/data/ds", "/data/ds/manifest.json")
    assert str(caught.value).startswith(f"/data/ds/manifest.json: splits.train.dali_index[1] is {name!r}, which {why}")


@pytest.mark.parametrize("shards", [[GOOD, 7], "train.tfrecord.gz", [None]])
def test_shards_that_are_not_a_list_of_strings_are_refused(shards):
    with pytest.raises(DatasetError, match=r"^m.json: splits.train.shards"):
        DatasetInfo.from_json(_manifest(shards), "/data/ds", "m.json")


@pytest.mark.parametrize("name", [GOOD, "a.array_record", "train-00001-of-00004.tar", "\u00e9t\u00e9.tar", "..a.tar",
                                  "a..b.tfrecord"])
def test_plain_names_pass_and_stay_inside_the_folder(name):
    assert check_file_name(name, "splits.train.shards[0]") == name
    info = DatasetInfo.from_json(_manifest([name, GOOD]), "/data/ds", "m.json")
    assert info.splits["train"].files == (f"/data/ds/{name}", f"/data/ds/{GOOD}")


@pytest.mark.parametrize(("root", "path", "full"), [
    ("/in", "/in/cat/a.jpg", "/in/cat/a.jpg"),
    ("/in", "cat/a.jpg", "/in/cat/a.jpg"),  # relative: under the root once joined
    ("gs://b/in", "gs://b/in/cat/a.jpg", "gs://b/in/cat/a.jpg"),
    ("gs://b/in", "cat/a.jpg", "gs://b/in/cat/a.jpg"),
])
def test_a_path_under_the_input_is_opened_whole(root, path, full):
    assert path_under(root, path, "d.jsonl", "line 1's path") == full


@pytest.mark.parametrize(("root", "path"), [
    ("/in", "/victim/evil.jpg"), ("/in", "/in/../victim/evil.jpg"), ("/in", "../victim/evil.jpg"),
    ("/in", "/input/a.jpg"), ("/in", "/in"), ("/in", "/in/./a.jpg"), ("/in", "/in/a\x00.jpg"), ("/in", 3),
    ("gs://b/in", "gs://b/in/../x.jpg"), ("gs://b/in", "gs://other/in/a.jpg"), ("gs://b/in", "/in/a.jpg"),
])
def test_a_path_outside_the_input_is_refused_naming_it(root, path):
    with pytest.raises(UnsafeName, match=rf"^d.jsonl: line 3's path is {re.escape(repr(path))}, "
                                         rf"not a path under {root}"):
        path_under(root, path, "d.jsonl", "line 3's path")


def test_without_an_input_root_nothing_is_opened():
    with pytest.raises(UnsafeName, match=r"^d.jsonl: line 1's path is '/in/a.jpg', and the run recorded no input "
                                         r"folder"):
        path_under("", "/in/a.jpg", "d.jsonl", "line 1's path")
