"""The way to the shard cache's root: walked from ``/`` one folder at a time, each opened relative to the
last without following links, checked as it is used, made where missing. ``docs/design/reader.md`` (the
``gs://`` cache) says why.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import grp
import os
import pwd
import stat
from collections.abc import Callable
from typing import TypeVar

from beam_prep.errors import StorageError
from beam_prep.reader import cache_fs
from beam_prep.reader.cache_fs import PRIVATE, Dir

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINKS = 40  # links followed on the way, as the kernel's own limit (ELOOP)
_OTHER_ERRORS = "give another cache_dir (BEAM_PREP_CACHE)"
_T = TypeVar("_T")


def replaceable(st: os.stat_result) -> str | None:
    """Why another user could rename what a folder of this status holds; None where no one could:
    it is the user's or root's, and others cannot write it (``writable_by_others``), or only with the
    sticky bit (as ``/tmp``)."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"belongs to uid {st.st_uid}"
    if writable_by_others(st) and not st.st_mode & stat.S_ISVTX:
        return f"can be written by others without the sticky bit (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def writable_by_others(st: os.stat_result) -> bool:
    """Whether a user other than this one may write what has this status: others' write bit, or the group's
    where the group is not the user's own private group (``is_private_group``: umask 002's ``~`` on RHEL)."""
    return bool(st.st_mode & 0o002 or (st.st_mode & 0o020 and not _private_group_of(os.geteuid(), st.st_gid)))


def is_private_group(gid: int, user: str, user_gid: int, members: list[str], primary_gids: list[int]) -> bool:
    """Whether the group ``gid`` is ``user``'s private group, which only they are in.

    Args:
      gid: the group in question (a folder's ``st_gid``).
      user: the user's name.
      user_gid: the user's primary gid (from the password database).
      members: the group's listed members (``grp.getgrgid(gid).gr_mem``).
      primary_gids: the primary gid of every other user in the password database.

    Returns:
      True where ``gid`` is the user's primary group, has no member but them, and is no other user's primary
      group.
    """
    return gid == user_gid and all(member == user for member in members) and gid not in primary_gids


@functools.lru_cache(maxsize=8)
def _private_group_of(euid: int, gid: int) -> bool:
    """``is_private_group`` for the user ``euid``, read from the password and group databases (False where
    either has no entry)."""
    try:
        user = pwd.getpwuid(euid)
        members = grp.getgrgid(gid).gr_mem
    except KeyError:
        return False
    others = [entry.pw_gid for entry in pwd.getpwall() if entry.pw_uid != euid]
    return is_private_group(gid, user.pw_name, user.pw_gid, list(members), others)


def open_path(path: str, *, create: bool = False) -> Dir:
    """The folder at the absolute ``path``, open, reached from ``/`` one name at a time (``O_NOFOLLOW``,
    relative to the folder before): each folder on the way checked (``fstat``) to be one no other user can
    rename anything out of (``replaceable``) before a name in it is used; a link followed only where it is
    the user's or root's, in a folder others cannot write; with ``create``, a missing folder made 0700
    there (the filesystem checked first: nothing is made on NFS). The folder itself is left to the caller
    to judge. Its ``path`` is the one walked, links resolved.

    Args:
      path: an absolute path.
      create: make the folders missing on the way, and the folder itself.

    Returns:
      The folder, open.

    Raises:
      StorageError: one line naming the folder or link and why: a folder on the way another user could
        replace, a link another user could have placed, a file or nothing where a folder should be, a name
        too long, a folder that cannot be searched; a filesystem whose ``flock`` does not lock.
    """
    path = os.path.abspath(path)
    remaining = path.split("/")
    walked = [_open_at(None, "/", path)]
    links = 0
    try:
        while remaining:
            name = remaining.pop(0)
            if name in ("", "."):
                continue
            if name == "..":
                if len(walked) > 1:
                    walked.pop().close()
                continue
            here = walked[-1]
            _check_on_the_way(here, path)
            target = _link_target(here, name, path, create)
            if target is None:
                walked.append(_open_at(here, name, path))
                continue
            links += 1
            if links > _MAX_LINKS:
                raise StorageError(f"the shard cache's folder {path} is behind more than {_MAX_LINKS} links (a loop?); "
                                   f"{_OTHER_ERRORS}")
            if target.startswith("/"):
                while len(walked) > 1:
                    walked.pop().close()
            remaining[:0] = target.split("/")
        return walked.pop()
    finally:
        for folder in walked:
            folder.close()


