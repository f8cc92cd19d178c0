"""A manifest is data: one naming a shard outside its folder (``../../victim/evil.txt``, an absolute
path, a fullwidth or NUL variant) is refused by every reader, ``verify``, ``inspect`` and the gs://
shard cache, with one line naming the manifest, the field and the value, before anything is read or
written: no file appears at the victim's path and the cache folder gains nothing.

On local disk and served by the GCS test server (tests/gcs_harness), where the objects the hostile
names point at exist, so that a reader that followed them would find bytes to write out.
"""
from __future__ import annotations

import json
import pathlib
import sys

import pytest
from helpers import REPO

import beam_prep
from beam_prep.errors import UnsafeName
from beam_prep.model.dataset import DatasetInfo, ImageInfo, SplitInfo
from pipelines import inspect_output, verify_output

pytestmark = pytest.mark.slow  # make_dataset and verify start TensorFlow; the gs:// cases the GCS test server

GOOD = "train-00000-of-00002"
# name(victim) -> the hostile shard name, and the reason the refusal gives. The dataset lies at
# BASE/a/ds and the cache at BASE/a/cache, so ../../victim is BASE/victim from both.
HOSTILE = {
    "parent": (lambda victim: "../../victim/evil.txt", "climbs out of the folder with '..'"),
    "absolute": (lambda victim: str(victim), "is an absolute path"),
    "fullwidth": (lambda victim: "\uff0e\uff0e\uff0f\uff0e\uff0e\uff0fvictim\uff0fevil.txt",
                  "climbs out of the folder with '..'"),
    "nul": (lambda victim: "evil\x00/../../victim/evil.txt", "holds a control character (NUL, a line break...)"),
}
SUFFIX = {"tfrecord": ".tfrecord.gz", "array_record": ".array_record", "webdataset": ".tar"}


def _manifest(file_format: str, hostile: str) -> dict:
    """A dataset's manifest (the writer's own model) whose train split lists a good shard, then ``hostile``."""
    good = GOOD + SUFFIX[file_format]
    info = DatasetInfo(root="", labels=("ant", "bee"), image=ImageInfo(8, 8), file_format=file_format,
                       compression="GZIP" if file_format == "tfrecord" else "NONE",
                       splits={"train": SplitInfo("train", (good, "placeholder"), 2, (1, 1), {"ant": 1, "bee": 1})})
    manifest = info.to_json()
    manifest["splits"]["train"]["shards"] = [good, hostile]
    return manifest


def _refusal(manifest_path: str, hostile: str, why: str) -> str:
    return (f"{manifest_path}: splits.train.shards[1] is {hostile!r}, which {why}: a dataset names only files "
            "in its own folder, by their plain names")


def _hostile(kind: str, base: pathlib.Path) -> tuple[pathlib.Path, str, str]:
    """``(victim, name, why)``: the victim path (absent) and the hostile name of kind ``kind`` pointing at it."""
    victim = base / "victim" / "evil.txt"
    make, why = HOSTILE[kind]
    return victim, make(victim), why


def _local(base: pathlib.Path, file_format: str, name: str) -> pathlib.Path:
    folder = base / "a" / "ds"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(_manifest(file_format, name)))
    return folder


def _serve(bucket, file_format: str, name: str) -> str:
    """The hostile manifest on the GCS test server, with objects at the names it gives where the server
    takes such a name (as a bucket someone else controls would hold them: a reader that followed them would
    find bytes to write out; the emulator drops the connection on a name with a ``..`` part)."""
    bucket.write_bytes("ds/manifest.json", json.dumps(_manifest(file_format, name)).encode())
    for shard in (GOOD + SUFFIX[file_format], name):
        if "\x00" not in shard and ".." not in shard.split("/"):
            bucket.write_bytes(f"ds/{shard}", b"bytes a follower would write out")
    return bucket.url("ds")


