"""A local cache of gs:// shards, for readers whose libraries open local files only (array_record).

``cached_split`` makes sure a split's shards are in the user's private cache folder, each
checked against the manifest's sha256 (or GCS's CRC32C) when fetched and again the first time
each process uses it. ``docs/design/reader.md`` (the ``gs://`` cache) says how and why.
"""
from __future__ import annotations

import concurrent.futures
import fcntl
import hashlib
import json
import logging
import os
import unicodedata

from beam_prep.errors import DatasetError, StorageError, UnsafeName
from beam_prep.io.storage import join
from beam_prep.model.dataset import MANIFEST, DatasetInfo, parse_manifest
from beam_prep.reader import cache_fs, cache_path, cache_room
from beam_prep.reader.cache_fs import Dir
from beam_prep.reader.manifest_file import read_manifest_bytes

__all__ = ["FolderCheck", "cache_root", "cached_split", "folder_check"]

_LOG = logging.getLogger(__name__)

FETCH_THREADS = 8  # shards fetched at once; each is held in memory while it is checked and written
_STAMPS = ".stamps"
_STAMP_BYTES = 256  # room reserved for a shard's stamp, beside its bytes

# The shards this process has checked (their sha256), by file: a file changed since (its time moves) is checked
# again. (st_dev, st_ino) -> (size, mtime_ns, ctime_ns, sha256)
_CHECKED: dict[tuple[int, int], tuple[int, int, int, str]] = {}
# The folders ``cached_split`` filled in this process: path -> (st_dev, st_ino).
_FILLED: dict[str, tuple[int, int]] = {}


class FolderCheck:
    """A cached split's folder as this process filled it, held by a reader that opens its shards by path:
    unpickled (into a data loader's worker), it first checks that the path still leads, safely, to that
    very folder (``cache_path.same_folder``), so that the worker never reads another's in its place.

    Raises (on unpickling):
      StorageError: the folder was replaced, or the way to it is no longer safe.
    """

    def __init__(self, path: str, identity: tuple[int, int]) -> None:
        self.path = path
        self.identity = identity

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.check()

    def check(self) -> None:
        """Refuses the folder unless its path still leads, safely, to the very folder this process filled.

        Raises:
          StorageError: the folder was replaced, or the way to it is no longer safe.
        """
        cache_path.same_folder(self.path, tuple(self.identity))


def folder_check(root: str) -> FolderCheck | None:
    """The check for the cache folder ``root``, where ``cached_split`` filled it in this process; else None."""
    identity = _FILLED.get(root)
    return None if identity is None else FolderCheck(root, identity)


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
                 threads: int = FETCH_THREADS, version: int | None = None) -> DatasetInfo:
    """The dataset at ``origin`` (gs://) with split ``split``'s shards in the local cache: those of
    ``version`` (``DatasetInfo.at_version``; None: the latest), an earlier version's alone.

    Returns the manifest's ``DatasetInfo`` rooted at the local copy, with a ``use``
    lock held (``pinned``) so that no other process evicts it while this one reads.

    Raises:
      DatasetError: no dataset at ``origin``, another format than ``file_format``
        (naming its reader), no such version or split; a shard, fetched twice, without the sha256
        the manifest records for it. UnsafeName: a shard named as one of the cache's
        own files (ignoring case), or named twice.
      StorageError: a shard cannot be fetched, or arrives larger than GCS listed it; the
        split does not fit the size bound beside the folders in use, or does not fit the
        disk (``cache_room.room``); the cache folder, the way to it (``cache_path``) or
        something in it is not the user's own (``cache_fs``); a lock held by another
        process past ``$BEAM_PREP_CACHE_LOCK_TIMEOUT``, or that variable is not a finite
        number of seconds, 0 or more.
    """
    bound = _max_bytes(max_bytes)
    cache_fs.lock_timeout()  # a bad $BEAM_PREP_CACHE_LOCK_TIMEOUT refused before anything is fetched
    text, manifest_path = read_manifest_bytes(origin)
    remote = DatasetInfo.from_json(parse_manifest(text, manifest_path), origin, manifest_path)
    remote.require_format(file_format, reader)
    remote = remote.at_version(version)
    if split not in remote.splits:
        raise DatasetError(f"{origin} has no split {split!r}; it has {', '.join(remote.splits)}")
    check_names(remote.splits[split].shards, split, manifest_path)
    manifest_sha256 = hashlib.sha256(text).hexdigest()
    name = cache_room.folder_name(origin, manifest_sha256)
    root = cache_room.open_root(cache_root(cache_dir))
    try:
        new = name not in cache_fs.entries(root)
        # Pinned before it is filled: no other process evicts it from here on, this one's fill included.
        folder = cache_room.open_folder(root, name, origin, manifest_sha256)
        try:
            _fill(origin, remote, text, split, root, folder, bound, threads)
        except Exception:
            if new and not _stamped(folder):
                cache_room.discard(root, folder)  # made by this call, and nothing fetched into it
            raise
        cache_fs.touch(folder, cache_room.LAST_USED)
        st = os.fstat(folder.fd)
        _FILLED[folder.path] = (st.st_dev, st.st_ino)
    finally:
        root.close()
    return DatasetInfo.from_json(parse_manifest(text, manifest_path), folder.path, manifest_path)


