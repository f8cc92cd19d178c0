"""The one rule for names read from a dataset (``model/names.py``): a split, shard or index name is one
beam-prep writes (ASCII letters, digits, ``.``, ``_``, ``-``, not ``.`` or ``-`` first, at most 255 bytes),
each file named once in any case; a path from duplicates.jsonl lies under the run's input; anything else is
refused in one line naming the file, the field and the value. Checked on the manifest model itself: no
reader, no pipeline (tests/reader/test_hostile_manifest.py puts the same names through every reader)."""
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
_CHARS = "(beam-prep writes names of ASCII letters, digits, '.', '_' and '-' only)"
_FIRST = "(beam-prep's names start with a letter, a digit or '_': '.' makes a hidden file, '-' an option to a command)"
# Names that stay in the folder but are not names beam-prep writes: words for a shell (WebDataset's pipe:
# runs its URL in one), lookalikes, hidden files and options.
OUTSIDE_THE_ALLOW_LIST = [
    ("train-00000.tar;touch${IFS}PWNED;#", f"holds ';' {_CHARS}"),
    ("train-00000.tar|sh", f"holds '|' {_CHARS}"),
    ("train-$(touch PWNED).tar", f"holds '$' {_CHARS}"),
    ("train-`touch PWNED`.tar", f"holds '`' {_CHARS}"),
    ("train.tar&touch", f"holds '&' {_CHARS}"),
    ("train 00000.tar", f"holds ' ' {_CHARS}"),
    ("train${IFS}x.tar", f"holds '$' {_CHARS}"),
    ("'train'.tar", f"holds \"'\" {_CHARS}"),
    ("\uff54\uff52\uff41\uff49\uff4e.tar", f"holds '\uff54' {_CHARS}"),  # fullwidth "train"
    ("\u00e9t\u00e9.tar", f"holds '\u00e9' {_CHARS}"),
    ("train*.tar", f"holds '*' {_CHARS}"),
    (".stamps", f"starts with '.' {_FIRST}"),
    ("..a.tar", f"starts with '.' {_FIRST}"),
    ("-rf.tar", f"starts with '-' {_FIRST}"),
    ("a" * 256, "is 256 bytes long, more than a file name may be (255)"),
]


def _manifest(shards) -> dict:
    info = DatasetInfo(root="", labels=("ant", "bee"), image=ImageInfo(8, 8),
                       splits={"train": SplitInfo("train", (GOOD, "placeholder"), 2, (1, 1))})
    manifest = info.to_json()
    manifest["splits"]["train"]["shards"] = shards
    return manifest


def _shown(name: str) -> str:
    return repr(name) if len(name) <= 300 else f"{name[:300]!r}... ({len(name)} characters)"


@pytest.mark.parametrize(("name", "why"), HOSTILE + OUTSIDE_THE_ALLOW_LIST)
def test_a_manifest_naming_a_shard_beam_prep_never_writes_is_refused_naming_the_file_field_and_value(name, why):
    text = json.dumps(_manifest([GOOD, name]))
    with pytest.raises(UnsafeName) as caught:
        DatasetInfo.from_json(parse_manifest(text, "/data/ds/manifest.json"), "/data/ds", "/data/ds/manifest.json")
    assert str(caught.value) == (f"/data/ds/manifest.json: splits.train.shards[1] is {_shown(name)}, which {why}: a "
                                 "dataset names only files in its own folder, by their plain names")
    assert "\n" not in str(caught.value) and isinstance(caught.value, DatasetError)


@pytest.mark.parametrize(("name", "why"), OUTSIDE_THE_ALLOW_LIST[:4] + HOSTILE[:1])
def test_a_split_named_as_beam_prep_never_names_one_is_refused(name, why):
    manifest = _manifest([GOOD, "train-00001-of-00002.tfrecord.gz"])
    manifest["splits"] = {name: manifest["splits"]["train"]}
    with pytest.raises(UnsafeName) as caught:
        DatasetInfo.from_json(manifest, "/data/ds", "m.json")
    assert str(caught.value).startswith(f"m.json: a split's name is {name!r}, which {why}: ")


# A file named twice in a split: the second name, the field of the first, and how they are the same.
TWICE = [
    ([GOOD, GOOD], None, f"splits.train.shards[1] is {GOOD!r}, which names the same file as splits.train.shards[0]"),
    ([GOOD, GOOD.upper()], None, f"splits.train.shards[1] is {GOOD.upper()!r}, which names the same file as "
                                 f"splits.train.shards[0] ({GOOD!r}) where case is not told apart (macOS, Windows)"),
    ([GOOD, "Manifest.json"], None, "splits.train.shards[1] is 'Manifest.json', which names the same file as "
                                    "the manifest ('manifest.json') where case is not told apart"),
    ([GOOD, "manifest.json"], None, "splits.train.shards[1] is 'manifest.json', which names the same file as "
                                    "the manifest"),
    ([GOOD, "b.tfrecord"], ["a.idx", "a.idx"], "splits.train.dali_index[1] is 'a.idx', which names the same file "
                                               "as splits.train.dali_index[0]"),
    ([GOOD, "b.tfrecord"], ["a.idx", "B.tfrecord"], "splits.train.dali_index[1] is 'B.tfrecord', which names the "
                                                    "same file as splits.train.shards[1] ('b.tfrecord')"),
]


@pytest.mark.parametrize(("shards", "index", "message"), TWICE)
def test_a_file_named_twice_in_a_split_in_any_case_is_refused(shards, index, message):
    manifest = _manifest(shards)
    if index is not None:
        manifest["splits"]["train"]["dali_index"] = index
    with pytest.raises(UnsafeName) as caught:
        DatasetInfo.from_json(manifest, "/data/ds", "m.json")
    assert str(caught.value).startswith(f"m.json: {message}")
    assert "\n" not in str(caught.value)


def test_a_shard_two_splits_name_is_refused():
    """Beam-prep never writes one file into two splits: read so, every record of it would be in both."""
    manifest = _manifest([GOOD, "train-00001-of-00002.tfrecord.gz"])
    manifest["splits"]["validation"] = dict(manifest["splits"]["train"], shards=["v.tfrecord.gz", GOOD])
    with pytest.raises(UnsafeName, match=re.escape(f"m.json: splits.validation.shards[1] is {GOOD!r}, which names "
                                                   "the same file as splits.train.shards[0]: ")):
        DatasetInfo.from_json(manifest, "/data/ds", "m.json")


@pytest.mark.parametrize("name", ["train-00001-of-00002.tfrecord.gz", "a.array_record", "train-00001-of-00004.tar",
                                  "_train.tar", "a..b.tfrecord", "A-Z_0.9", "a" * 255,
                                  "dali-train-00000-of-00004.tfrecord.idx"])
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
