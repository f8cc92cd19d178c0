"""``data_source("gs://...")`` through the local shard cache, on the real test GCS server (tests/gcs_harness).

One small array_record dataset, prepared locally and uploaded. What the gateway saw tells how many
times each shard was fetched; the records read are compared with the local dataset's own.

Eviction is tested with other processes (``tests/children/cache_reader.py``) filling and reading
the same cache: what it may touch (only the folders the cache made), what it must spare (a folder
being filled or read) and its bound (folders in use count toward it). The processes meet through
files, never sleeps.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import time
import urllib.parse

import pytest
from helpers import REPO, child, make_tree, prepare_here

import beam_prep
from beam_prep.errors import DatasetError, StorageError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory):
    tree = tmp_path_factory.mktemp("tree")
    make_tree(tree, {"ant": 12, "bee": 9, "cat": 7}, size=(8, 8))
    out = tmp_path_factory.mktemp("ds") / "ds"
    prepare_here("--input", str(tree), "--output", str(out), "--file_format", "array_record",
                 "--image_size", "8", "--validation_percent", "20", "--num_shards", "3", "--label_offset", "1")
    return out


@pytest.fixture
def uploaded(gcs_server, gcs_bucket, local_dataset):
    gcs_bucket.upload_tree(local_dataset, "ds")
    return gcs_bucket.url("ds")


def shard_gets(gcs_server, bucket, since: int = 0) -> list[str]:
    """The shard names the gateway served (a media GET each), in order."""
    out = []
    for r in gcs_server.gateway.seen()[since:]:
        if bucket.name in r.buckets and r.method == "GET" and "alt=media" in r.path and r.status == 200:
            name = urllib.parse.unquote(r.path.split("/o/", 1)[1].split("?", 1)[0])
            if name.endswith(".array_record"):
                out.append(name.rsplit("/", 1)[-1])
    return out


def readable(origin: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", origin[len("gs://"):])[-80:]


def folder_name(origin: str, manifest: bytes) -> str:
    """The name the cache gives a dataset's folder, as the guide computes it: predictable by anyone."""
    return (f"{readable(origin)}-{hashlib.sha256(origin.encode()).hexdigest()[:16]}"
            f"-{hashlib.sha256(manifest).hexdigest()[:16]}")


def earlier_folder_name(origin: str, manifest: bytes) -> str:
    """The name an earlier beam-prep gave it (without the origin's hash)."""
    return f"{readable(origin)}-{hashlib.sha256(manifest).hexdigest()[:16]}"


def records(source) -> list[tuple]:
    return [(r["filename"], r["label"], r["image"].tobytes()) for r in source]


def test_a_gs_dataset_is_read_through_the_cache_fetched_once_and_reused(gcs_server, gcs_bucket, uploaded,
                                                                         local_dataset, tmp_path):
    cache = tmp_path / "cache"
    shards = json.loads((local_dataset / "manifest.json").read_text())["splits"]["train"]["shards"]
    source = beam_prep.data_source(uploaded, "train", cache_dir=cache)
    assert records(source) == records(beam_prep.data_source(local_dataset, "train"))
    assert source.targets == beam_prep.data_source(local_dataset, "train").targets
    assert sorted(shard_gets(gcs_server, gcs_bucket)) == sorted(shards)  # each shard once, train only
    since = len(gcs_server.gateway.seen())
    again = beam_prep.data_source(uploaded, "train", cache_dir=cache)
    assert records(again) == records(source) and shard_gets(gcs_server, gcs_bucket, since) == []


