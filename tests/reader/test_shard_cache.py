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
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse

import pytest
from helpers import REPO, as_two_versions, child, make_tree, prepare_here

import beam_prep
from beam_prep.errors import DatasetError, StorageError, UnsafeName

pytestmark = pytest.mark.slow


def _dataset(tmp_path_factory, name: str, size: int) -> pathlib.Path:
    """An ArrayRecord dataset of 28 images (3 classes) of ``size`` pixels a side, resized to 8."""
    tree = tmp_path_factory.mktemp(f"{name}-tree")
    make_tree(tree, {"ant": 12, "bee": 9, "cat": 7}, size=(size, size))
    out = tmp_path_factory.mktemp(name) / "ds"
    prepare_here("--input", str(tree), "--output", str(out), "--file_format", "array_record",
                 "--image_size", "8", "--validation_percent", "20", "--num_shards", "3", "--label_offset", "1")
    return out


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory):
    return _dataset(tmp_path_factory, "ds", 8)


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


def test_an_earlier_version_fetches_its_own_shards_alone(gcs_server, gcs_bucket, local_dataset, tmp_path):
    """A training run pinned to version 1 of a dataset that grew fetches version 1's shards, not the latest's."""
    two = pathlib.Path(shutil.copytree(local_dataset, tmp_path / "two"))
    manifest = as_two_versions(two)
    gcs_bucket.upload_tree(two, "two")
    first = manifest["versions"][0]["splits"]["train"]
    source = beam_prep.data_source(gcs_bucket.url("two"), "train", cache_dir=tmp_path / "cache", version=1)
    assert len(source) == first["num_examples"] and shard_gets(gcs_server, gcs_bucket) == first["shards"]
    assert records(source) == records(beam_prep.data_source(two, "train", version=1))
    with pytest.raises(DatasetError, match=r"has no version 3: it has versions 1-2$"):
        beam_prep.data_source(gcs_bucket.url("two"), "train", cache_dir=tmp_path / "cache", version=3)


def _unpickled(pickled: bytes, said) -> None:
    """A spawn-started worker's start: the source unpickled; what that says (or "read N records") put on ``said``."""
    import pickle
    try:
        source = pickle.loads(pickled)
        said.put(f"read {len(records(source))} records")
    except Exception as e:  # noqa: BLE001 - the test compares the message
        said.put(f"{type(e).__name__}: {e}")


def _in_a_spawned_worker(source) -> str:
    import multiprocessing
    import pickle

    context = multiprocessing.get_context("spawn")
    said = context.Queue()
    worker = context.Process(target=_unpickled, args=(pickle.dumps(source), said))
    worker.start()
    try:
        return said.get(timeout=CHILD_TIMEOUT_S)
    finally:
        worker.join(CHILD_TIMEOUT_S)


def test_a_cached_source_pickled_into_a_worker_refuses_a_folder_swapped_since(gcs_server, gcs_bucket, uploaded,
                                                                            tmp_path):
    """A data loader's worker reopens the cached shards by path: the folder renamed away and another made
    at its name, with the same shards planted in it, is refused before a shard is read."""
    source = beam_prep.data_source(uploaded, "train", cache_dir=tmp_path / "cache")
    assert _in_a_spawned_worker(source) == f"read {len(source)} records"
    root = pathlib.Path(source.info.root)
    root.rename(root.with_name("filled"))
    root.mkdir(mode=0o700)
    for shard in source.split.files:
        shutil.copyfile(root.with_name("filled") / pathlib.Path(shard).name, shard)
    assert _in_a_spawned_worker(source) == (
        f"StorageError: the shard cache's folder {root} is no longer the folder the cache filled (it was replaced "
        "since): nothing is read from it; read the dataset again, and give a private cache_dir (BEAM_PREP_CACHE): "
        "a folder of yours that no one else can write")


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


def test_folders_of_origins_with_the_longest_readable_names_count_toward_the_bound_and_are_evicted(
        gcs_server, gcs_bucket, local_dataset, expected, tmp_path):
    """Origins whose readable part is the longest a name shows (80 characters, then both hashes): one
    cached by a process that has ended, one left by an eviction cut short (renamed ``.evicting~<pid>``,
    its files still there). A bounded read of another removes both, and the cache keeps its bound."""
    origins = []
    for tag in "xy":
        gcs_bucket.upload_tree(local_dataset, f"{tag}{'a' * 40}/{'b' * 40}")
        origins.append(gcs_bucket.url(f"{tag}{'a' * 40}/{'b' * 40}"))
    assert all(len(readable(origin)) == 80 for origin in origins)
    cache = tmp_path / "cache"
    assert finish(start_reader(gcs_server, cache, *origins)) == [expected, expected]
    long_names = sorted(p for p in cache.iterdir() if p.is_dir())
    assert len(long_names) == 2
    size = bytes_under(long_names[0])
    cut_short = long_names[1].with_name(f"{long_names[1].name}.evicting~12345")
    long_names[1].rename(cut_short)
    bound = size + 1000  # room for one dataset
    gcs_bucket.upload_tree(local_dataset, "z")
    source = beam_prep.data_source(gcs_bucket.url("z"), "train", cache_dir=cache, cache_max_bytes=bound)
    assert [[r["filename"], r["label"]] for r in source] == expected
    assert [p.name for p in cache.iterdir() if p.is_dir()] == [pathlib.Path(source.info.root).name]  # the rest evicted
    assert bytes_under(cache) <= bound


