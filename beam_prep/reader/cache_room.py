"""The shard cache's folders: which are its own, which are in use, and eviction to stay under the bound.

The cache folder may hold anything else (a user's own folders, a symlink, an old
cache's leftovers): eviction considers only a real folder (not a symlink) whose name
has the cache's pattern (``<readable>-<16 hex digits>``) and which holds the marker
the cache writes when it creates the folder, naming the same manifest hash. Nothing
else is opened, locked, counted or removed.

Locks, all ``fcntl.flock`` on files the cache creates:

- ``<folder>/.use.lock``, shared: taken by every process that fills or reads the
  folder, before it fills, and held until the process ends (the kernel releases it
  then, even after a crash or a kill).
- ``<folder>/.fill.lock``, exclusive: one process fetches a folder's shards while
  the others wait, then find them stamped.
- ``<root>/.evict.lock``, exclusive: one process at a time counts the cache, evicts
  and reserves the bytes it is about to fetch (``<folder>/.reserved``), so that two
  fills started at once cannot both take the last room.

A folder is evicted only when its ``use`` and ``fill`` locks are both free (taken
exclusively without waiting): it is first renamed out of its name (so a process
arriving then makes a new folder instead of reading one being removed; one that had
opened its lock file sees the file gone once it holds the lock, and starts again),
then removed, the marker last, so that an eviction cut short is finished by the next.

Why ``fcntl`` and not a library (filelock 4.3, fsspec 2026.9, checked): ``filelock``'s
``FileLock`` is exclusive only; its ``ReadWriteLock`` is an SQLite transaction held
per thread (the pin here is the whole process's, kept across a DataLoader's fork) and
its ``SoftReadWriteLock`` a lease that a killed process keeps until it expires, where
a shared ``flock`` is a few lines of the standard library that the kernel releases the
moment its process ends. fsspec's file caches (``filecache``, ``simplecache``) have no
size bound (an age limit only), no lock between processes (one metadata file that each
rewrites) and no check against the manifest's sha256. Neither is a dependency of
beam-prep.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import re
import shutil
import stat
from collections.abc import Iterator
from typing import IO

from beam_prep.errors import StorageError

_LOG = logging.getLogger(__name__)

MARKER = ".beam-prep-cache.json"
USE_LOCK = ".use.lock"
FILL_LOCK = ".fill.lock"
LAST_USED = ".last_used"
RESERVED = ".reserved"
_EVICT_LOCK = ".evict.lock"
_NAME = re.compile(r"[A-Za-z0-9._-]{1,80}-(?P<hash>[0-9a-f]{16})")
# A folder being removed: its name and a character the cache's names never hold, so it is never taken for one.
_EVICTING = re.compile(rf"(?P<name>{_NAME.pattern})\.evicting~[0-9]+")
_PIN_TRIES = 10


def folder_name(readable: str, manifest_sha256: str) -> str:
    """``<readable>-<the manifest's sha256, 16 digits>``: the only names eviction considers."""
    return f"{readable}-{manifest_sha256[:16]}"


@contextlib.contextmanager
def locked(path: str, how: int) -> Iterator[IO[bytes]]:
    """``path`` (created if absent) locked with ``flock`` ``how`` while the block runs."""
    with open(path, "ab") as f:
        fcntl.flock(f, how)
        try:
            yield f
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# Folders this process fills or reads: their ``use`` lock stays held (shared) until the process ends, so that
# no other process evicts them under it. One open file per dataset folder, whatever the sources.
_PINNED: dict[str, IO[bytes]] = {}


def open_folder(root: str, name: str, origin: str, manifest_sha256: str) -> str:
    """The cache's folder ``name`` under ``root``, created and marked if new, and pinned (``use`` held).

    The pin is taken before the folder is filled, so a folder being filled is never evicted.

    Raises:
      StorageError: ``name`` is a link (to a folder elsewhere, where the shards would go) or a file;
        other processes evicted the folder every time this one opened it.
    """
    folder = os.path.join(root, name)
    for _ in range(_PIN_TRIES):
        if folder in _PINNED:
            return folder
        if os.path.lexists(folder) and not _is_real(folder, stat.S_IFDIR):
            raise StorageError(f"the shard cache's folder {folder} is a link or a file, not a folder the cache made: "
                               "nothing is written through it; remove it, or give another cache_dir")
        with contextlib.suppress(FileNotFoundError):  # evicted between two of these steps: again
            os.makedirs(folder, exist_ok=True)
            _mark(folder, origin, manifest_sha256)
            if _pin(folder):
                return folder
        _LOG.info("shard cache: %s was evicted as this process opened it; making it again", folder)
    raise StorageError(f"cannot keep the shard cache folder {folder}: other processes evicted it "
                       f"{_PIN_TRIES} times as this one opened it; give this dataset a bound that fits "
                       f"(cache_max_bytes or BEAM_PREP_CACHE_MAX_BYTES), or another cache_dir")


