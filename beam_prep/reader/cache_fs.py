"""The shard cache's file operations: below its root, every path opened relative to a folder's
descriptor without following links, and used only when it is the user's own (owned by the
effective uid, writable by no one else). ``docs/design/reader.md`` says why.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import hashlib
import math
import os
import stat
import sys
import time
from collections.abc import Iterator

from beam_prep.errors import StorageError
from beam_prep.model.names import NAME_MAX

LOCK_TIMEOUT_ENV = "BEAM_PREP_CACHE_LOCK_TIMEOUT"
LOCK_TIMEOUT_S = 3600.0  # a fill of a large split may hold its folder's lock this long
PRIVATE = "give a private cache_dir (BEAM_PREP_CACHE): a folder of yours that no one else can write"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20
_POLL_S = (0.01, 0.5)  # a lock held by another is tried again this often: first, then at most
# Filesystems whose flock is no lock between the processes that share the cache: NFS emulates it with POSIX
# locks (a process's own never conflict, and closing any descriptor of the file drops them), the others keep
# it to one client. (statfs f_type, linux/magic.h)
UNRELIABLE_FLOCK = {0x6969: "NFS", 0xFF534D42: "CIFS", 0xFE534D42: "SMB2", 0x517B: "SMB",
                    0x01021997: "9P", 0x5346414F: "AFS"}


@dataclasses.dataclass(frozen=True)
class Dir:
    """A folder of the cache, open: its descriptor, and its path for messages (and for readers)."""

    fd: int
    path: str

    def join(self, name: str) -> str:
        return os.path.join(self.path, name)

    def close(self) -> None:
        os.close(self.fd)


def check_own(st: os.stat_result, path: str, what: str) -> None:
    """Refuses what another user owns, or others can write: the cache neither reads nor writes it.

    Raises:
      StorageError: one line naming ``path`` and why.
    """
    euid = os.geteuid()
    if st.st_uid != euid:
        why = f"belongs to uid {st.st_uid}, not to this user (uid {euid})"
    elif st.st_mode & 0o022:
        why = f"can be written by others (mode {stat.S_IMODE(st.st_mode):o})"
    else:
        return
    raise StorageError(f"the shard cache's {what} {path} {why}: the cache neither reads nor writes it; {PRIVATE}")


def _not_a_folder(path: str) -> StorageError:
    return StorageError(f"the shard cache's folder {path} is a link or a file, not a folder the cache made: "
                        "nothing is written through it; remove it, or give another cache_dir")


def open_dir(parent: Dir, name: str, *, create: bool = False) -> Dir:
    """``parent``'s folder ``name`` (made 0700 if ``create`` and absent), opened without following a link.

    Raises:
      FileNotFoundError: no such folder (and not ``create``, or removed meanwhile).
      StorageError: a link or a file there; a folder of another user, or that others can write.
    """
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent.fd)
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent.fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _not_a_folder(parent.join(name)) from None
        raise
    folder = Dir(fd, parent.join(name))
    try:
        check_own(os.fstat(fd), folder.path, "folder")
    except StorageError:
        folder.close()
        raise
    return folder


def open_file(folder: Dir, name: str, flags: int, *, create: bool = False) -> int:
    """A descriptor of ``folder``'s file ``name`` (made 0600 if ``create``), never through a link.

    Raises:
      FileNotFoundError: no such file, and not ``create``.
      StorageError: a link, a folder or another kind of file there; a file of another user, or that others
        can write.
    """
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_CREAT if create else 0)  # a FIFO: no wait
    path = folder.join(name)
    try:
        fd = os.open(name, flags, 0o600, dir_fd=folder.fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise StorageError(f"the shard cache's file {path} is a link or a folder, not a file the cache made: "
                               f"nothing is read or written through it; {PRIVATE}") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StorageError(f"the shard cache's file {path} is not a plain file: nothing is read or written "
                               f"through it; {PRIVATE}")
        check_own(st, path, "file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_small(folder: Dir, name: str, limit: int = 4096) -> bytes | None:
    """The first ``limit`` bytes of ``folder``'s file ``name``; None where there is none."""
    try:
        fd = open_file(folder, name, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with contextlib.closing(os.fdopen(fd, "rb")) as f:
        return f.read(limit)


def sha256_of(fd: int) -> str:
    """The sha256 of the file open at ``fd``, read from its start."""
    digest = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, _CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data`` written at ``fd``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[:_CHUNK]):]


def fitting(name: str, suffix: str) -> str:
    """``name`` + ``suffix``, where that is no longer than a file name may be (``NAME_MAX`` bytes); else
    ``.<name's sha256>`` + ``suffix`` (a dataset's names never start with ``.``: never one of theirs)."""
    if len(name.encode()) + len(suffix.encode()) <= NAME_MAX:
        return name + suffix
    return f".{hashlib.sha256(name.encode()).hexdigest()}{suffix}"