def test_an_eviction_cut_short_never_removes_what_is_put_in_a_folder_without_its_marker(
        gcs_server, gcs_bucket, uploaded, tmp_path, monkeypatch):
    """A folder of the user's named as one an eviction leaves (``<name>-<16 digits>.evicting~<pid>``),
    without the cache's marker: the next fill removes it only if it is empty (what an eviction cut
    short after removing its marker leaves), so a file put in it the moment it is removed stays."""
    from beam_prep.reader import cache_fs

    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    lookalike = cache / "my-runs-0123456789abcdef.evicting~42"
    lookalike.mkdir(mode=0o700)
    late = lookalike / "written-meanwhile.txt"
    real_rmdir, real_remove_tree = os.rmdir, cache_fs.remove_tree

    put = []

    def put_a_file_first(remove, name_at: int):
        """``remove`` (its folder's name the argument ``name_at``), the first removal of the folder made
        after the user's file is put in it."""
        def removing(*args, **kwargs):
            if os.path.basename(args[name_at]) == lookalike.name and not put:
                late.write_text("the user's, written as the cache removes the folder")
                put.append(late)
            return remove(*args, **kwargs)
        return removing

    monkeypatch.setattr(os, "rmdir", put_a_file_first(real_rmdir, 0))
    monkeypatch.setattr(cache_fs, "remove_tree", put_a_file_first(real_remove_tree, 1))
    beam_prep.data_source(uploaded, "train", cache_dir=cache)
    assert put and late.read_text() == "the user's, written as the cache removes the folder"


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


# --- names, origins, a killed fill, locks -------------------------------------------


def serve_renamed(gcs_bucket, local_dataset, index: int, name: str) -> str:
    """``local_dataset`` uploaded with train's shard ``index`` renamed ``name`` (in the manifest and on GCS)."""
    manifest = json.loads((local_dataset / "manifest.json").read_text())
    train = manifest["splits"]["train"]
    for i, shard in enumerate(train["shards"]):
        gcs_bucket.write_bytes(f"renamed/{name if i == index else shard}", (local_dataset / shard).read_bytes())
    train["shards"][index] = name
    manifest["versions"][0]["splits"]["train"]["shards"][index] = name  # the version's too: a manifest whole
    gcs_bucket.write_bytes("renamed/manifest.json", json.dumps(manifest).encode())
    return gcs_bucket.url("renamed")


@pytest.mark.parametrize("name", ["Manifest.json", "MANIFEST.JSON", ".Use.Lock", ".FILL.lock", ".Stamps",
                                  ".Beam-Prep-Cache.json", "train-00001-of-00003.array_record.partial-123",
                                  "train-00001-of-00003.array_record.PARTIAL-7"])
def test_a_shard_named_as_the_caches_own_files_in_another_case_is_refused(gcs_server, gcs_bucket, local_dataset,
                                                                          tmp_path, name):
    """On a file system that ignores case (macOS's default), ``Manifest.json`` is ``manifest.json``: fetched,
    it would replace the cache's own file. Refused before anything is fetched, as the very names are."""
    url = serve_renamed(gcs_bucket, local_dataset, 1, name)
    with pytest.raises(UnsafeName, match=rf"^{re.escape(url)}/manifest.json: splits\.train\.shards\[1\] is "
                                         rf"{re.escape(repr(name))}"):
        beam_prep.data_source(url, "train", cache_dir=tmp_path / "cache")
    assert shard_gets(gcs_server, gcs_bucket) == []


@pytest.mark.parametrize("case", ["same", "upper"])
def test_a_shard_named_twice_in_a_split_is_refused_before_any_fetch(gcs_server, gcs_bucket, uploaded, local_dataset,
                                                                    tmp_path, case):
    """Two threads would fetch it into one file at once (and ignoring case, two names are one file)."""
    manifest = json.loads((local_dataset / "manifest.json").read_text())
    train = manifest["splits"]["train"]
    twice = train["shards"][0] if case == "same" else train["shards"][0].upper()
    for field in ("shards", "shard_sha256", "shard_bytes", "shard_num_examples"):  # the first shard, twice
        train[field][2] = train[field][0]
    train["shards"][2] = twice
    gcs_bucket.write_bytes("ds/manifest.json", json.dumps(manifest).encode())
    with pytest.raises(UnsafeName, match=rf"^{re.escape(uploaded)}/manifest.json: splits\.train\.shards\[2\] is "
                                         rf"{re.escape(repr(twice))}"):
        beam_prep.data_source(uploaded, "train", cache_dir=tmp_path / "cache")
    assert shard_gets(gcs_server, gcs_bucket) == []


@pytest.fixture(scope="module")
def other_dataset(tmp_path_factory):
    """A dataset with the local one's names and counts, and other pixels."""
    return _dataset(tmp_path_factory, "other", 9)


