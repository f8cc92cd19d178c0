"""What a file is, cheaply: how a publication tells the file it moved from one put there by hand.

A file's identity survives the moves a publication makes and nothing else: on local disk (a move is
a rename) its device, inode, size and modification time, read with ``lstat``; on gs:// (a move is a
server-side copy) its size and CRC32C, from one listing. See docs/design/claim.md, "Publishing".
"""
from __future__ import annotations

import os
import stat

from apache_beam.io.filesystems import FileSystems

from beam_prep.io.storage import is_local, join, storage_error

__all__ = ["NOT_A_FILE", "identities"]

# What stands at a name that is a folder, a link or a device: never a file of a dataset.
NOT_A_FILE = "not a file"


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
            found[name] = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
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
