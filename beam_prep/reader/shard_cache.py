"""A local cache of gs:// shards, for readers whose libraries open local files only (array_record).

``data_source("gs://bucket/ds", "train")`` reads the manifest from GCS, then makes
sure the split's shards are in ``CACHE/<dataset>-<manifest hash>/``: missing ones are
fetched in parallel, each read checked against the CRC32C that GCS sends and against
the sha256 the manifest records for it (``shard_sha256``; a mismatch is fetched once
more, then refused naming the shard), written to a temporary name and renamed into
place, and given a stamp (its size, modification time and sha256). A later run, in
this process or another, finds the stamps and fetches nothing; a shard whose size or
time no longer matches its stamp is hashed again, and fetched again if its bytes
no longer have the manifest's sha256. A dataset rewritten at the same URL has another
manifest, hence another folder: a run still reading the old one keeps it.

Several processes (DataLoader or Grain workers, several jobs on a host) may start at
once: filling a folder takes its ``fill`` lock (``fcntl.flock``), so one fetches while
the others wait and then find the stamps. Each source holds its folder's ``use`` lock
shared while it lives; to stay under the size bound, the least recently used folders
whose ``use`` lock is free are evicted, never one in use.

A manifest written before ``shard_sha256`` (or whose writer could not report one
shard's) has none for the split: a download is then checked with GCS's CRC32C only,
and a cached copy against the sha256 taken when it was fetched.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from typing import IO

from beam_prep.errors import DatasetError, StorageError
from beam_prep.io.storage import join
from beam_prep.model.dataset import MANIFEST, DatasetInfo, parse_manifest
from beam_prep.reader.manifest_file import read_manifest_bytes

__all__ = ["cache_root", "cached_split"]

_LOG = logging.getLogger(__name__)

FETCH_THREADS = 8  # shards fetched at once; each is held in memory while it is checked and written
_STAMPS = ".stamps"
_FILL_LOCK = ".fill.lock"
_USE_LOCK = ".use.lock"
_LAST_USED = ".last_used"
_CHUNK = 1 << 20


def cache_root(cache_dir: str | os.PathLike | None = None) -> str:
    """The cache's folder: ``cache_dir``, else ``$BEAM_PREP_CACHE``, else ``~/.cache/beam-prep``."""
    chosen = cache_dir or os.environ.get("BEAM_PREP_CACHE") or os.path.join("~", ".cache", "beam-prep")
    return os.path.abspath(os.path.expanduser(os.fspath(chosen)))


def _max_bytes(max_bytes: int | None) -> int | None:
    if max_bytes is not None:
        return max_bytes
    text = os.environ.get("BEAM_PREP_CACHE_MAX_BYTES")
    if not text:
        return None
    try:
        return int(text)
    except ValueError as e:
        raise StorageError(f"BEAM_PREP_CACHE_MAX_BYTES must be a number of bytes, not {text!r}") from e


def cached_split(origin: str, split: str, file_format: str, reader: str, *,
                 cache_dir: str | os.PathLike | None = None, max_bytes: int | None = None,
                 threads: int = FETCH_THREADS) -> DatasetInfo:
    """The dataset at ``origin`` (gs://) with split ``split``'s shards in the local cache.

    Returns the manifest's ``DatasetInfo`` rooted at the local copy, with a ``use``
    lock held (``pinned``) so that no other process evicts it while this one reads.

    Raises:
      DatasetError: no dataset at ``origin``, another format than ``file_format``
        (naming its reader), no such split; a shard, fetched twice, without the sha256
        the manifest records for it.
      StorageError: a shard cannot be fetched, or the split does not fit the size bound.
    """
    text, manifest_path = read_manifest_bytes(origin)
    remote = DatasetInfo.from_json(parse_manifest(text, manifest_path), origin, manifest_path)
    remote.require_format(file_format, reader)
    if split not in remote.splits:
        raise DatasetError(f"{origin} has no split {split!r}; it has {', '.join(remote.splits)}")
    root = cache_root(cache_dir)
    folder = os.path.join(root, _folder_name(origin, text))
    os.makedirs(os.path.join(folder, _STAMPS), exist_ok=True)
    shards = remote.splits[split].shards
    # The manifest's sha256 of each shard, where the writer recorded them; else GCS's CRC32C alone.
    expected = dict(zip(shards, remote.splits[split].shard_sha256 or ()))
    with _locked(os.path.join(folder, _FILL_LOCK), fcntl.LOCK_EX):
        missing = [name for name in shards if not _intact(folder, name, expected.get(name))]
        if missing:
            from beam_prep.io.gcs import GcsClient

            client = GcsClient(connections=max(1, min(threads, len(missing))))
            sizes = dict(client.list(origin))
            needed = sum(sizes.get(join(origin, name), 0) for name in missing)
            _make_room(root, folder, needed, _max_bytes(max_bytes), origin, split)
            _LOG.info("fetching %d shards (%d bytes) of %s into %s", len(missing), needed, origin, folder)
            with concurrent.futures.ThreadPoolExecutor(min(threads, len(missing)),
                                                       thread_name_prefix="beam-prep-fetch") as pool:
                list(pool.map(lambda name: _fetch(client, origin, folder, name, expected.get(name)), missing))
        _write_atomically(os.path.join(folder, MANIFEST), text)
    _touch(os.path.join(folder, _LAST_USED))
    _pin(folder)
    return DatasetInfo.from_json(parse_manifest(text, manifest_path), folder, manifest_path)