def test_two_origins_whose_names_read_alike_never_share_a_cache_folder(gcs_server, gcs_bucket, local_dataset,
                                                                       other_dataset, tmp_path):
    """``gs://b/x/y`` and ``gs://b/x_y`` with one manifest (without shard checksums) and other shards: each
    reads its own bytes, never the other's."""
    manifest = json.loads((local_dataset / "manifest.json").read_text())
    for split in manifest["splits"].values():
        del split["shard_sha256"], split["shard_bytes"]
    text = json.dumps(manifest).encode()
    shards = manifest["splits"]["train"]["shards"]
    assert json.loads((other_dataset / "manifest.json").read_text())["splits"]["train"]["shards"] == shards
    for where, dataset in (("x/y", local_dataset), ("x_y", other_dataset)):
        for name in shards:
            gcs_bucket.write_bytes(f"{where}/{name}", (dataset / name).read_bytes())
        gcs_bucket.write_bytes(f"{where}/manifest.json", text)
    cache = tmp_path / "cache"
    first = records(beam_prep.data_source(gcs_bucket.url("x/y"), "train", cache_dir=cache))
    second = records(beam_prep.data_source(gcs_bucket.url("x_y"), "train", cache_dir=cache))
    assert first == records(beam_prep.data_source(local_dataset, "train"))
    assert second == records(beam_prep.data_source(other_dataset, "train")) != first


def test_a_fill_killed_mid_write_leaves_nothing_that_refuses_the_next_bounded_read(gcs_server, gcs_bucket, uploaded,
                                                                                   local_dataset, tmp_path):
    """A filler SIGKILLed half way through a shard (OOM, preemption) leaves its partial file and its
    reservation; the next fill, under the fill lock, removes them: a bound that fits the split still does."""
    with pytest.raises(StorageError, match=r"needs (\d+) bytes") as refused:  # what a fresh fill needs
        beam_prep.data_source(uploaded, "train", cache_dir=tmp_path / "probe", cache_max_bytes=1)
    fits = int(re.search(r"needs (\d+) bytes", str(refused.value))[1])
    cache, ready = tmp_path / "cache", tmp_path / "ready"
    filler = subprocess.Popen(child("fill_cache", uploaded, "train", str(cache), "--max_bytes", str(fits),
                                    "--die_mid_write", str(ready)),
                              cwd=REPO, env=gcs_server.subprocess_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_for(ready, filler)
    finally:
        filler.kill()
        filler.communicate(timeout=CHILD_TIMEOUT_S)
    (folder,) = [p for p in cache.iterdir() if p.is_dir()]
    partials = [p for p in folder.rglob("*.partial-*")]
    left = sum(p.stat().st_size for p in partials)
    assert left > 0 and (folder / ".reserved").exists()  # what the killed fill left
    bound = fits + left // 2  # fits the split, not the split beside what the killed fill left
    source = beam_prep.data_source(uploaded, "train", cache_dir=cache, cache_max_bytes=bound)
    assert records(source) == records(beam_prep.data_source(local_dataset, "train"))
    assert list(folder.rglob("*.partial-*")) == [] and not (folder / ".reserved").exists()
    assert bytes_under(cache) <= bound


def test_a_lock_held_past_the_bound_is_refused_naming_it_and_its_holder(gcs_server, gcs_bucket, uploaded, tmp_path):
    """A fill that hangs holds its folder's fill lock: another reader waits for it at most
    ``$BEAM_PREP_CACHE_LOCK_TIMEOUT`` seconds, then is refused in one line (a legitimate wait, a fill
    ending, is the test above of two processes filling at once)."""
    cache, ready, release = tmp_path / "cache", tmp_path / "ready", tmp_path / "release"
    holder = start_reader(gcs_server, cache, uploaded, "--hold", str(ready), str(release))
    try:
        wait_for(ready, holder)
        folder = folder_of(cache, uploaded)
        waiter = subprocess.run(child("fill_cache", uploaded, "train", str(cache)), cwd=REPO, capture_output=True,
                                text=True, env=gcs_server.subprocess_env({"BEAM_PREP_CACHE_LOCK_TIMEOUT": "1"}),
                                timeout=CHILD_TIMEOUT_S)
    finally:
        release.touch()
    assert waiter.returncode == 1
    assert waiter.stderr.strip().splitlines()[-1] == (
        f"beam_prep.errors.StorageError: the shard cache's lock {folder / '.fill.lock'} is held by process "
        f"{holder.pid}, still after 1 s (BEAM_PREP_CACHE_LOCK_TIMEOUT): another process fills or evicts that "
        "folder; let it end, stop it if it hangs, or raise the bound")
    finish(holder)


@pytest.mark.parametrize("made", [False, True])
def test_a_cache_on_a_filesystem_whose_flock_is_not_a_lock_is_refused(gcs_server, gcs_bucket, uploaded, tmp_path,
                                                                     monkeypatch, made):
    """NFS emulates ``flock`` with POSIX locks (a process's own never conflict): no NFS here, so the
    refusal is shown on this folder's own filesystem, read by ``stat -f``, named as NFS. A cache folder
    yet to be made is refused for the filesystem it would be made on, before anything is made."""
    from beam_prep.reader import cache_fs

    existing = tmp_path / "cache"
    existing.mkdir()
    cache = existing / "new" / "deeper" / "cache" if made else existing
    kind = int(subprocess.run(["stat", "-f", "-c", "%t", str(existing)], capture_output=True, text=True,
                              check=True).stdout, 16)
    monkeypatch.setattr(cache_fs, "UNRELIABLE_FLOCK", {kind: "NFS"})
    with pytest.raises(StorageError) as caught:
        beam_prep.data_source(uploaded, "train", cache_dir=cache)
    assert str(caught.value) == (
        f"the shard cache's folder {existing} is on NFS, whose flock does not lock between processes (the cache's "
        "locks keep a folder in use from being evicted): point cache_dir (BEAM_PREP_CACHE) at a local disk")
    assert list(existing.iterdir()) == [] and shard_gets(gcs_server, gcs_bucket) == []


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "soon"])
def test_a_lock_bound_that_is_not_a_finite_number_of_seconds_is_refused_before_any_fetch(
        gcs_server, gcs_bucket, uploaded, tmp_path, monkeypatch, value):
    """``nan`` would wait for ever (no time is past it), ``inf`` too, and a negative bound spins."""
    monkeypatch.setenv("BEAM_PREP_CACHE_LOCK_TIMEOUT", value)
    with pytest.raises(StorageError) as caught:
        beam_prep.data_source(uploaded, "train", cache_dir=tmp_path / "cache")
    assert str(caught.value) == f"BEAM_PREP_CACHE_LOCK_TIMEOUT must be a number of seconds, 0 or more, not {value!r}"
    assert shard_gets(gcs_server, gcs_bucket) == [] and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("kind", ["a file on the way", "a name too long"])
