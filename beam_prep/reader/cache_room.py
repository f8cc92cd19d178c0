"""The shard cache's folders: its private root, which folders are its own, which are in use, the
locks between processes, and eviction to stay under the bound. ``docs/design/reader.md`` (the
``gs://`` cache) says how and why.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import stat
from collections.abc import Iterator

from beam_prep.errors import StorageError
from beam_prep.reader import cache_fs, cache_path
from beam_prep.reader.cache_fs import PRIVATE, Dir

_LOG = logging.getLogger(__name__)

MARKER = ".beam-prep-cache.json"
USE_LOCK = ".use.lock"
FILL_LOCK = ".fill.lock"
LAST_USED = ".last_used"
RESERVED = ".reserved"
EVICT_LOCK = ".evict.lock"
# What a writer killed mid-write leaves (``cache_fs.write_new``): removed by the next fill, under the fill lock.
PARTIAL = re.compile(r"\.partial-[0-9]+\Z")
_READABLE_MAX = 80  # characters of the origin a folder's name shows
_HASH_DIGITS = 16  # of each sha256 in a folder's name
# Every name ``folder_name`` (and ``_earlier_name``) gives: the readable part, then one hash or two.
_NAME = re.compile(rf"[A-Za-z0-9._-]{{0,{_READABLE_MAX}}}(?:-[0-9a-f]{{{_HASH_DIGITS}}}){{1,2}}")
# A folder being removed: its name and a character the cache's names never hold, so it is never taken for one.
_EVICTING = re.compile(rf"(?P<name>{_NAME.pattern})\.evicting~[0-9]+")
_PIN_TRIES = 10


def _readable(origin: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", origin.split("://", 1)[-1])[-_READABLE_MAX:]


def folder_name(origin: str, manifest_sha256: str) -> str:
    """``<bucket>_<path>-<the origin's sha256>-<the manifest's sha256>`` (16 digits each): readable, bound
    to the origin exactly (``gs://a/b_c`` and ``gs://a_b/c`` read alike), new when the dataset is rewritten."""
    origin_sha256 = hashlib.sha256(origin.encode()).hexdigest()
    return f"{_readable(origin)}-{origin_sha256[:_HASH_DIGITS]}-{manifest_sha256[:_HASH_DIGITS]}"


def _earlier_name(origin: str, manifest_sha256: str) -> str:
    """The name an earlier beam-prep gave the folder (no origin hash): never read, evicted as the cache's."""
    return f"{_readable(origin)}-{manifest_sha256[:_HASH_DIGITS]}"


def open_root(path: str) -> Dir:
    """The cache's root at ``path`` (made 0700 if absent, as the folders missing above it), open, reached
    from ``/`` as ``cache_path.open_path`` reaches it: ``path`` itself where it is the user's and no one
    else can write it; else, where it is shared with the sticky bit (``/tmp``, or a team's folder made
    1777), ``path/<uid>``, made 0700 and checked the same way.

    Raises:
      StorageError: ``path``, or a folder above it, can be replaced by another user (theirs, or writable by
        others without the sticky bit), or is reached through a link another user could have placed;
        ``path/<uid>`` is not the user's own; ``path`` is ``/``; ``path`` is on NFS or another filesystem whose ``flock`` does
        not lock between processes; ``path`` cannot be opened or made (a file on the way, a name too long).
    """
    top = cache_path.open_path(path, create=True)
    try:
        if top.path == "/":
            raise StorageError(f"the shard cache's folder {path} is the file system's root /, where the cache's "
                               f"own files would lie among the system's; {PRIVATE}")
        cache_fs.check_locks_work(top)
        st = os.fstat(top.fd)
        euid = os.geteuid()
        if st.st_uid == euid and not cache_path.writable_by_others(st):
            return top
    except BaseException:
        top.close()
        raise
    try:
        if st.st_uid not in (euid, 0) or not st.st_mode & stat.S_ISVTX:
            why = cache_path.replaceable(st) or f"belongs to uid {st.st_uid}"
            raise StorageError(f"the shard cache's folder {top.path} {why}: another user could replace what the "
                               f"cache keeps there; {PRIVATE}")
        try:
            return cache_fs.open_dir(top, str(euid), create=True)
        except OSError as e:
            raise StorageError(f"cannot make the shard cache's folder {top.join(str(euid))}: {e.strerror or e}; "
                               f"{PRIVATE}") from e
    finally:
        top.close()


@contextlib.contextmanager
def locked(folder: Dir, name: str, how: int) -> Iterator[None]:
    """``folder``'s lock file ``name`` (made if absent) ``flock``ed ``how`` while the block runs, after a
    bounded wait (``cache_fs.lock``)."""
    fd = cache_fs.open_file(folder, name, os.O_RDWR, create=True)
    try:
        cache_fs.lock(fd, how, folder.join(name))
        yield
    finally:
        os.close(fd)  # the lock with it


# Folders this process fills or reads: open, with their ``use`` lock held (shared) until the process ends, so
# that no other process evicts them under it. One per dataset folder, whatever the sources.
_PINNED: dict[str, tuple[Dir, int]] = {}


def open_folder(root: Dir, name: str, origin: str, manifest_sha256: str) -> Dir:
    """The cache's folder ``name`` under ``root``, made 0700 and marked if new, open and pinned (``use``
    held), so that no other process evicts it (its fill included).

    Raises:
      StorageError: ``name`` is a link or a file, or not the user's own; its marker names another dataset;
        other processes evicted the folder every time this one opened it; a lock held too long.
    """
    path = root.join(name)
    for _ in range(_PIN_TRIES):
        if path in _PINNED:
            return _PINNED[path][0]
        with contextlib.suppress(FileNotFoundError):  # evicted between two of these steps: again
            folder = cache_fs.open_dir(root, name, create=True)
            if _pin(root, name, folder):
                try:
                    _mark(folder, origin, manifest_sha256)
                except BaseException:
                    _unpin(folder)
                    raise
                return folder
        _LOG.info("shard cache: %s was evicted as this process opened it; making it again", path)
    raise StorageError(f"cannot keep the shard cache folder {path}: other processes evicted it "
                       f"{_PIN_TRIES} times as this one opened it; give this dataset a bound that fits "
                       f"(cache_max_bytes or BEAM_PREP_CACHE_MAX_BYTES), or another cache_dir")


def _pin(root: Dir, name: str, folder: Dir) -> bool:
    """Holds ``folder``'s ``use`` lock shared; False (``folder`` closed) when it was evicted meanwhile."""
    try:
        fd = cache_fs.open_file(folder, USE_LOCK, os.O_RDWR, create=True)  # held open on purpose, for the process
    except BaseException:
        folder.close()
        raise
    try:
        cache_fs.lock(fd, fcntl.LOCK_SH, folder.join(USE_LOCK))
    except BaseException:
        os.close(fd)
        folder.close()
        raise
    if not cache_fs.same(root, name, folder):  # renamed away by an eviction while this process waited
        os.close(fd)
        folder.close()
        return False
    _PINNED[root.join(name)] = (folder, fd)
    return True


def _mark(folder: Dir, origin: str, manifest_sha256: str) -> None:
    """Writes the marker that makes ``folder`` the cache's own (under its fill lock: a fill removes what
    a writer killed mid-write left), or checks the one there names this dataset.

    Raises:
      StorageError: the marker names another origin or manifest (or is damaged).
    """
    if _marker(folder) is None:
        with locked(folder, FILL_LOCK, fcntl.LOCK_EX):
            if _marker(folder) is None:
                cache_fs.touch(folder, LAST_USED)  # a new folder is the most recently used, not the least
                cache_fs.write_new(folder, MARKER, json.dumps(
                    {"written_by": "beam-prep shard cache", "origin": origin,
                     "manifest_sha256": manifest_sha256}).encode("utf-8"))
    if _marker(folder) != (origin, manifest_sha256):
        raise StorageError(f"the shard cache's folder {folder.path} is marked ({MARKER}) as another dataset's "
                           f"than {origin}'s: nothing is read from it; remove it, or give another cache_dir")


def _marker(folder: Dir) -> tuple[str, str] | None:
    """The origin and manifest sha256 ``folder``'s marker names; None without one; ("", "") if damaged."""
    text = cache_fs.read_small(folder, MARKER)
    if text is None:
        return None
    try:
        marker = json.loads(text)
        origin, manifest_sha256 = marker["origin"], marker["manifest_sha256"]
    except (ValueError, TypeError, KeyError):
        return ("", "")
    return (origin, manifest_sha256) if isinstance(origin, str) and isinstance(manifest_sha256, str) else ("", "")


def clear_leftovers(folder: Dir, *inner: Dir) -> None:
    """Removes what a fill killed mid-write left in ``folder`` (and in ``inner``, its folders): its partial
    files and its reservation. Under the folder's fill lock, held exclusively: no other fill is under way,
    so whatever partial file or reservation is there is a dead one's."""
    for where in (folder, *inner):
        for name in cache_fs.entries(where):
            if PARTIAL.search(name) or (where is folder and name == RESERVED):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=where.fd)
                _LOG.info("shard cache: removed %s, left by a fill that did not end", where.join(name))