# Each reader, the format it reads, and how it is called on a dataset folder.
READERS = {
    "make_dataset": ("tfrecord", lambda path, cache: beam_prep.make_dataset(path, "train", batch_size=1)),
    "load_info": ("tfrecord", lambda path, cache: beam_prep.load_info(path)),
    "data_source": ("array_record", lambda path, cache: beam_prep.data_source(path, "train", cache_dir=cache)),
    "shard_urls": ("webdataset", lambda path, cache: beam_prep.shard_urls(path, "train", cache_dir=cache)),
    "shard_urls_uncached": ("webdataset", lambda path, cache: beam_prep.shard_urls(path, "train", cache_dir=False)),
    "webdataset_pipeline": ("webdataset",
                            lambda path, cache: beam_prep.webdataset_pipeline(path, "train", cache_dir=cache)),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_refuses_a_local_manifest_naming_a_shard_outside_its_folder(tmp_path, kind, reader):
    victim, name, why = _hostile(kind, tmp_path)
    file_format, read = READERS[reader]
    folder = _local(tmp_path, file_format, name)
    victim.parent.mkdir()
    victim.write_bytes(b"not a shard")  # there to be read, were the name followed
    cache = tmp_path / "a" / "cache"
    with pytest.raises(UnsafeName) as caught:
        read(str(folder), str(cache))
    assert str(caught.value) == _refusal(str(folder / "manifest.json"), name, why)
    assert not cache.exists()


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_inspect_and_verify_exit_2_on_a_local_manifest_naming_a_shard_outside_its_folder(tmp_path, kind, command,
                                                                                          capsys):
    victim, name, why = _hostile(kind, tmp_path)
    folder = _local(tmp_path, "tfrecord", name)
    main = inspect_output.main if command == "inspect" else verify_output.main
    assert main([str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "error: " + _refusal(str(folder / "manifest.json"), name, why)
    assert not victim.parent.exists()


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("reader", ["load_info", "data_source", "shard_urls", "shard_urls_uncached",
                                    "webdataset_pipeline"])
def test_the_shard_cache_and_every_reader_refuse_a_gs_manifest_naming_a_shard_outside_its_folder(
        gcs_server, gcs_bucket, tmp_path, kind, reader):
    victim, name, why = _hostile(kind, tmp_path)
    file_format, read = READERS[reader]
    url = _serve(gcs_bucket, file_format, name)
    cache = tmp_path / "a" / "cache"
    cache.mkdir(parents=True)
    (cache / "mine.txt").write_text("a user's own file")
    victim.parent.mkdir()  # there to be written into, were the name followed
    with pytest.raises(UnsafeName) as caught:
        read(url, str(cache))
    assert str(caught.value) == _refusal(f"{url}/manifest.json", name, why)
    assert list(victim.parent.iterdir()) == []  # no shard, no stamp, no partial file
    assert [p.name for p in cache.iterdir()] == ["mine.txt"]  # the cache made nothing, wrote nothing


@pytest.mark.parametrize("kind", ["parent", "absolute"])
def test_inspect_and_verify_exit_2_on_a_gs_manifest_naming_a_shard_outside_its_folder(gcs_server, gcs_bucket,
                                                                                      tmp_path, kind):
    victim, name, why = _hostile(kind, tmp_path)
    url = _serve(gcs_bucket, "tfrecord", name)
    victim.parent.mkdir()
    for module in ("pipelines.inspect_output", "pipelines.verify_output"):
        done = gcs_server.run([sys.executable, "-m", module, url], cwd=REPO, check=False)
        assert done.returncode == 2, done.stderr[-3000:]
        assert done.stderr.strip().splitlines()[-1] == "error: " + _refusal(f"{url}/manifest.json", name, why)
    assert list(victim.parent.iterdir()) == []


def test_a_manifest_of_plain_names_reads(tmp_path):
    """The check refuses names, not datasets: the same manifest with plain names passes."""
    folder = _local(tmp_path, "webdataset", "train-00001-of-00002.tar")
    assert beam_prep.shard_urls(folder, "train", cache_dir=False) == [str(folder / f"{GOOD}.tar"),
                                                                      str(folder / "train-00001-of-00002.tar")]


@pytest.mark.parametrize("name", [".beam-prep-cache.json", ".use.lock", ".fill.lock", ".reserved", ".last_used",
                                  ".stamps"])
def test_the_shard_cache_refuses_a_shard_named_as_one_of_its_own_files(gcs_server, gcs_bucket, tmp_path, name):
    """A shard named as the cache's marker or one of its locks would be written over it: a folder whose
    marker is the shard's bytes is no longer the cache's (never evicted, never counted), one whose
    ``use`` lock is replaced is evicted under its readers. Refused before anything is fetched."""
    url = _serve(gcs_bucket, "array_record", name)
    cache = tmp_path / "cache"
    with pytest.raises(UnsafeName) as caught:
        beam_prep.data_source(url, "train", cache_dir=str(cache))
    assert str(caught.value) == (
        f"{url}/manifest.json: splits.train.shards[1] is {name!r}, which the shard cache keeps for its own "
        "files: a dataset's shards are not named so")
    assert not cache.exists() or list(cache.iterdir()) in ([], [cache / ".evict.lock"])