def test_a_cache_dir_that_cannot_be_a_folder_is_refused_in_one_line(gcs_server, gcs_bucket, uploaded, tmp_path,
                                                                     kind):
    (tmp_path / "file").write_text("not a folder")
    if kind == "a file on the way":
        cache, at, why = tmp_path / "file" / "cache", tmp_path / "file", "Not a directory"
    else:
        at = tmp_path / ("n" * 300)
        cache, why = at / "cache", "File name too long"
    with pytest.raises(StorageError) as caught:
        beam_prep.data_source(uploaded, "train", cache_dir=cache)
    assert str(caught.value) == (f"cannot open the shard cache's folder {at} (on the way to {cache}): {why}; give "
                                 "another cache_dir (BEAM_PREP_CACHE)")
    assert shard_gets(gcs_server, gcs_bucket) == []


def test_a_shard_larger_than_gcs_listed_it_is_refused_and_the_bound_holds(gcs_server, gcs_bucket, local_dataset,
                                                                          tmp_path, monkeypatch):
    """The bucket's owner serves a 1-byte shard to the listing (what the cache makes room for) and a 3 MB
    one to the read, its sha256 in the manifest (a hostile bucket holds both): the replacement, set here
    right after the listing, is refused naming the shard, and nothing of it is kept."""
    from beam_prep.io import gcs

    big = os.urandom(3_000_000)
    manifest = json.loads((local_dataset / "manifest.json").read_text())
    train = manifest["splits"]["train"]
    for i, shard in enumerate(train["shards"]):
        gcs_bucket.write_bytes(f"swap/{shard}", b"x" if i == 0 else (local_dataset / shard).read_bytes())
    train["shard_sha256"][0] = hashlib.sha256(big).hexdigest()
    gcs_bucket.write_bytes("swap/manifest.json", json.dumps(manifest).encode())
    real_list = gcs.GcsClient.list

    def list_then_replace(self, root, *args, **kwargs):
        listed = real_list(self, root, *args, **kwargs)
        gcs_bucket.write_bytes(f"swap/{train['shards'][0]}", big)
        return listed

    monkeypatch.setattr(gcs.GcsClient, "list", list_then_replace)
    bound, cache = 400_000, tmp_path / "cache"
    with pytest.raises(StorageError) as caught:
        beam_prep.data_source(gcs_bucket.url("swap"), "train", cache_dir=cache, cache_max_bytes=bound)
    assert str(caught.value) == (
        f"shard {gcs_bucket.url('swap')}/{train['shards'][0]} is {len(big)} bytes, more than the 1 GCS listed for "
        "it as the shard cache made room for the split: it was replaced since, and nothing of it is kept; read "
        "again once the dataset is no longer being rewritten")
    assert bytes_under(cache) <= bound and not list(cache.glob(f"*/{train['shards'][0]}*"))


@pytest.mark.parametrize("length", [240, 250, 255])
def test_a_shard_name_as_long_as_a_file_name_may_be_is_cached(gcs_server, gcs_bucket, local_dataset, tmp_path,
                                                              length):
    """The names rule allows 255 bytes; the cache's temporaries (``<name>.partial-<pid>``) and stamps
    (``<name>.json``) of such a name would not fit: theirs are made from its hash instead."""
    name = "s" * (length - len(".array_record")) + ".array_record"
    url = serve_renamed(gcs_bucket, local_dataset, 0, name)
    cache = tmp_path / "cache"
    assert records(beam_prep.data_source(url, "train", cache_dir=cache)) == records(
        beam_prep.data_source(local_dataset, "train"))
    since = len(gcs_server.gateway.seen())
    assert records(beam_prep.data_source(url, "train", cache_dir=cache))  # again: from the cache, stamps read
    assert shard_gets(gcs_server, gcs_bucket, since) == []