def discard(root: Dir, folder: Dir) -> None:
    """Unpins ``folder``, which this process made and could not fill, and removes it unless another
    process has opened it since: a refused read leaves nothing behind."""
    _unpin(folder)
    with locked(root, EVICT_LOCK, fcntl.LOCK_EX):
        _evict(root, os.path.basename(folder.path))


def _unpin(folder: Dir) -> None:
    pinned = _PINNED.pop(folder.path, None)
    if pinned is not None:
        os.close(pinned[1])
        pinned[0].close()


@dataclasses.dataclass(frozen=True)
class _Folder:
    name: str
    on_disk: int  # its files' bytes now
    counted: int  # those, or the bytes a fill under way reserved, whichever is more
    last_used: float


def _ours(root: Dir, name: str) -> Dir | None:
    """``root``'s folder ``name``, open, if it is the user's and holds the cache's marker for that very name."""
    try:
        folder = cache_fs.open_dir(root, name)
    except (OSError, StorageError):
        return None
    try:
        marker = _marker(folder)
    except (OSError, StorageError):
        marker = None
    if marker is None or name not in (folder_name(*marker), _earlier_name(*marker)):
        folder.close()
        return None
    return folder


def _read_int(folder: Dir, name: str) -> int:
    try:
        return int(cache_fs.read_small(folder, name, 32) or b"0")
    except (OSError, ValueError, StorageError):
        return 0