def test_a_damaged_cached_shard_is_detected_and_fetched_again(gcs_server, gcs_bucket, uploaded, local_dataset,
                                                              tmp_path):
    cache = tmp_path / "cache"
    expected = records(beam_prep.data_source(uploaded, "train", cache_dir=cache))
    (folder,) = [p for p in cache.iterdir() if p.is_dir()]
    damaged = sorted(folder.glob("train-*.array_record"))[1]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    damaged.write_bytes(bytes(data))
    # Another changed and stamped anew (its size, time and new sha256): the manifest's sha256 still tells.
    restamped = min(folder.glob("train-*.array_record"))
    data = bytearray(restamped.read_bytes())
    data[len(data) // 2] ^= 0xFF
    restamped.write_bytes(bytes(data))
    stat = restamped.stat()
    (folder / ".stamps" / f"{restamped.name}.json").write_text(json.dumps(
        {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": hashlib.sha256(data).hexdigest()}))
    since = len(gcs_server.gateway.seen())
    assert records(beam_prep.data_source(uploaded, "train", cache_dir=cache)) == expected
    assert sorted(shard_gets(gcs_server, gcs_bucket, since)) == sorted([damaged.name, restamped.name])


def test_a_shard_whose_bytes_on_gcs_differ_from_the_manifest_sha256_is_refused_naming_it(
        gcs_server, gcs_bucket, uploaded, local_dataset, tmp_path):
    """GCS's CRC32C matches the bytes it holds; the manifest's sha256 says they are not the dataset's."""
    manifest = json.loads((local_dataset / "manifest.json").read_text())["splits"]["train"]
    name = manifest["shards"][1]
    data = bytearray((local_dataset / name).read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    gcs_bucket.write_bytes(f"ds/{name}", bytes(data))
    cache = tmp_path / "cache"
    with pytest.raises(DatasetError, match=(rf"^shard gs://.*/ds/{name} has sha256 [0-9a-f]{{64}} but the dataset's "
                                            rf"manifest records {manifest['shard_sha256'][1]} \(fetched twice\)")):
        beam_prep.data_source(uploaded, "train", cache_dir=cache)
    assert shard_gets(gcs_server, gcs_bucket).count(name) == 2  # fetched once more before refusing
    assert not list(cache.glob(f"*/{name}"))  # nothing of it kept in the cache


def test_a_manifest_without_shard_sha256_is_read_with_gcs_crc32c_alone(gcs_server, gcs_bucket, uploaded,
                                                                       local_dataset, tmp_path):
    """Datasets written before the manifest held each shard's sha256 still read through the cache."""
    manifest = json.loads((local_dataset / "manifest.json").read_text())
    for split in manifest["splits"].values():
        del split["shard_sha256"], split["shard_bytes"]
    gcs_bucket.write_bytes("ds/manifest.json", json.dumps(manifest).encode())
    source = beam_prep.data_source(uploaded, "train", cache_dir=tmp_path / "cache")
    assert records(source) == records(beam_prep.data_source(local_dataset, "train"))


def test_two_processes_filling_one_cache_at_once_fetch_each_shard_once(gcs_server, gcs_bucket, uploaded,
                                                                       local_dataset, tmp_path):
    cache = str(tmp_path / "cache")
    env = gcs_server.subprocess_env()
    children = [subprocess.Popen(child("fill_cache", uploaded, "train", cache), cwd=REPO, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [c.communicate(timeout=300) for c in children]
    assert [c.returncode for c in children] == [0, 0], [err[-3000:] for _, err in outputs]
    first, second = (json.loads(out.splitlines()[-1]) for out, _ in outputs)
    local = beam_prep.data_source(local_dataset, "train")
    assert first == second == [[r["filename"], r["label"]] for r in local]
    shards = json.loads((local_dataset / "manifest.json").read_text())["splits"]["train"]["shards"]
    assert sorted(shard_gets(gcs_server, gcs_bucket)) == sorted(shards)


def test_a_split_larger_than_the_cache_bound_is_refused_before_any_fetch(gcs_server, gcs_bucket, uploaded,
                                                                         tmp_path):
    with pytest.raises(StorageError, match=r"split 'train' of gs://.* needs \d+ bytes .*bound of 1000"):
        beam_prep.data_source(uploaded, "train", cache_dir=tmp_path / "cache", cache_max_bytes=1000)
    assert shard_gets(gcs_server, gcs_bucket) == []
    assert [p for p in (tmp_path / "cache").iterdir() if p.is_dir()] == []  # no folder left behind


def test_gs_errors_name_what_is_wrong_without_tensorflow(gcs_server, gcs_bucket, gcs_missing_bucket, uploaded,
                                                         tmp_path):
    assert beam_prep.load_info(uploaded).labels == ("ant", "bee", "cat")
    with pytest.raises(StorageError, match=rf"bucket gs://{gcs_missing_bucket} does not exist"):
        beam_prep.load_info(f"gs://{gcs_missing_bucket}/ds")
    with pytest.raises(DatasetError, match=r"no manifest.json at gs://.*/nothing/manifest.json"):
        beam_prep.data_source(gcs_bucket.url("nothing"), "train", cache_dir=tmp_path)
    with pytest.raises(DatasetError, match=r"has no split 'test'; it has train, validation"):
        beam_prep.data_source(uploaded, "test", cache_dir=tmp_path)


# --- eviction ----------------------------------------------------------------------

CHILD_TIMEOUT_S = 120


@pytest.fixture
def datasets(gcs_bucket, local_dataset):
    """The same dataset at three gs:// folders: three folders in the cache."""
    for name in "abc":
        gcs_bucket.upload_tree(local_dataset, name)
    return {name: gcs_bucket.url(name) for name in "abc"}


@pytest.fixture
def expected(local_dataset):
    return [[r["filename"], r["label"]] for r in beam_prep.data_source(local_dataset, "train")]


def start_reader(gcs_server, cache: pathlib.Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(child("cache_reader", str(cache), "train", *args), cwd=REPO,
                            env=gcs_server.subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(process: subprocess.Popen) -> list:
    """What a reader read (a list per origin), once it ended well."""
    out, err = process.communicate(timeout=CHILD_TIMEOUT_S)
    assert process.returncode == 0, err[-3000:]
    return [json.loads(line) for line in out.splitlines()]


def wait_for(path: pathlib.Path, process: subprocess.Popen) -> None:
    """Until ``process`` creates ``path`` (polled), failing if it ends first or takes too long."""
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while not path.exists():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no {path} after {CHILD_TIMEOUT_S} s"
        time.sleep(0.01)


def folder_of(cache: pathlib.Path, origin: str) -> pathlib.Path:
    """The cache's folder for ``origin`` (``<bucket>_<path>-<origin hash>-<manifest hash>``)."""
    readable = origin[len("gs://"):].replace("/", "_")
    (folder,) = [p for p in cache.iterdir() if p.name.rsplit("-", 2)[0] == readable]
    return folder


def tree_state(root: pathlib.Path) -> dict[str, tuple]:
    """Every path under ``root``, with its kind, bytes and modification time."""
    state = {}
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        state[str(path.relative_to(root))] = (st.st_mode, data, st.st_mtime_ns)
    return state


def bytes_under(cache: pathlib.Path, leave_out: tuple[pathlib.Path, ...] = ()) -> int:
    """The bytes of the files under ``cache``, those under ``leave_out`` left out."""
    return sum(p.lstat().st_size for p in cache.rglob("*")
               if p.is_file() and not any(p.is_relative_to(f) for f in leave_out))


def foreign_folders(cache: pathlib.Path, outside: pathlib.Path) -> tuple[pathlib.Path, ...]:
    """A user's own folders inside the cache folder, old (the least recently used, were they counted):
    one of any name, one named as the cache names its own, and a link to a folder outside it."""
    photos = cache / "holiday-photos"
    (photos / "2019").mkdir(parents=True)
    (photos / "2019" / "beach.jpg").write_bytes(b"\xff\xd8" + b"x" * 5000)
    (photos / "notes.txt").write_text("mine")
    lookalike = cache / "my-records-0123456789abcdef"
    lookalike.mkdir()
    (lookalike / "train-00000-of-00001.array_record").write_bytes(b"y" * 3000)
    outside.mkdir()
    (outside / "thesis.tex").write_text("keep me")
    (cache / "linked-fedcba9876543210").symlink_to(outside, target_is_directory=True)
    for path in [*photos.rglob("*"), photos, lookalike / "train-00000-of-00001.array_record", lookalike]:
        os.utime(path, (946684800, 946684800))  # 2000-01-01
    return photos, lookalike


@pytest.fixture(scope="module")
def old_cache(gcs_server, local_dataset, tmp_path_factory) -> tuple[pathlib.Path, str, int]:
    """A cache holding one dataset's folder, filled by a process that has ended (nothing uses it):
    the cache, the folder's name and its bytes. Each test takes a copy (``cache_with_old_folder``)."""
    bucket = gcs_server.new_bucket()
    bucket.upload_tree(local_dataset, "old")
    cache = tmp_path_factory.mktemp("old") / "cache"
    finish(start_reader(gcs_server, cache, bucket.url("old")))
    (folder,) = [p for p in cache.iterdir() if p.is_dir()]
    size = bytes_under(folder)
    assert size > 2000  # larger than the slack the tests' bounds give: "old" cannot fit in it
    return cache, folder.name, size


def cache_with_old_folder(old_cache, tmp_path) -> tuple[pathlib.Path, pathlib.Path, int]:
    """A copy of ``old_cache`` of the test's own: the cache, its old folder and that folder's bytes."""
    template, name, size = old_cache
    cache = tmp_path / "cache"
    shutil.copytree(template, cache, symlinks=True)
    return cache, cache / name, size


def test_eviction_leaves_a_users_own_folders_untouched(gcs_server, gcs_bucket, datasets, expected, old_cache,
                                                        tmp_path):
    cache, old, size = cache_with_old_folder(old_cache, tmp_path)
    foreign = foreign_folders(cache, tmp_path / "outside")
    before = {f: tree_state(f) for f in (*foreign, tmp_path / "outside")}
    bound = size + 1000  # room for one dataset: "old" must go, and nothing else may
    source = beam_prep.data_source(datasets["a"], "train", cache_dir=cache, cache_max_bytes=bound)
    assert [[r["filename"], r["label"]] for r in source] == expected
    assert {f: tree_state(f) for f in before} == before  # not a byte, a time or a lock file added
    assert (cache / "linked-fedcba9876543210").is_symlink()
    assert not old.exists()  # the cache's own old folder went
    assert bytes_under(cache, foreign) <= bound


def test_a_folder_being_filled_by_another_process_is_not_evicted(gcs_server, gcs_bucket, datasets, expected,
                                                                  old_cache, tmp_path):
    """A process half way through filling ``a`` (its first shard written) while this one needs room for ``b``."""
    cache, old, size = cache_with_old_folder(old_cache, tmp_path)
    ready, release = tmp_path / "ready", tmp_path / "release"
    filler = start_reader(gcs_server, cache, datasets["a"], "--hold", str(ready), str(release))
    try:
        wait_for(ready, filler)
        filling = folder_of(cache, datasets["a"])
        shards_so_far = sorted(p.name for p in filling.glob("train-*.array_record"))
        assert shards_so_far
        bound = 2 * size + 1000  # a and b, not old beside them
        beam_prep.data_source(datasets["b"], "train", cache_dir=cache, cache_max_bytes=bound)
        assert set(shards_so_far) <= {p.name for p in filling.glob("train-*.array_record")}
        assert not old.exists()
    finally:
        release.touch()
    assert finish(filler) == [expected]
    assert bytes_under(cache) <= bound


def test_folders_in_use_count_toward_the_bound_and_a_split_that_does_not_fit_beside_them_is_refused(
        gcs_server, gcs_bucket, datasets, tmp_path):
    cache = tmp_path / "cache"
    beam_prep.data_source(datasets["a"], "train", cache_dir=cache)  # read by this process: in use
    size = bytes_under(cache)
    since = len(gcs_server.gateway.seen())
    with pytest.raises(StorageError, match=(
            rf"^split 'train' of {re.escape(datasets['b'])} needs \d+ bytes in the shard cache {re.escape(str(cache))}, "
            r"and the folders "
            rf"being read or filled there hold {size}: together more than its bound of {size + 1000} .*; raise "
            r"the bound, or read it when those processes have ended$")):
        beam_prep.data_source(datasets["b"], "train", cache_dir=cache, cache_max_bytes=size + 1000)
    assert shard_gets(gcs_server, gcs_bucket, since) == []  # refused before any fetch
    assert [p.name for p in cache.iterdir() if p.is_dir()] == [folder_of(cache, datasets["a"]).name]
    assert bytes_under(cache) <= size + 1000


def test_without_a_bound_a_full_disk_refuses_the_split_and_evicts_nothing(gcs_server, gcs_bucket, datasets,
                                                                          old_cache, tmp_path, monkeypatch):
    """The disk's free space is the one thing faked: filling a real disk is not a test's to do."""
    cache, old, _ = cache_with_old_folder(old_cache, tmp_path)
    before = tree_state(old)
    usage = shutil.disk_usage(cache)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=100))
    with pytest.raises(StorageError, match=(r"^split 'train' of gs://.* needs \d+ bytes in the shard cache .*, "
                                            r"and its disk has \d+ free; with no bound .* nothing is evicted")):
        beam_prep.data_source(datasets["a"], "train", cache_dir=cache)
    assert tree_state(old) == before


def test_several_processes_filling_and_evicting_one_cache_keep_its_bound_and_its_readers_shards(
        gcs_server, gcs_bucket, datasets, expected, old_cache, tmp_path):
    """Three processes start at once on one bounded cache that holds an old folder and a user's folders.

    Each fills its own dataset (evicting to make room) and, until all three have theirs, reads
    its folder again and again, its shards opened afresh each time: none may vanish or change.
    """
    cache, old, size = cache_with_old_folder(old_cache, tmp_path)
    foreign = foreign_folders(cache, tmp_path / "outside")
    before = {f: tree_state(f) for f in (*foreign, tmp_path / "outside")}
    together = tmp_path / "together"
    together.mkdir()
    bound = 3 * size + 2000  # the three in use fit, each with the room it reserves for its stamps
    readers = [start_reader(gcs_server, cache, datasets[name], "--max_bytes", str(bound),
                            "--together", str(together), "3") for name in ("a", "b", "c")]
    assert [finish(r) for r in readers] == [[expected]] * 3
    assert {f: tree_state(f) for f in before} == before
    assert not old.exists()
    assert sorted(p.name.rsplit("-", 2)[0] for p in cache.iterdir() if p.is_dir() and p not in foreign
                  and not p.is_symlink()) == [f"{gcs_bucket.name}_{n}" for n in "abc"]
    assert bytes_under(cache, foreign) <= bound


@pytest.mark.parametrize("kind", ["link", "dangling link", "file"])
def test_a_link_at_the_cache_folders_name_is_not_written_through(gcs_server, gcs_bucket, uploaded, tmp_path, kind):
    """A link at the name the cache gives a dataset's folder (names are predictable: the URL and the manifest's
    sha256), as someone else with a share of the cache folder could place: the shards, the marker and the
    locks would be written wherever it points. Refused in one line, and nothing is written there."""
    manifest = gcs_bucket.read_bytes("ds/manifest.json")
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    cache.mkdir()
    outside.mkdir()
    (outside / "notes.txt").write_text("mine")
    name = cache / folder_name(uploaded, manifest)
    if kind == "file":
        name.write_text("a file")
    else:
        name.symlink_to(outside if kind == "link" else tmp_path / "nowhere", target_is_directory=True)
    with pytest.raises(StorageError) as caught:
        beam_prep.data_source(uploaded, "train", cache_dir=cache)
    assert str(caught.value) == (f"the shard cache's folder {name} is a link or a file, not a folder the cache "
                                 "made: nothing is written through it; remove it, or give another cache_dir")
    assert [p.name for p in outside.iterdir()] == ["notes.txt"]
    assert not (tmp_path / "nowhere").exists()


def test_a_damaged_stamp_is_taken_for_no_stamp(gcs_server, gcs_bucket, uploaded, tmp_path):
    """A stamp that is JSON but not a stamp (cut short to ``{}``, ``null``, a list, a size that is text) is
    no stamp: the shard is checked against the manifest's sha256 (fetched again only if it differs),
    never a KeyError or TypeError out of ``data_source``."""
    cache = tmp_path / "cache"
    expected = records(beam_prep.data_source(uploaded, "train", cache_dir=cache))
    (folder,) = [p for p in cache.iterdir() if p.is_dir()]
    stamps = sorted((folder / ".stamps").iterdir())
    for stamp, text in zip(stamps, ["{}", "null", "[1, 2]", '{"size": "x", "mtime_ns": 0, "sha256": 5}']):
        stamp.write_text(text)
    since = len(gcs_server.gateway.seen())
    assert records(beam_prep.data_source(uploaded, "train", cache_dir=cache)) == expected
    assert shard_gets(gcs_server, gcs_bucket, since) == []  # the shards are whole: hashed, not fetched