def test_a_shard_named_in_two_splits_with_other_bytes_is_refused(gcs_server, gcs_bucket, local_dataset,
                                                                 other_dataset, tmp_path):
    """Split ``extra`` names train's shards with another dataset's sha256s: read, it would replace the
    files train's readers reopen by path. The manifest is refused (one file, one split)."""
    manifest = json.loads((local_dataset / "manifest.json").read_text())
    manifest["splits"]["extra"] = json.loads((other_dataset / "manifest.json").read_text())["splits"]["train"]
    for f in local_dataset.iterdir():
        if f.is_file() and f.name != "manifest.json":
            gcs_bucket.write_bytes(f"xs/{f.name}", f.read_bytes())
    gcs_bucket.write_bytes("xs/manifest.json", json.dumps(manifest).encode())
    url = gcs_bucket.url("xs")
    for split in ("train", "extra"):
        with pytest.raises(UnsafeName, match=(rf"^{re.escape(url)}/manifest.json: splits\.extra\.shards\[0\] is "
                                              r"'train-00000-of-00003\.array_record', which names the same file as "
                                              r"splits\.train\.shards\[0\]")):
            beam_prep.data_source(url, split, cache_dir=tmp_path / "cache")
    assert shard_gets(gcs_server, gcs_bucket) == []


def modes(root: pathlib.Path) -> set[tuple[str, int]]:
    """The kinds and permission bits of everything under ``root``."""
    return {("folder" if p.is_dir() else "file", p.stat().st_mode & 0o7777) for p in root.rglob("*")}


def test_a_cache_folder_others_can_write_gives_this_user_a_private_folder_in_it(gcs_server, gcs_bucket, uploaded,
                                                                                tmp_path):
    """A scratch folder shared with the sticky bit (1777, as ``/tmp``): the cache keeps to ``<it>/<uid>``,
    made 0700, its files 0600. Without the sticky bit anyone could rename that away: refused."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    source = beam_prep.data_source(uploaded, "train", cache_dir=shared)
    assert pathlib.Path(source.info.root).parent == shared / str(os.geteuid())
    assert [p.name for p in shared.iterdir()] == [str(os.geteuid())]
    assert (shared / str(os.geteuid())).stat().st_mode & 0o7777 == 0o700
    assert modes(shared / str(os.geteuid())) == {("folder", 0o700), ("file", 0o600)}
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    with pytest.raises(StorageError) as caught:
        beam_prep.data_source(uploaded, "train", cache_dir=open_to_all)
    assert str(caught.value) == (
        f"the shard cache's folder {open_to_all} can be written by others without the sticky bit (mode 777): "
        "another user could replace what the cache keeps there; give a private cache_dir (BEAM_PREP_CACHE): a "
        "folder of yours that no one else can write")
    assert list(open_to_all.iterdir()) == []


def test_a_link_at_cache_dir_is_followed_only_where_no_one_else_could_have_placed_it(gcs_server, gcs_bucket,
                                                                                    uploaded, tmp_path):
    """A link of the user's in a folder of theirs (``~/.cache`` linked to a larger disk) is followed; any
    link in a folder others can write (1777, as ``/tmp``) is refused, the user's own too."""
    disk = tmp_path / "disk"
    disk.mkdir(mode=0o700)
    (tmp_path / "mine").symlink_to(disk)
    source = beam_prep.data_source(uploaded, "train", cache_dir=tmp_path / "mine" / "cache")
    assert pathlib.Path(source.info.root).parent == disk / "cache"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    scratch.chmod(0o1777)
    (scratch / "cache").symlink_to(disk / "cache")
    with pytest.raises(StorageError) as caught:
        beam_prep.data_source(uploaded, "train", cache_dir=scratch / "cache" / "inner")
    assert str(caught.value) == (
        f"the shard cache's folder {scratch / 'cache' / 'inner'} is reached through {scratch / 'cache'}, a link in "
        f"{scratch}, which others can write: another user could have placed it, and the cache does not follow it; "
        "give a private cache_dir (BEAM_PREP_CACHE): a folder of yours that no one else can write")
    assert not (disk / "cache" / "inner").exists()


# --- a cache folder shared with another user ---------------------------------------

VICTIM, ATTACKER = 65534, 65533  # nobody, and a uid no one has


def _private_folders() -> dict[pathlib.Path, set[pathlib.Path]]:
    """The topmost folders that others cannot search (``/root``, mode 0700) above what the victim's
    Python needs (its installation, the venv, the checkout), each with its entries on the way there."""
    private: dict[pathlib.Path, set[pathlib.Path]] = {}
    for needed in {pathlib.Path(p).resolve() for p in (sys.base_prefix, sys.prefix, REPO)}:
        for folder in reversed(needed.parents):
            if folder != needed and not folder.stat().st_mode & 0o001:
                private.setdefault(folder, set()).add(folder / needed.relative_to(folder).parts[0])
                break
    return private