def _fill(origin: str, remote: DatasetInfo, text: bytes, split: str, root: Dir, folder: Dir,
          max_bytes: int | None, threads: int) -> None:
    """Fetches the shards of ``split`` that ``folder`` lacks, under its ``fill`` lock, then its manifest."""
    shards = remote.splits[split].shards
    # The manifest's sha256 of each shard, where the writer recorded them; else GCS's CRC32C alone.
    expected = dict(zip(shards, remote.splits[split].shard_sha256 or ()))
    with cache_room.locked(folder, cache_room.FILL_LOCK, fcntl.LOCK_EX):
        stamps = cache_fs.open_dir(folder, _STAMPS, create=True)
        try:
            cache_room.clear_leftovers(folder, stamps)
            missing = [name for name in shards if not _intact(folder, stamps, name, expected.get(name))]
            if not missing:
                cache_fs.write_new(folder, MANIFEST, text)
                return
            from beam_prep.io.gcs import GcsClient

            client = GcsClient(connections=max(1, min(threads, len(missing))))
            sizes = dict(client.list(origin))
            fetched = sum(sizes.get(join(origin, name), 0) for name in missing)
            needed = fetched + len(missing) * _STAMP_BYTES + len(text)  # the shards, their stamps, the manifest
            with cache_room.room(root, folder, needed, max_bytes, origin, split):
                _LOG.info("fetching %d shards (%d bytes) of %s into %s", len(missing), fetched, origin, folder.path)
                with concurrent.futures.ThreadPoolExecutor(min(threads, len(missing)),
                                                           thread_name_prefix="beam-prep-fetch") as pool:
                    list(pool.map(lambda name: _fetch(client, origin, folder, stamps, name, expected.get(name),
                                                      sizes.get(join(origin, name), 0)), missing))
                cache_fs.write_new(folder, MANIFEST, text)
        finally:
            stamps.close()


# The files the cache keeps beside a folder's shards: a shard of one of these names would be written over them.
_OWN_NAMES = (MANIFEST, _STAMPS, cache_room.MARKER, cache_room.USE_LOCK, cache_room.FILL_LOCK,
              cache_room.LAST_USED, cache_room.RESERVED)
_OWN_FOLDED = frozenset(unicodedata.normalize("NFKC", name).casefold() for name in _OWN_NAMES)


def _folded(name: str) -> str:
    """``name`` as a file system that ignores case (and Unicode's compatibility forms) may take it."""
    return unicodedata.normalize("NFKC", name).casefold()


