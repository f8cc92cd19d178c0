"""Paths and small files on any filesystem, and storage failures said plainly.

Every module that names or writes a file on local disk or gs:// uses these, so
paths are joined one way and a failed read or write names its file one way.

Beam's filesystems wrap the client's exceptions (``BeamIOError`` holding a dict of
``google.api_core`` errors for GCS), so the useful fact is a few levels down.
"""
from __future__ import annotations

import errno
import hashlib
import io
import os
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from isal import igzip

from beam_prep.errors import BeamPrepError, StorageError

_LINES_A_BLOCK = 8192  # lines ``write_lines`` and ``write_gzip_lines`` write at a time
_GZIP_LEVEL = 1  # ISA-L's (0-3): on hash and stamp lines, about as small as zlib's level 9


def is_local(path: str) -> bool:
    """A path on this machine's disk, as opposed to a ``scheme://`` URL (gs://)."""
    return "://" not in path


def join(root: str, *parts: str) -> str:
    """``root/part/...`` with ``/`` on every filesystem (``os.path.join`` would be wrong for gs://)."""
    return "/".join([root.rstrip("/"), *parts])


def write_lines(path: str, lines: Iterable[str]) -> None:
    """Writes ``lines`` to ``path``, one a line, in UTF-8, streamed a block at a time (a report of
    millions of lines is never held whole).

    Raises:
      StorageError: naming ``path``, if it cannot be written; or any error of beam-prep's ``lines`` raised.
    """
    from apache_beam.io.filesystems import FileSystems

    try:
        with FileSystems.create(path, mime_type="text/plain") as f:
            block: list[str] = []
            for line in lines:
                block.append(f"{line}\n")
                if len(block) == _LINES_A_BLOCK:
                    f.write("".join(block).encode("utf-8"))
                    block = []
            f.write("".join(block).encode("utf-8"))
    except BeamPrepError:  # ``lines``'s own, said already
        raise
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("write", path, e) from e


def write_bytes(path: str, data: bytes, mime_type: str = "text/plain") -> None:
    """Writes ``data`` to ``path``, at once, on any filesystem.

    Raises:
      StorageError: naming ``path``, if it cannot be written.
    """
    # Imported here, not at the top: the reader and the dataset model use this module's
    # path helpers without importing Beam.
    from apache_beam.io.filesystems import FileSystems

    try:
        with FileSystems.create(path, mime_type=mime_type) as f:
            f.write(data)
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("write", path, e) from e


def write_gzip_lines(lines: Iterable[bytes], path: str) -> tuple[int, str]:
    """Writes ``lines``, one a line, gzip'd with no time or name in the header (the same lines give the
    same bytes on one machine), to ``path`` on any filesystem, streamed; returns how many, and the file's
    sha256. ISA-L's deflate, a block of lines a call: a tenth of the CPU of zlib's default level a line at
    a time, in about as few bytes (lines of paths and hashes).

    Raises:
      StorageError: naming ``path``, if it cannot be written.
    """
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    count, digest = 0, hashlib.sha256()
    try:
        with FileSystems.create(path, mime_type="application/gzip",
                                compression_type=CompressionTypes.UNCOMPRESSED) as out:
            hashing = _Hashing(out, digest)
            with igzip.IGzipFile(filename="", mode="wb", fileobj=hashing, mtime=0,
                                 compresslevel=_GZIP_LEVEL) as packed:
                block: list[bytes] = []
                for line in lines:
                    block.append(line)
                    count += 1
                    if len(block) == _LINES_A_BLOCK:
                        packed.write(b"\n".join(block) + b"\n")
                        block.clear()
                if block:
                    packed.write(b"\n".join(block) + b"\n")
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("write", path, e) from e
    return count, digest.hexdigest()