def as_user(uid: int, command: list[str]) -> list[str]:
    """``command`` run as ``uid`` (its gid the same number, no other groups), started as root. Where a folder above
    this Python is private (CI's interpreter under ``/root``), it runs in a mount namespace of its
    own in which that folder is a world-searchable tmpfs holding only the entries the child needs,
    bound from the real one: nothing outside the child sees a change."""
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *command]
    private = _private_folders()
    if not private:
        return drop
    script = ["set -e", 'keep=$(mktemp -d)']
    moves = []
    for folder, entries in private.items():
        for entry in sorted(entries):
            kept = f'"$keep"/{len(moves)}'
            script += [f"mkdir {kept}", f"mount --bind {shlex.quote(str(entry))} {kept}"]
            moves.append((kept, entry))
        script.append(f"mount -t tmpfs -o mode=755 tmpfs {shlex.quote(str(folder))}")
    for kept, entry in moves:
        script += [f"mkdir -p {shlex.quote(str(entry))}", f"mount --move {kept} {shlex.quote(str(entry))}"]
    script += ['rm -r "$keep"', f"cd {shlex.quote(str(REPO))}", 'exec "$@"']
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script), "sh", *drop]


@pytest.fixture(scope="module")
def unprivileged() -> None:
    """Skips, naming why, where this process cannot run beam-prep as another uid: not root, or
    without the tools that drop to it (``setpriv``) and reach a private Python (``unshare``)."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run the victim and the attacker as two unprivileged uids")
    missing = [tool for tool in ("setpriv", "unshare") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs util-linux's {' and '.join(missing)}, to run the victim as another uid")
    done = subprocess.run(as_user(VICTIM, [sys.executable, "-c", "import beam_prep.reader.shard_cache"]), cwd=REPO,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        pytest.skip(f"uid {VICTIM} cannot import beam_prep from {REPO}: {done.stderr.strip().splitlines()[-1:]}")


@pytest.fixture
def shared(gcs_server, unprivileged):
    """A scratch folder every user may write, with the sticky bit (as ``/tmp``), and the victim's home
    in it (0700, with a file and a folder of theirs). Under ``/tmp`` itself: the unprivileged children
    cannot reach into root's ``tmp_path``."""
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="beam-prep-shared-", dir="/tmp"))
    try:
        scratch.chmod(0o1777)
        home = scratch / "victim"
        (home / "mine").mkdir(parents=True)
        (home / "mine" / "thesis.tex").write_text("keep me")
        (home / "notes.txt").write_text("the victim's own notes")
        for path in (home, home / "mine", home / "mine" / "thesis.tex", home / "notes.txt"):
            os.chown(path, VICTIM, VICTIM)
        home.chmod(0o700)
        yield scratch
    finally:
        shutil.rmtree(scratch)