def _cache_folders(root: Dir) -> list[_Folder]:
    """The cache's own folders under ``root``, least recently used first."""
    found = []
    for name in cache_fs.entries(root):
        if _NAME.fullmatch(name) and (folder := _ours(root, name)) is not None:
            try:
                on_disk = cache_fs.tree_bytes(folder)
                counted = max(on_disk, _read_int(folder, RESERVED))
                try:
                    last_used = os.stat(LAST_USED, dir_fd=folder.fd, follow_symlinks=False).st_mtime
                except OSError:
                    last_used = 0.0
            finally:
                folder.close()
            found.append(_Folder(name, on_disk, counted, last_used))
    return sorted(found, key=lambda f: (f.last_used, f.name))


def _finish_evictions(root: Dir) -> None:
    """Removes what an eviction cut short left (under ``.evict.lock``: no eviction is under way): a folder
    whose marker names it, through descriptors; one left without its marker (removed last), if it is
    empty: by ``rmdir``, which removes nothing that is not."""
    for name in cache_fs.entries(root):
        match = _EVICTING.fullmatch(name)
        if match is None:
            continue
        with contextlib.suppress(OSError, StorageError):
            folder = cache_fs.open_dir(root, name)
            try:
                marker = _marker(folder)
            finally:
                folder.close()
            if marker is None:
                os.rmdir(name, dir_fd=root.fd)
            elif match["name"] in (folder_name(*marker), _earlier_name(*marker)):
                cache_fs.remove_tree(root, name, last=MARKER)