def discard(root: str, folder: str) -> None:
    """Unpins ``folder``, which this process made and could not fill, and removes it unless another
    process has opened it since: a refused read leaves nothing behind."""
    pinned = _PINNED.pop(folder, None)
    if pinned is not None:
        pinned.close()
    with locked(os.path.join(root, _EVICT_LOCK), fcntl.LOCK_EX):
        _evict(folder)


def _mark(folder: str, origin: str, manifest_sha256: str) -> None:
    """Writes the marker that makes ``folder`` the cache's own (a folder of an earlier beam-prep, without
    one, becomes the cache's when it is used again: its name holds this manifest's hash)."""
    marker = os.path.join(folder, MARKER)
    if os.path.exists(marker):
        return
    touch(os.path.join(folder, LAST_USED))  # a new folder is the most recently used, not the least
    partial = f"{marker}.partial-{os.getpid()}"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump({"written_by": "beam-prep shard cache", "origin": origin, "manifest_sha256": manifest_sha256}, f)
    os.replace(partial, marker)


def _pin(folder: str) -> bool:
    """Holds ``folder``'s ``use`` lock shared; False when the folder was evicted meanwhile."""
    path = os.path.join(folder, USE_LOCK)
    try:
        f = open(path, "ab")  # held open on purpose, for the process
    except FileNotFoundError:
        return False
    fcntl.flock(f, fcntl.LOCK_SH)
    try:
        same = os.path.samestat(os.fstat(f.fileno()), os.stat(path))
    except FileNotFoundError:
        same = False
    if not same:  # renamed away by an eviction while this process waited for the lock
        f.close()
        return False
    _PINNED[folder] = f
    return True


def touch(path: str) -> None:
    with open(path, "ab"):
        pass
    os.utime(path)


@dataclasses.dataclass(frozen=True)
class _Folder:
    path: str
    on_disk: int  # its files' bytes now
    counted: int  # those, or the bytes a fill under way reserved, whichever is more
    last_used: float


def _folder_bytes(folder: str) -> int:
    total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(parent, name)).st_size
    return total


def _is_real(path: str, kind: int) -> bool:
    try:
        return stat.S_IFMT(os.lstat(path).st_mode) == kind
    except OSError:
        return False


def _ours(folder: str, manifest_hash: str) -> bool:
    """Whether ``folder`` is a real folder holding the cache's marker for the hash its name ends with."""
    marker = os.path.join(folder, MARKER)
    if not (_is_real(folder, stat.S_IFDIR) and _is_real(marker, stat.S_IFREG)):
        return False
    try:
        with open(marker, "rb") as f:
            recorded = json.loads(f.read(4096)).get("manifest_sha256", "")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(recorded, str) and recorded[:16] == manifest_hash


def _read_int(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return int(f.read(32))
    except (OSError, ValueError):
        return 0


def _cache_folders(root: str) -> list[_Folder]:
    """The cache's own folders under ``root``, least recently used first."""
    found = []
    for entry in os.scandir(root):
        match = _NAME.fullmatch(entry.name)
        if match and _ours(entry.path, match["hash"]):
            on_disk = _folder_bytes(entry.path)
            counted = max(on_disk, _read_int(os.path.join(entry.path, RESERVED)))
            try:
                last_used = os.stat(os.path.join(entry.path, LAST_USED)).st_mtime
            except OSError:
                last_used = 0.0
            found.append(_Folder(entry.path, on_disk, counted, last_used))
    return sorted(found, key=lambda f: (f.last_used, f.path))


def _remove(folder: str) -> None:
    """Removes a folder of the cache, its marker last: one cut short still has it, and is finished later."""
    for entry in os.scandir(folder):
        if entry.name != MARKER:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.remove(entry.path)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(folder, MARKER))
    os.rmdir(folder)