def as_attacker(action) -> None:
    """Runs ``action`` in a forked child that is the attacker (uid and gid ``ATTACKER``, umask 0)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(ATTACKER)
            os.setuid(ATTACKER)
            os.umask(0)
            action()
            code = 0
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, "the attacker's step failed"


def start_victim(gcs_server, shared: pathlib.Path, origin: str, *args: str,
                 cache: pathlib.Path | None = None) -> subprocess.Popen:
    """The victim reading ``origin``'s train through the cache at ``cache`` (default ``shared``): it starts
    once a line arrives on its stdin (its pid known, the attacker readies the cache for it first)."""
    home = shared / "victim-env"  # not the victim's files the test watches
    if not home.exists():
        home.mkdir(mode=0o700)
        os.chown(home, VICTIM, VICTIM)
    env = gcs_server.subprocess_env({"HOME": str(home), "TMPDIR": str(home), "BEAM_PREP_CACHE_LOCK_TIMEOUT": "30"})
    for variable in ("GOOGLE_APPLICATION_CREDENTIALS", "CURL_CA_BUNDLE"):  # the test server's, in root's tmp_path
        if env.get(variable):
            copy = home / pathlib.Path(env[variable]).name
            if not copy.exists():
                shutil.copyfile(env[variable], copy)
                os.chown(copy, VICTIM, VICTIM)
            env[variable] = str(copy)
    return subprocess.Popen(as_user(VICTIM, child("fill_cache", origin, "train", str(cache or shared), "--after_stdin", *args)),
                            cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def victims_own(shared: pathlib.Path) -> dict[str, tuple]:
    return tree_state(shared / "victim")


def plant(folder: pathlib.Path, origin: str, manifest: bytes) -> list[pathlib.Path]:
    """The dataset's folders (0777, the attacker's) at each name the cache may give it in ``folder``."""
    made = []
    for name in (folder_name(origin, manifest), earlier_folder_name(origin, manifest)):
        (folder / name).mkdir(mode=0o777)
        made.append(folder / name)
    return made


@pytest.mark.parametrize("attack", ["partial files", "stamps"])
def test_links_a_co_user_plants_in_a_shared_cache_are_never_written_through(gcs_server, gcs_bucket, uploaded,
                                                                            local_dataset, expected, shared, attack):
    """The attacker makes the dataset's folder first (its name is computable) and links, in it, the
    victim's next partial files (``<shard>.partial-<pid>``) to the victim's notes, or ``.stamps`` to a
    folder of the victim's: the victim's read writes none of its files."""
    manifest = gcs_bucket.read_bytes("ds/manifest.json")
    names = [*json.loads(manifest)["splits"]["train"]["shards"], "manifest.json", ".beam-prep-cache.json"]
    before = victims_own(shared)
    victim = start_victim(gcs_server, shared, uploaded)

    def attack_():
        for folder in plant(shared, uploaded, manifest):
            if attack == "stamps":
                (folder / ".stamps").symlink_to(shared / "victim" / "mine")
            else:
                for name in names:
                    (folder / f"{name}.partial-{victim.pid}").symlink_to(shared / "victim" / "notes.txt")

    as_attacker(attack_)
    out, err = victim.communicate("go\n", timeout=CHILD_TIMEOUT_S)
    assert victims_own(shared) == before
    assert victim.returncode == 0, err[-3000:]
    assert json.loads(out.splitlines()[-1]) == expected


def test_a_poisoned_shard_a_co_user_plants_with_a_matching_stamp_is_never_read(gcs_server, gcs_bucket, uploaded,
                                                                              local_dataset, expected, shared):
    """Another shard's bytes at the first shard's name, stamped with its size, time and the manifest's
    sha256: the victim reads the dataset's records, never the planted ones."""
    manifest = gcs_bucket.read_bytes("ds/manifest.json")
    train = json.loads(manifest)["splits"]["train"]
    poison = (local_dataset / train["shards"][1]).read_bytes()

    def attack():
        for folder in plant(shared, uploaded, manifest):
            (folder / ".stamps").mkdir(mode=0o777)
            shard = folder / train["shards"][0]
            shard.write_bytes(poison)
            stat = shard.stat()
            (folder / ".stamps" / f"{shard.name}.json").write_text(json.dumps(
                {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": train["shard_sha256"][0]}))

    as_attacker(attack)
    victim = start_victim(gcs_server, shared, uploaded)
    out, err = victim.communicate("go\n", timeout=CHILD_TIMEOUT_S)
    assert victim.returncode == 0, err[-3000:]
    assert json.loads(out.splitlines()[-1]) == expected


def test_a_lock_a_co_user_holds_in_a_shared_cache_never_stalls_a_read(gcs_server, gcs_bucket, uploaded, expected,
                                                                      shared):
    """The attacker holds the shared folder's ``.evict.lock`` (and the fill lock of the dataset's folder
    they made) for ever: the victim's bounded read goes on, or is refused, but does not wait on them."""
    manifest = gcs_bucket.read_bytes("ds/manifest.json")
    as_attacker(lambda: plant(shared, uploaded, manifest))
    locks = [shared / ".evict.lock", *(folder / ".fill.lock" for folder in plant_names(shared, uploaded, manifest))]
    holder = subprocess.Popen(as_user(ATTACKER, [
        sys.executable, "-c", "import fcntl, sys\nfiles = [open(p, 'ab') for p in sys.argv[1:]]\n"
        "for f in files: fcntl.flock(f, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.read()",
        *map(str, locks)]), umask=0, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        victim = start_victim(gcs_server, shared, uploaded, "--max_bytes", str(10 ** 9))
        out, err = victim.communicate("go\n", timeout=CHILD_TIMEOUT_S)
    finally:
        holder.communicate("", timeout=CHILD_TIMEOUT_S)
    assert victim.returncode == 0, err[-3000:]
    assert json.loads(out.splitlines()[-1]) == expected


def plant_names(shared: pathlib.Path, origin: str, manifest: bytes) -> list[pathlib.Path]:
    return [shared / folder_name(origin, manifest), shared / earlier_folder_name(origin, manifest)]


def test_a_co_user_who_makes_the_victims_own_folder_first_gets_it_refused(gcs_server, gcs_bucket, uploaded, shared):
    """``<shared>/<uid>`` made first by the attacker (0777, with the dataset's folder and links in it):
    the victim refuses it in one line, and writes nothing."""
    manifest = gcs_bucket.read_bytes("ds/manifest.json")
    before = victims_own(shared)
    taken = shared / str(VICTIM)

    def attack():
        taken.mkdir(mode=0o777)
        for folder in plant(taken, uploaded, manifest):
            (folder / ".stamps").symlink_to(shared / "victim" / "mine")

    as_attacker(attack)
    victim = start_victim(gcs_server, shared, uploaded)
    _, err = victim.communicate("go\n", timeout=CHILD_TIMEOUT_S)
    assert victim.returncode == 1
    assert err.strip().splitlines()[-1] == (
        f"beam_prep.errors.StorageError: the shard cache's folder {taken} belongs to uid {ATTACKER}, not to this "
        f"user (uid {VICTIM}): the cache neither reads nor writes it; give a private cache_dir (BEAM_PREP_CACHE): "
        "a folder of yours that no one else can write")
    assert victims_own(shared) == before
    assert shard_gets(gcs_server, gcs_bucket) == []


def test_a_link_a_co_user_places_at_the_cache_dirs_name_is_not_followed(gcs_server, gcs_bucket, uploaded, shared):
    """``cache_dir`` a name in the shared folder, where the attacker placed a link to a folder of the
    victim's: the victim refuses it in one line, and writes nothing there."""
    before = victims_own(shared)
    cache = shared / "cache"
    as_attacker(lambda: cache.symlink_to(shared / "victim" / "mine"))
    victim = start_victim(gcs_server, shared, uploaded, cache=cache)
    _, err = victim.communicate("go\n", timeout=CHILD_TIMEOUT_S)
    assert victim.returncode == 1
    assert err.strip().splitlines()[-1] == (
        f"beam_prep.errors.StorageError: the shard cache's folder {cache} is a link of uid {ATTACKER}: another user "
        "could have placed it, and the cache does not follow it; give a private cache_dir (BEAM_PREP_CACHE): a "
        "folder of yours that no one else can write")
    assert victims_own(shared) == before
    assert shard_gets(gcs_server, gcs_bucket) == []


def test_a_cache_dir_the_user_cannot_reach_is_refused_in_one_line(gcs_server, gcs_bucket, uploaded, shared):
    """Below a folder the victim may not search (root's, 0700): one line naming it, no traceback."""
    locked = shared / "roots-own"
    locked.mkdir(mode=0o700)
    victim = start_victim(gcs_server, shared, uploaded, cache=locked / "cache")
    _, err = victim.communicate("go\n", timeout=CHILD_TIMEOUT_S)
    assert victim.returncode == 1
    assert err.strip().splitlines()[-1] == (
        f"beam_prep.errors.StorageError: cannot open the shard cache's folder {locked} (on the way to "
        f"{locked / 'cache'}): Permission denied; give another cache_dir (BEAM_PREP_CACHE)")


def test_a_folder_a_co_user_makes_on_the_way_to_the_cache_as_it_is_made_is_refused(gcs_server, gcs_bucket, uploaded,
                                                                                   shared, monkeypatch):
    """``cache_dir`` below a folder yet to be made in the shared folder: the attacker makes that folder
    (0777, theirs) the moment before the cache does (the race, set here by running the attacker's
    ``mkdir`` first). The cache refuses it, and makes nothing in it: a root inside it would be theirs
    to swap."""
    team = shared / "team"
    real_mkdir = os.mkdir

    def attacker_first(name, *args, **kwargs):
        if os.path.basename(name) == team.name and not team.exists():
            as_attacker(lambda: real_mkdir(team, 0o777))
        return real_mkdir(name, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", attacker_first)
    with pytest.raises(StorageError) as caught:
        beam_prep.data_source(uploaded, "train", cache_dir=team / "cache")
    assert str(caught.value) == (
        f"the shard cache's folder {team / 'cache'} is inside {team}, which belongs to uid {ATTACKER}: another user "
        "could replace it; give a private cache_dir (BEAM_PREP_CACHE): a folder of yours that no one else can write")
    assert list(team.iterdir()) == [] and shard_gets(gcs_server, gcs_bucket) == []


@pytest.fixture(scope="module")
def webdataset_dataset(tmp_path_factory):
    tree = tmp_path_factory.mktemp("wds-tree")
    make_tree(tree, {"ant": 4, "bee": 3}, size=(8, 8))
    out = tmp_path_factory.mktemp("wds") / "ds"
    prepare_here("--input", str(tree), "--output", str(out), "--file_format", "webdataset", "--image_size", "8",
                 "--validation_percent", "0", "--num_shards", "2")
    return out


@pytest.mark.parametrize("reader", ["data_source", "webdataset_pipeline"])
def test_a_worker_refuses_a_cache_folder_replaced_since_it_was_filled(gcs_server, gcs_bucket, uploaded, other_dataset,
                                                                      webdataset_dataset, shared, reader):
    """A source pickled into a data loader's worker reopens its shards by path. A folder above the cache
    that became the attacker's (the end state of a race at its making), who then moved the cache away and
    put their own shards at its path: the worker refuses the folder, as does this process's next read."""
    import pickle

    if reader == "webdataset_pipeline":
        gcs_bucket.upload_tree(webdataset_dataset, "wds")
        uploaded, poisoned = gcs_bucket.url("wds"), webdataset_dataset
    else:
        poisoned = other_dataset
    cache = shared / "team" / "cache"
    source = getattr(beam_prep, reader)(uploaded, "train", cache_dir=cache)
    folder = next(p for p in cache.iterdir() if p.is_dir())
    assert len(list(pickle.loads(pickle.dumps(source)))) == len(list(source))  # reopened as it is
    os.chown(shared / "team", ATTACKER, ATTACKER)
    (shared / "team").chmod(0o777)
    poison = {f.name: f.read_bytes() for f in poisoned.iterdir() if f.is_file()}

    def swap():
        (shared / "team" / "cache").rename(shared / "team" / "moved")
        (shared / "team" / "cache" / folder.name).mkdir(parents=True)
        for name, data in poison.items():
            (shared / "team" / "cache" / folder.name / name).write_bytes(data)

    as_attacker(swap)
    refusal = (f"the shard cache's folder {folder} is inside {shared / 'team'}, which belongs to uid {ATTACKER}: "
               "another user could replace it; give a private cache_dir (BEAM_PREP_CACHE): a folder of yours that no "
               "one else can write")
    with pytest.raises(StorageError) as caught:
        pickle.loads(pickle.dumps(source))
    assert str(caught.value) == refusal
    with pytest.raises(StorageError) as caught:
        getattr(beam_prep, reader)(uploaded, "train", cache_dir=cache)
    assert str(caught.value) == refusal.replace(str(folder), str(cache))