class _Hashing(io.RawIOBase):
    """A writable that hashes what goes through it to ``out``."""

    def __init__(self, out: BinaryIO, digest: Any) -> None:
        super().__init__()
        self._out, self._digest = out, digest

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        data = bytes(data)
        self._digest.update(data)
        self._out.write(data)
        return len(data)


def open_to_read(path: str) -> BinaryIO:
    """``path`` opened for reading its bytes as stored, on any filesystem.

    Beam would otherwise guess a compression from the name and inflate a ``.gz``
    file as it reads. Errors are the filesystem's own: each caller says what a
    failure means to it.
    """
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def read_bytes(path: str) -> bytes:
    """The whole of the file ``path``, as stored (``open_to_read``); errors are the filesystem's own."""
    with open_to_read(path) as f:
        return f.read()


def read_lines(path: str) -> list[str]:
    """The lines of the UTF-8 text file ``path``, read at once: ``write_lines``' twin.

    Raises:
      StorageError: naming ``path``, if it cannot be read.
    """
    try:
        return read_bytes(path).decode("utf-8").splitlines()
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("read", path, e) from e


def _causes(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    stack = [error]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        details = getattr(e, "exception_details", None)
        if isinstance(details, dict):
            stack.extend(v for v in details.values() if isinstance(v, BaseException))
        stack.extend(c for c in (e.__cause__, e.__context__) if c is not None)


def _code(error: BaseException) -> int | None:
    code = getattr(error, "code", None)
    return code if isinstance(code, int) else None


# What to do where a write found no room, by its errno.
_NO_ROOM = {
    errno.ENOSPC: "free space on that disk, or write elsewhere",
    errno.EDQUOT: "free some of this user's quota on that disk, or write elsewhere",
    errno.EFBIG: "larger than the file system or this process's limit (ulimit -f) allows; raise the limit, "
                 "or write elsewhere",
}


def _no_room(error: BaseException) -> tuple[int, str] | None:
    """``(errno, its text)`` where ``error`` or one of its causes says a write found no room (a full
    disk, a quota, a file size limit): an OSError, or a C++ library's RuntimeError or ValueError
    whose text holds the system's words for it (ArrayRecord's writer: ``write() failed: No space
    left on device; ...``); else None."""
    for e in _causes(error):
        if isinstance(e, OSError) and e.errno in _NO_ROOM:
            return e.errno, e.strerror
        if isinstance(e, (RuntimeError, ValueError)):
            said = next((code for code in _NO_ROOM if os.strerror(code) in str(e)), None)
            if said is not None:
                return said, os.strerror(said)
    return None


def bucket_of(path: str) -> str | None:
    """``gs://bucket`` of a GCS path, else None."""
    return "gs://" + path[len("gs://"):].split("/", 1)[0] if path.startswith("gs://") else None


def storage_error(action: str, path: str, error: BaseException, room: str | None = None) -> StorageError:
    """A StorageError that names ``path`` and says what to fix; ``room``: what to do where the write
    found no room, in place of the advice for a dataset's disk (free space, or write elsewhere)."""
    full = _no_room(error)
    if full is not None:
        code, text = full
        return StorageError(f"cannot {action} {path}: [Errno {code}] {text}; {room or _NO_ROOM[code]}")
    codes = {_code(e) for e in _causes(error)}
    names = {type(e).__name__ for e in _causes(error)}
    if is_local(path) and "PermissionError" in names:
        return StorageError(f"cannot {action} {path}: permission denied; make it readable to this user "
                            "(chmod/chown), or move it out of the tree")
    if 403 in codes or "Forbidden" in names or "PermissionError" in names:
        return StorageError(f"cannot {action} {path}: permission denied; grant the credentials in use "
                            f"access to {bucket_of(path) or path} (roles/storage.objectAdmin for output)")
    if path.startswith("gs://") and (404 in codes or "NotFound" in names):
        return StorageError(f"cannot {action} {path}: bucket {bucket_of(path)} does not exist")
    return StorageError(f"cannot {action} {path}: {error}")