def _evict(root: Dir, name: str) -> bool:
    """Removes ``root``'s folder ``name`` if no process uses or fills it (its locks taken without waiting):
    renamed out of its name first, then removed through descriptors, its marker last."""
    try:
        folder = cache_fs.open_dir(root, name)
    except (OSError, StorageError):
        return False
    evicting = f"{name}.evicting~{os.getpid()}"
    try:
        use = cache_fs.open_file(folder, USE_LOCK, os.O_RDWR, create=True)
        try:
            fill = cache_fs.open_file(folder, FILL_LOCK, os.O_RDWR, create=True)
            try:
                try:
                    fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(fill, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False  # in use by a reader, or being filled
                if not cache_fs.same(root, name, folder):
                    return False
                os.rename(name, evicting, src_dir_fd=root.fd, dst_dir_fd=root.fd)
            finally:
                os.close(fill)
        finally:
            os.close(use)
    except (OSError, StorageError) as e:
        _LOG.warning("shard cache: cannot evict %s: %s", folder.path, getattr(e, "strerror", None) or e)
        return False
    finally:
        folder.close()
    try:
        cache_fs.remove_tree(root, evicting, last=MARKER)
    except (OSError, StorageError) as e:
        _LOG.warning("shard cache: %s was evicted but not wholly removed (%s); the next eviction removes it",
                     root.join(evicting), e)
    return True


def _free_bytes(root: Dir, folders: list[_Folder]) -> int:
    """The disk's free space, less what fills under way have reserved and not yet written."""
    return shutil.disk_usage(root.fd).free - sum(f.counted - f.on_disk for f in folders)


@contextlib.contextmanager
def room(root: Dir, folder: Dir, needed: int, max_bytes: int | None, origin: str, split: str) -> Iterator[None]:
    """Makes room for ``needed`` more bytes in ``folder`` and reserves them while the block fetches (called
    under ``folder``'s fill lock).

    With a bound, the least recently used folders of the cache that no process uses or
    fills are evicted until every folder of the cache, those in use included, and the
    fetch fit under it (and on the disk). Without a bound nothing is evicted.

    Raises:
      StorageError: the split is larger than the bound; the folders in use alone leave
        too little of the bound; the disk has too little free space (without a bound,
        or once every folder not in use is evicted).
    """
    with locked(root, EVICT_LOCK, fcntl.LOCK_EX):
        _finish_evictions(root)
        everything = _cache_folders(root)
        own = cache_fs.tree_bytes(folder) + needed
        if max_bytes is not None and own > max_bytes:
            raise StorageError(f"split {split!r} of {origin} needs {own} bytes in the shard cache, more than its "
                               f"bound of {max_bytes} (cache_max_bytes or BEAM_PREP_CACHE_MAX_BYTES): raise the "
                               "bound, or read a smaller split")
        this = os.path.basename(folder.path)
        others = [f for f in everything if f.name != this]
        free = _free_bytes(root, others)
        if max_bytes is None:
            if free < needed:
                raise StorageError(
                    f"split {split!r} of {origin} needs {needed} bytes in the shard cache {root.path}, and its disk "
                    f"has {free} free; with no bound (cache_max_bytes or BEAM_PREP_CACHE_MAX_BYTES) nothing is "
                    "evicted: free disk space, set a bound, or point cache_dir (BEAM_PREP_CACHE) at a larger disk")
        else:
            total = own + sum(f.counted for f in others)
            kept = []
            for candidate in others:
                if total <= max_bytes and free >= needed:
                    kept.append(candidate)
                elif root.join(candidate.name) not in _PINNED and _evict(root, candidate.name):
                    _LOG.info("shard cache: evicted %s (least recently used) to make room for %s",
                              root.join(candidate.name), origin)
                    total -= candidate.counted
                    free += candidate.on_disk
                else:
                    kept.append(candidate)
            if total > max_bytes:
                in_use = sum(f.counted for f in kept)
                raise StorageError(
                    f"split {split!r} of {origin} needs {own} bytes in the shard cache {root.path}, and the folders "
                    f"being read or filled there hold {in_use}: together more than its bound of "
                    f"{max_bytes} (cache_max_bytes or BEAM_PREP_CACHE_MAX_BYTES); raise the bound, or read it "
                    "when those processes have ended")
            if free < needed:
                raise StorageError(
                    f"split {split!r} of {origin} needs {needed} bytes in the shard cache {root.path}, and its disk "
                    f"has {free} free once every folder no process uses is evicted: free disk space, or point "
                    "cache_dir (BEAM_PREP_CACHE) at a larger disk")
        cache_fs.write_new(folder, RESERVED, str(own).encode("ascii"))
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(RESERVED, dir_fd=folder.fd)  # what the fill wrote is on disk now: counted as it is
