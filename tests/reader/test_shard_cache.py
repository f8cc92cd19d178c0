"""``data_source("gs://...")`` through the local shard cache, on the real test GCS server (tests/gcs_harness).

One small array_record dataset, prepared locally and uploaded. What the gateway saw tells how many
times each shard was fetched; the records read are compared with the local dataset's own.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
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


def test_gs_errors_name_what_is_wrong_without_tensorflow(gcs_server, gcs_bucket, gcs_missing_bucket, uploaded,
                                                         tmp_path):
    assert beam_prep.load_info(uploaded).labels == ("ant", "bee", "cat")
    with pytest.raises(StorageError, match=rf"bucket gs://{gcs_missing_bucket} does not exist"):
        beam_prep.load_info(f"gs://{gcs_missing_bucket}/ds")
    with pytest.raises(DatasetError, match=r"no manifest.json at gs://.*/nothing/manifest.json"):
        beam_prep.data_source(gcs_bucket.url("nothing"), "train", cache_dir=tmp_path)
    with pytest.raises(DatasetError, match=r"has no split 'test'; it has train, validation"):
        beam_prep.data_source(uploaded, "test", cache_dir=tmp_path)
