"""What a file is, cheaply: how a publication tells the file it moved from one put there by hand.

A file's identity survives the moves a publication makes: on local disk (a move is a rename) its size and
inode, read with ``lstat``, and, where those differ but the size does not (a copy with the same bytes), its
sha256; on gs:// (a move is a server-side copy) its size and CRC32C, from one listing. See
docs/design/claim.md, "Publishing".
"""
from __future__ import annotations

import hashlib
import os
import stat
from typing import NamedTuple

from apache_beam.io.filesystems import FileSystems

from beam_prep.io.storage import is_local, join, storage_error

__all__ = ["NOT_A_FILE", "File", "Listing", "identities", "sha256_of"]

# What stands at a name that is a folder, a link or a device: never a file of a dataset.
NOT_A_FILE = "not a file"
_CHUNK = 1 << 20


class File(NamedTuple):
    """A file as a publication recorded it.

    Attributes:
      identity: ``size:inode`` on local disk, ``size:CRC32C`` on gs://, ``size:checksum`` elsewhere.
      sha256: its bytes' hash, on local disk (None elsewhere: the CRC32C is of the bytes already).
    """

    identity: str
    sha256: str | None = None


def identities(folder: str, deep: bool = False) -> dict[str, str]:
    """Each file in ``folder`` (at any depth with ``deep``, by its path relative to it) -> its identity.

    Links are never followed: a link, or a folder where ``deep`` is False, is ``NOT_A_FILE``.
    A folder that does not exist holds nothing.

    Raises:
      StorageError: ``folder`` cannot be listed.
    """
    try:
        if is_local(folder):
            return _local(folder, "", deep)
        if folder.startswith("gs://"):
            return _gcs(folder, deep)
        prefix = folder.rstrip("/") + "/"
        found = FileSystems.match([join(folder, "**" if deep else "*")])[0].metadata_list
        return {m.path[len(prefix):]: f"{m.size_in_bytes}:{FileSystems.checksum(m.path)}" for m in found}
    except OSError as e:
        raise storage_error("list", folder, e) from e
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("list", folder, e) from e


def sha256_of(path: str) -> str:
    """The sha256 of the local file ``path``, opened without following a link.

    Raises:
      StorageError: it cannot be read.
    """
    digest = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    except OSError as e:
        raise storage_error("read", path, e) from e
    return digest.hexdigest()


class Listing:
    """A folder's files by identity (``identities``), each compared with a ``File`` recorded earlier: by its
    identity, and on local disk, where only the inode differs, by its bytes (hashed once, on that path only)."""

    def __init__(self, folder: str, deep: bool = False) -> None:
        self.folder = folder
        self.found = identities(folder, deep)
        self._sha256: dict[str, str] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.found

    def get(self, name: str) -> str | None:
        """The identity of what stands at ``name`` now (``NOT_A_FILE`` for a folder or a link), or None."""
        return self.found.get(name)

    def holds(self, name: str, file: File | None) -> bool:
        """Whether ``name`` is the very file ``file`` (a file with its bytes, on local disk).

        Raises:
          StorageError: it must be read, and cannot be.
        """
        now = self.found.get(name)
        if file is None or now is None or now == NOT_A_FILE:
            return False
        if now == file.identity:
            return True
        if file.sha256 is None or not is_local(self.folder) or now.split(":")[0] != file.identity.split(":")[0]:
            return False
        if name not in self._sha256:
            self._sha256[name] = sha256_of(join(self.folder, name))
        return self._sha256[name] == file.sha256


def _local(folder: str, prefix: str, deep: bool) -> dict[str, str]:
    found: dict[str, str] = {}
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return found
    for entry in entries:
        st = entry.stat(follow_symlinks=False)
        name = prefix + entry.name
        if stat.S_ISDIR(st.st_mode) and deep:
            found.update(_local(entry.path, name + "/", deep))
        elif stat.S_ISREG(st.st_mode):
            found[name] = f"{st.st_size}:{st.st_ino}"  # a rename keeps both; a remount or a touch keeps them too
        else:
            found[name] = NOT_A_FILE
    return found


def _gcs(folder: str, deep: bool) -> dict[str, str]:
    """One listing (paged): GCS sends each object's size and CRC32C with its name."""
    from apache_beam.io.gcp.gcsio import GcsIO, parse_gcs_path

    bucket, prefix = parse_gcs_path(folder.rstrip("/") + "/", object_optional=True)
    client = GcsIO().client
    blobs = client.list_blobs(client.bucket(bucket), prefix=prefix, delimiter=None if deep else "/")
    return {blob.name[len(prefix):]: f"{blob.size}:{blob.crc32c}" for blob in blobs}