def same_folder(path: str, identity: tuple[int, int]) -> None:
    """Refuses ``path`` unless it is still the folder of ``identity`` (``st_dev``, ``st_ino``), reached as
    ``open_path`` reaches it: what a process that reopens the cache's files by their paths (a data loader's
    worker) checks first.

    Raises:
      StorageError: the folder was replaced, or the way to it is no longer safe; one line naming it.
    """
    folder = open_path(path)
    try:
        st = os.fstat(folder.fd)
    finally:
        folder.close()
    if (st.st_dev, st.st_ino) != identity:
        raise StorageError(f"the shard cache's folder {path} is no longer the folder the cache filled (it was "
                           f"replaced since): nothing is read from it; read the dataset again, and {PRIVATE}")


def _check_on_the_way(folder: Dir, path: str) -> None:
    """Refuses ``folder``, on the way to ``path``, if another user could rename what it holds."""
    why = replaceable(os.fstat(folder.fd))
    if why is not None:
        raise StorageError(f"the shard cache's folder {path} is inside {folder.path}, which {why}: another user "
                           f"could replace it; {PRIVATE}")


def _link_target(folder: Dir, name: str, path: str, create: bool) -> str | None:
    """What ``folder``'s entry ``name`` links to; None where it is no link (a folder made 0700 if missing and
    ``create``: first checking that the filesystem locks)."""
    try:
        st = os.stat(name, dir_fd=folder.fd, follow_symlinks=False)
    except FileNotFoundError:
        if not create:
            raise _refusal(folder.join(name), path, "does not exist") from None
        cache_fs.check_locks_work(folder)
        with contextlib.suppress(FileExistsError):
            _os_call(lambda: os.mkdir(name, 0o700, dir_fd=folder.fd), folder.join(name), path)
        return None
    except OSError as e:
        raise _refusal(folder.join(name), path, e.strerror or str(e)) from e
    if not stat.S_ISLNK(st.st_mode):
        return None
    link = folder.join(name)
    if st.st_uid not in (os.geteuid(), 0):
        raise _not_followed(path, link, f"of uid {st.st_uid}")
    if writable_by_others(os.fstat(folder.fd)):
        raise _not_followed(path, link, f"in {folder.path}, which others can write")
    return _os_call(lambda: os.readlink(name, dir_fd=folder.fd), folder.join(name), path)


def _not_followed(path: str, link: str, which: str) -> StorageError:
    through = "" if link == path else f"reached through {link}, "
    return StorageError(f"the shard cache's folder {path} is {through}a link {which}: another user could have placed "
                        f"it, and the cache does not follow it; {PRIVATE}")


def _open_at(parent: Dir | None, name: str, path: str) -> Dir:
    """``parent``'s folder ``name`` (``/`` itself without a parent), opened without following a link."""
    shown = name if parent is None else parent.join(name)
    fd = _os_call(lambda: os.open(name, _DIR_FLAGS, dir_fd=None if parent is None else parent.fd), shown, path)
    return Dir(fd, shown)


def _os_call(call: Callable[[], _T], shown: str, path: str) -> _T:
    """``call()``, its ``OSError`` a one-line ``StorageError`` naming ``shown`` (on the way to ``path``)."""
    try:
        return call()
    except FileExistsError:
        raise
    except OSError as e:
        why = "was replaced by a link as it was opened" if e.errno == errno.ELOOP else e.strerror or str(e)
        raise _refusal(shown, path, why) from e


def _refusal(shown: str, path: str, why: str) -> StorageError:
    on_the_way = "" if shown == path else f" (on the way to {path})"
    return StorageError(f"cannot open the shard cache's folder {shown}{on_the_way}: {why}; {_OTHER_ERRORS}")