def check_names(shards: tuple[str, ...], split: str, where: str) -> None:
    """Refuses a shard named as one of the cache's own files (its marker, a lock, ``manifest.json``), or as
    its temporaries (``<name>.partial-<pid>``), ignoring case: on a file system that ignores case, written
    over it, it would make the folder another's (never evicted) or free its lock under its readers. Refuses a
    shard named twice (ignoring case): two threads would fetch it into one file at once.

    Raises:
      UnsafeName: naming the manifest, the field and the value.
    """
    seen: dict[str, int] = {}
    for i, name in enumerate(shards):
        folded = _folded(name)
        if folded in _OWN_FOLDED or cache_room.PARTIAL.search(folded):
            raise UnsafeName(f"{where}: splits.{split}.shards[{i}] is {name!r}, which the shard cache keeps for "
                             "its own files: a dataset's shards are not named so")
        if folded in seen:
            j = seen[folded]
            alike = "" if shards[j] == name else f" ({shards[j]!r}, the same name to a file system that ignores case)"
            raise UnsafeName(f"{where}: splits.{split}.shards[{i}] is {name!r}, which shards[{j}] names too{alike}: "
                             "a split names each shard once")
        seen[folded] = i


def _stamped(folder: Dir) -> bool:
    try:
        stamps = cache_fs.open_dir(folder, _STAMPS)
    except (OSError, StorageError):
        return False
    try:
        return bool(cache_fs.entries(stamps))
    finally:
        stamps.close()


def _stamp_name(name: str) -> str:
    return cache_fs.fitting(name, ".json")


def _stamp(stamps: Dir, name: str) -> dict:
    """Shard ``name``'s stamp (its size and sha256 when fetched); empty where none or damaged."""
    try:
        stamp = json.loads(cache_fs.read_small(stamps, _stamp_name(name)) or b"{}")
    except ValueError:
        return {}
    return stamp if isinstance(stamp, dict) else {}  # JSON, but not a stamp (damaged): as a missing one


def _intact(folder: Dir, stamps: Dir, name: str, expected: str | None) -> bool:
    """Whether shard ``name`` is cached whole: its sha256 checked, the first time this process uses this file,
    against the manifest's (``expected``) where it records one, else the stamp's (taken when fetched).

    Raises:
      StorageError: a link or a file of another user at ``name`` (``cache_fs.open_file``).
    """
    try:
        fd = cache_fs.open_file(folder, name, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        st = os.fstat(fd)
        stamp = _stamp(stamps, name)
        sha256 = expected or stamp.get("sha256")
        if not isinstance(sha256, str):
            return False
        if _CHECKED.get((st.st_dev, st.st_ino)) == (st.st_size, st.st_mtime_ns, st.st_ctime_ns, sha256):
            return True
        size = stamp.get("size")
        if (not isinstance(size, int) or size == st.st_size) and cache_fs.sha256_of(fd) == sha256:
            _CHECKED[st.st_dev, st.st_ino] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, sha256)
            return True
    finally:
        os.close(fd)
    _LOG.warning("cached shard %s has changed since it was fetched (size or sha256): fetching it again",
                 folder.join(name))
    return False


def _fetch(client, origin: str, folder: Dir, stamps: Dir, name: str, expected: str | None, listed: int) -> None:
    """Fetches shard ``name`` into ``folder``, checked against the manifest's sha256 ``expected``
    (if any): a mismatch is fetched once more (a transient fault), then refused. Bytes beyond the
    ``listed`` size the cache made room for are refused before anything is written: the bound holds."""
    url = join(origin, name)
    for attempt in (1, 2):
        data = client.read(url)  # checked against GCS's CRC32C, retried
        if len(data) > listed:
            raise StorageError(
                f"shard {url} is {len(data)} bytes, more than the {listed} GCS listed for it as the shard cache made "
                "room for the split: it was replaced since, and nothing of it is kept; read again once the dataset "
                "is no longer being rewritten")
        sha256 = hashlib.sha256(data).hexdigest()
        if expected is None or sha256 == expected:
            break
        if attempt == 1:
            _LOG.warning("shard %s has sha256 %s, not the manifest's %s: fetching it again", url, sha256, expected)
    else:
        raise DatasetError(
            f"shard {url} has sha256 {sha256} but the dataset's manifest records {expected} (fetched twice): "
            "it was changed or damaged since the dataset was written; rewrite the dataset or restore the shard")
    st = cache_fs.write_new(folder, name, data)
    _CHECKED[st.st_dev, st.st_ino] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, sha256)
    cache_fs.write_new(stamps, _stamp_name(name), json.dumps({"size": st.st_size, "sha256": sha256}).encode("utf-8"))