def _folder_name(origin: str, manifest: bytes) -> str:
    """``<bucket>_<path>-<manifest hash>``: readable, and new when the dataset is rewritten."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", origin[len("gs://"):])[-80:]
    return f"{readable}-{hashlib.sha256(manifest).hexdigest()[:16]}"


@contextlib.contextmanager
def _locked(path: str, how: int) -> Iterator[IO[bytes]]:
    with open(path, "ab") as f:
        fcntl.flock(f, how)
        try:
            yield f
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# Folders this process reads: their ``use`` lock stays held (shared) until the process ends, so that
# no other process evicts them under it. One open file per dataset folder, whatever the sources.
_PINNED: dict[str, IO[bytes]] = {}


def _pin(folder: str) -> None:
    if folder not in _PINNED:
        f = open(os.path.join(folder, _USE_LOCK), "ab")  # held open on purpose, for the process
        fcntl.flock(f, fcntl.LOCK_SH)
        _PINNED[folder] = f


def _stamp_path(folder: str, name: str) -> str:
    return os.path.join(folder, _STAMPS, name + ".json")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _intact(folder: str, name: str, expected: str | None) -> bool:
    """Whether shard ``name`` is cached whole: its size and time as stamped, or else its sha256;
    the sha256 is the manifest's (``expected``) where it records one, else the stamp's."""
    path = os.path.join(folder, name)
    try:
        with open(_stamp_path(folder, name), "rb") as f:
            stamp = json.loads(f.read())
        stat = os.stat(path)
    except (OSError, ValueError):
        return False
    sha256 = expected or stamp["sha256"]
    if (stat.st_size, stat.st_mtime_ns) == (stamp["size"], stamp["mtime_ns"]) and stamp["sha256"] == sha256:
        return True
    if stat.st_size == stamp["size"] and _sha256(path) == sha256:
        _write_stamp(folder, name, sha256)  # touched, not changed: stamp its new time
        return True
    _LOG.warning("cached shard %s has changed since it was fetched (size or sha256): fetching it again", path)
    return False


def _fetch(client, origin: str, folder: str, name: str, expected: str | None) -> None:
    """Fetches shard ``name`` into ``folder``, checked against the manifest's sha256 ``expected``
    (if any): a mismatch is fetched once more (a transient fault), then refused."""
    url = join(origin, name)
    for attempt in (1, 2):
        data = client.read(url)  # checked against GCS's CRC32C, retried
        sha256 = hashlib.sha256(data).hexdigest()
        if expected is None or sha256 == expected:
            break
        if attempt == 1:
            _LOG.warning("shard %s has sha256 %s, not the manifest's %s: fetching it again", url, sha256, expected)
    else:
        raise DatasetError(
            f"shard {url} has sha256 {sha256} but the dataset's manifest records {expected} (fetched twice): "
            "it was changed or damaged since the dataset was written; rewrite the dataset or restore the shard")
    path = os.path.join(folder, name)
    _write_atomically(path, data)
    _write_stamp(folder, name, sha256)


def _write_stamp(folder: str, name: str, sha256: str) -> None:
    stat = os.stat(os.path.join(folder, name))
    stamp = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256}
    _write_atomically(_stamp_path(folder, name), json.dumps(stamp).encode("utf-8"))


def _write_atomically(path: str, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all: written beside it, flushed, then renamed over it."""
    partial = f"{path}.partial-{os.getpid()}"
    try:
        with open(partial, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(partial)
        raise StorageError(f"cannot write {path} into the shard cache: {e.strerror or e}") from e


def _touch(path: str) -> None:
    with open(path, "ab"):
        pass
    os.utime(path)


def _folder_bytes(folder: str) -> int:
    total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(parent, name)).st_size
    return total


def _make_room(root: str, folder: str, needed: int, max_bytes: int | None, origin: str, split: str) -> None:
    """Evicts the least recently used folders not in use until ``needed`` more bytes fit.

    Raises:
      StorageError: the split cannot fit: larger than the bound, or than the disk's free space
        once every folder not in use is evicted.
    """
    if max_bytes is not None and needed + _folder_bytes(folder) > max_bytes:
        raise StorageError(f"split {split!r} of {origin} needs {needed + _folder_bytes(folder)} bytes in the "
                           f"shard cache, more than its bound of {max_bytes} (cache_max_bytes or "
                           f"BEAM_PREP_CACHE_MAX_BYTES): raise the bound, or read a smaller split")
    others = [os.path.join(root, d) for d in os.listdir(root)
              if os.path.join(root, d) != folder and os.path.isdir(os.path.join(root, d))]
    others.sort(key=lambda d: _last_used(d))

    def too_full() -> bool:
        over_bound = max_bytes is not None and (sum(map(_folder_bytes, others)) + _folder_bytes(folder)
                                                + needed > max_bytes)
        return over_bound or shutil.disk_usage(root).free < needed

    while others and too_full():
        victim = others.pop(0)
        if _evict(victim):
            _LOG.info("shard cache: evicted %s (least recently used) to make room for %s", victim, origin)
    if too_full():
        raise StorageError(f"split {split!r} of {origin} needs {needed} bytes in the shard cache {root}, "
                           "which cannot make room: free disk space, or point cache_dir (BEAM_PREP_CACHE) "
                           "at a larger disk")


def _last_used(folder: str) -> float:
    try:
        return os.stat(os.path.join(folder, _LAST_USED)).st_mtime
    except OSError:
        return 0.0


def _evict(folder: str) -> bool:
    """Removes ``folder`` if no process uses or fills it (its locks taken without waiting)."""
    try:
        use = open(os.path.join(folder, _USE_LOCK), "ab")  # closed below
    except OSError:
        return False
    with use:
        try:
            fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # in use by a reader
        shutil.rmtree(folder, ignore_errors=True)
        return True