def write_new(folder: Dir, name: str, data: bytes) -> os.stat_result:
    """``data`` at ``folder``'s ``name``, whole or not at all: written to a file of its own made beside it
    (``<name>.partial-<pid>``, ``fitting``; created exclusively: never through a link someone placed),
    flushed, renamed over ``name``. Returns the file's status once renamed.

    Raises:
      StorageError: it cannot be written, naming it.
    """
    partial = fitting(name, f".partial-{os.getpid()}")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=folder.fd)
    except OSError as e:
        raise StorageError(f"cannot write {folder.join(name)} into the shard cache: {e.strerror or e}") from e
    try:
        write_all(fd, data)
        os.fsync(fd)
        os.replace(partial, name, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
        return os.fstat(fd)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(partial, dir_fd=folder.fd)
        raise StorageError(f"cannot write {folder.join(name)} into the shard cache: {e.strerror or e}") from e
    finally:
        os.close(fd)


def touch(folder: Dir, name: str) -> None:
    """``folder``'s file ``name``, made if absent, with its time now."""
    fd = open_file(folder, name, os.O_WRONLY | os.O_APPEND, create=True)
    try:
        os.utime(fd)
    finally:
        os.close(fd)


def same(parent: Dir, name: str, folder: Dir) -> bool:
    """Whether ``parent``'s entry ``name`` is still the folder open as ``folder``."""
    try:
        return os.path.samestat(os.stat(name, dir_fd=parent.fd, follow_symlinks=False), os.fstat(folder.fd))
    except FileNotFoundError:
        return False


def entries(folder: Dir) -> list[str]:
    return os.listdir(folder.fd)


def tree_bytes(folder: Dir) -> int:
    """The bytes of the files under ``folder``, its own folders included (as far as they are the user's)."""
    total = 0
    for name in entries(folder):
        with contextlib.suppress(OSError):
            st = os.stat(name, dir_fd=folder.fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                with contextlib.suppress(StorageError, OSError), _closing(open_dir(folder, name)) as inner:
                    total += tree_bytes(inner)
            else:
                total += st.st_size
    return total


def remove_tree(parent: Dir, name: str, *, last: str | None = None) -> None:
    """Removes ``parent``'s folder ``name`` and what it holds, through descriptors (each folder checked to be
    the user's before anything in it is removed), its file ``last`` last.

    Raises:
      OSError, StorageError: what could not be removed (what was, stays removed).
    """
    with _closing(open_dir(parent, name)) as folder:
        for entry in entries(folder):
            if entry == last:
                continue
            if stat.S_ISDIR(os.stat(entry, dir_fd=folder.fd, follow_symlinks=False).st_mode):
                remove_tree(folder, entry)
            else:
                os.unlink(entry, dir_fd=folder.fd)
        if last is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(last, dir_fd=folder.fd)
    os.rmdir(name, dir_fd=parent.fd)


@contextlib.contextmanager
def _closing(folder: Dir) -> Iterator[Dir]:
    try:
        yield folder
    finally:
        folder.close()


def lock_timeout() -> float:
    """How long a lock another process holds is waited for: ``$BEAM_PREP_CACHE_LOCK_TIMEOUT`` seconds, else
    an hour.

    Raises:
      StorageError: the variable is not a finite number of seconds, 0 or more.
    """
    text = os.environ.get(LOCK_TIMEOUT_ENV)
    if not text:
        return LOCK_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds < math.inf:
        raise StorageError(f"{LOCK_TIMEOUT_ENV} must be a number of seconds, 0 or more, not {text!r}")
    return seconds


def lock(fd: int, how: int, path: str) -> None:
    """``flock``s ``fd`` (``LOCK_SH`` or ``LOCK_EX``), waiting at most ``lock_timeout()`` for another holder.

    Raises:
      StorageError: still held by another once the bound has passed, naming the lock and its holder.
    """
    timeout = lock_timeout()
    deadline = time.monotonic() + timeout
    pause = _POLL_S[0]
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        except OSError as e:
            raise StorageError(f"cannot lock the shard cache's {path}: {e.strerror or e}; point cache_dir "
                               "(BEAM_PREP_CACHE) at a local disk") from e
        if time.monotonic() >= deadline:
            raise StorageError(
                f"the shard cache's lock {path} is held by {_holder(fd)}, still after {timeout:g} s "
                f"({LOCK_TIMEOUT_ENV}): another process fills or evicts that folder; let it end, stop it if it "
                "hangs, or raise the bound")
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, _POLL_S[1])


def _holder(fd: int) -> str:
    """Which process holds a lock on the file open at ``fd``, as ``/proc/locks`` tells (Linux)."""
    st = os.fstat(fd)
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with contextlib.suppress(OSError), open("/proc/locks", encoding="ascii", errors="replace") as f:
        for line in f:
            fields = line.split()
            if "->" not in fields and len(fields) > 5 and fields[5] == device:
                return f"process {fields[4]}"
    return "another process"


def filesystem_type(fd: int) -> int | None:
    """The Linux ``statfs`` ``f_type`` of the filesystem holding ``fd``; None where it cannot be had."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fstatfs = ctypes.CDLL(None, use_errno=True).fstatfs
    except (OSError, AttributeError):
        return None
    buffer = ctypes.create_string_buffer(512)  # struct statfs, f_type first
    if fstatfs(fd, buffer) != 0:
        return None
    return ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF


def check_locks_work(folder: Dir) -> None:
    """Refuses a folder on a filesystem whose ``flock`` does not lock between processes (NFS and the like).

    Raises:
      StorageError: naming the folder and the filesystem.
    """
    kind = UNRELIABLE_FLOCK.get(filesystem_type(folder.fd))
    if kind is not None:
        raise StorageError(
            f"the shard cache's folder {folder.path} is on {kind}, whose flock does not lock between processes "
            "(the cache's locks keep a folder in use from being evicted): point cache_dir (BEAM_PREP_CACHE) at a "
            "local disk")