def _finish_evictions(root: str) -> None:
    """Removes what an eviction cut short left (under ``.evict.lock``: no eviction is under way)."""
    for entry in os.scandir(root):
        match = _EVICTING.fullmatch(entry.name)
        if match and _is_real(entry.path, stat.S_IFDIR) and (
                _ours(entry.path, match["hash"]) or not os.listdir(entry.path)):
            with contextlib.suppress(OSError):
                _remove(entry.path)


def _evict(folder: str) -> bool:
    """Removes ``folder`` if no process uses or fills it (its locks taken without waiting)."""
    evicting = f"{folder}.evicting~{os.getpid()}"
    try:
        with open(os.path.join(folder, USE_LOCK), "ab") as use, open(os.path.join(folder, FILL_LOCK), "ab") as fill:
            try:
                fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fill, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # in use by a reader, or being filled
            os.rename(folder, evicting)
    except OSError as e:
        _LOG.warning("shard cache: cannot evict %s: %s", folder, e.strerror or e)
        return False
    try:
        _remove(evicting)
    except OSError as e:
        _LOG.warning("shard cache: %s was evicted but not wholly removed (%s); the next eviction removes it",
                     evicting, e)
    return True


def _free_bytes(root: str, folders: list[_Folder]) -> int:
    """The disk's free space, less what fills under way have reserved and not yet written."""
    return shutil.disk_usage(root).free - sum(f.counted - f.on_disk for f in folders)


@contextlib.contextmanager
def room(root: str, folder: str, needed: int, max_bytes: int | None, origin: str, split: str) -> Iterator[None]:
    """Makes room for ``needed`` more bytes in ``folder`` and reserves them while the block fetches.

    With a bound, the least recently used folders of the cache that no process uses or
    fills are evicted until every folder of the cache, those in use included, and the
    fetch fit under it (and on the disk). Without a bound nothing is evicted.

    Raises:
      StorageError: the split is larger than the bound; the folders in use alone leave
        too little of the bound; the disk has too little free space (without a bound,
        or once every folder not in use is evicted).
    """
    with locked(os.path.join(root, _EVICT_LOCK), fcntl.LOCK_EX):
        _finish_evictions(root)
        everything = _cache_folders(root)
        own = _folder_bytes(folder) + needed
        if max_bytes is not None and own > max_bytes:
            raise StorageError(f"split {split!r} of {origin} needs {own} bytes in the shard cache, more than its "
                               f"bound of {max_bytes} (cache_max_bytes or BEAM_PREP_CACHE_MAX_BYTES): raise the "
                               "bound, or read a smaller split")
        others = [f for f in everything if f.path != folder]
        free = _free_bytes(root, others)
        if max_bytes is None:
            if free < needed:
                raise StorageError(
                    f"split {split!r} of {origin} needs {needed} bytes in the shard cache {root}, and its disk has "
                    f"{free} free; with no bound (cache_max_bytes or BEAM_PREP_CACHE_MAX_BYTES) nothing is evicted: "
                    "free disk space, set a bound, or point cache_dir (BEAM_PREP_CACHE) at a larger disk")
        else:
            total = own + sum(f.counted for f in others)
            kept = []
            for candidate in others:
                if total <= max_bytes and free >= needed:
                    kept.append(candidate)
                elif _evict(candidate.path):
                    _LOG.info("shard cache: evicted %s (least recently used) to make room for %s",
                              candidate.path, origin)
                    total -= candidate.counted
                    free += candidate.on_disk
                else:
                    kept.append(candidate)
            if total > max_bytes:
                in_use = sum(f.counted for f in kept)
                raise StorageError(
                    f"split {split!r} of {origin} needs {own} bytes in the shard cache {root}, and the folders "
                    f"being read or filled there hold {in_use}: together more than its bound of "
                    f"{max_bytes} (cache_max_bytes or BEAM_PREP_CACHE_MAX_BYTES); raise the bound, or read it "
                    "when those processes have ended")
            if free < needed:
                raise StorageError(
                    f"split {split!r} of {origin} needs {needed} bytes in the shard cache {root}, and its disk has "
                    f"{free} free once every folder no process uses is evicted: free disk space, or point "
                    "cache_dir (BEAM_PREP_CACHE) at a larger disk")
        reserved = os.path.join(folder, RESERVED)
        with open(reserved, "w", encoding="ascii") as f:
            f.write(str(own))
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.remove(reserved)  # what the fill wrote is on disk now: counted as it is
