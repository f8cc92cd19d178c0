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
once: each pins the folder (its ``use`` lock, shared, held until the process ends)
before filling it, then takes its ``fill`` lock, so one fetches while the others wait
and then find the stamps. With a size bound (``max_bytes``), the least recently used
folders that no process reads or fills are evicted to make room; the folders in use
count toward the bound, and a split that does not fit beside them is refused
(``StorageError``, one line) rather than the bound exceeded. Without a bound nothing
is evicted: a disk without room for the split refuses it. Eviction considers only the
folders the cache made (their name and a marker), never anything else under the
cache folder (a folder an earlier beam-prep made, without the marker, is marked when
a read uses it again, and kept until then). A read refused before it fetched anything
leaves no folder behind. ``cache_room`` holds the rules, the locks and why they are
``fcntl``'s.

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

from beam_prep.errors import DatasetError, StorageError, UnsafeName
from beam_prep.io.storage import join
from beam_prep.model.dataset import MANIFEST, DatasetInfo, parse_manifest
from beam_prep.reader import cache_room
from beam_prep.reader.manifest_file import read_manifest_bytes

__all__ = ["cache_root", "cached_split"]

_LOG = logging.getLogger(__name__)

FETCH_THREADS = 8  # shards fetched at once; each is held in memory while it is checked and written
_STAMPS = ".stamps"
_STAMP_BYTES = 256  # room reserved for a shard's stamp, beside its bytes
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
      StorageError: a shard cannot be fetched; the split does not fit the size bound
        beside the folders in use, or does not fit the disk (``cache_room.room``).
    """
    bound = _max_bytes(max_bytes)
    text, manifest_path = read_manifest_bytes(origin)
    remote = DatasetInfo.from_json(parse_manifest(text, manifest_path), origin, manifest_path)
    remote.require_format(file_format, reader)
    if split not in remote.splits:
        raise DatasetError(f"{origin} has no split {split!r}; it has {', '.join(remote.splits)}")
    _check_not_own(remote.splits[split].shards, split, manifest_path)
    root = cache_root(cache_dir)
    os.makedirs(root, exist_ok=True)
    manifest_sha256 = hashlib.sha256(text).hexdigest()
    name = _folder_name(origin, manifest_sha256)
    new = not os.path.lexists(os.path.join(root, name))
    # Pinned before it is filled: no other process evicts it from here on, this one's fill included.
    folder = cache_room.open_folder(root, name, origin, manifest_sha256)
    try:
        _fill(origin, remote, text, split, root, folder, bound, threads)
    except Exception:
        if new and not _stamped(folder):
            cache_room.discard(root, folder)  # made by this call, and nothing fetched into it
        raise
    cache_room.touch(os.path.join(folder, cache_room.LAST_USED))
    return DatasetInfo.from_json(parse_manifest(text, manifest_path), folder, manifest_path)


def _fill(origin: str, remote: DatasetInfo, text: bytes, split: str, root: str, folder: str,
          max_bytes: int | None, threads: int) -> None:
    """Fetches the shards of ``split`` that ``folder`` lacks, under its ``fill`` lock, then its manifest."""
    os.makedirs(os.path.join(folder, _STAMPS), exist_ok=True)
    shards = remote.splits[split].shards
    # The manifest's sha256 of each shard, where the writer recorded them; else GCS's CRC32C alone.
    expected = dict(zip(shards, remote.splits[split].shard_sha256 or ()))
    with cache_room.locked(os.path.join(folder, cache_room.FILL_LOCK), fcntl.LOCK_EX):
        missing = [name for name in shards if not _intact(folder, name, expected.get(name))]
        if not missing:
            _write_atomically(os.path.join(folder, MANIFEST), text)
            return
        from beam_prep.io.gcs import GcsClient

        client = GcsClient(connections=max(1, min(threads, len(missing))))
        sizes = dict(client.list(origin))
        fetched = sum(sizes.get(join(origin, name), 0) for name in missing)
        needed = fetched + len(missing) * _STAMP_BYTES + len(text)  # the shards, their stamps, the manifest
        with cache_room.room(root, folder, needed, max_bytes, origin, split):
            _LOG.info("fetching %d shards (%d bytes) of %s into %s", len(missing), fetched, origin, folder)
            with concurrent.futures.ThreadPoolExecutor(min(threads, len(missing)),
                                                       thread_name_prefix="beam-prep-fetch") as pool:
                list(pool.map(lambda name: _fetch(client, origin, folder, name, expected.get(name)), missing))
            _write_atomically(os.path.join(folder, MANIFEST), text)


# The files the cache keeps beside a folder's shards: a shard of one of these names would be written over them.
_OWN_NAMES = frozenset({MANIFEST, _STAMPS, cache_room.MARKER, cache_room.USE_LOCK, cache_room.FILL_LOCK,
                        cache_room.LAST_USED, cache_room.RESERVED})


def _check_not_own(shards: tuple[str, ...], split: str, where: str) -> None:
    """Refuses a shard named as one of the cache's own files (its marker, a lock, ``manifest.json``):
    written over it, it would make the folder another's (never evicted) or free its lock under its readers.

    Raises:
      UnsafeName: naming the manifest, the field and the value.
    """
    for i, name in enumerate(shards):
        if name in _OWN_NAMES:
            raise UnsafeName(f"{where}: splits.{split}.shards[{i}] is {name!r}, which the shard cache keeps for "
                             "its own files: a dataset's shards are not named so")


def _folder_name(origin: str, manifest_sha256: str) -> str:
    """``<bucket>_<path>-<manifest hash>``: readable, and new when the dataset is rewritten."""
    return cache_room.folder_name(re.sub(r"[^A-Za-z0-9._-]+", "_", origin[len("gs://"):])[-80:], manifest_sha256)


def _stamped(folder: str) -> bool:
    try:
        return bool(os.listdir(os.path.join(folder, _STAMPS)))
    except OSError:
        return False


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
    if not isinstance(stamp, dict):  # JSON, but not a stamp (damaged): no stamp, as a missing one
        stamp = {}
    sha256 = expected or stamp.get("sha256")
    if not isinstance(sha256, str):
        return False
    size = stamp.get("size") if isinstance(stamp.get("size"), int) else None
    if (stat.st_size, stat.st_mtime_ns) == (size, stamp.get("mtime_ns")) and stamp.get("sha256") == sha256:
        return True
    if size in (None, stat.st_size) and _sha256(path) == sha256:
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
