"""A dataset folder's ``manifest.json``, read without TensorFlow: local files with ``open``, gs:// with
our own GCS client.

``load_info`` and every reader read it here, so a JAX or PyTorch host pays
for neither TensorFlow's import (seconds, and its log lines) nor its GCS layer, and
every reader words a wrong path the same way: a folder that does not exist, a file
given for the folder, a folder without a manifest.
"""
from __future__ import annotations

import os

from beam_prep.errors import DatasetError, StorageError
from beam_prep.io.storage import bucket_of, is_local, join
from beam_prep.model.dataset import MANIFEST, DatasetInfo, parse_manifest

__all__ = ["normalise_root", "read_manifest_bytes", "read_manifest_info"]

_NOT_FINISHED = ("not a beam-prep dataset, or its pipeline has not finished "
                 "(the manifest is written last, after every shard)")


def normalise_root(path: str | os.PathLike) -> str:
    """A dataset folder as readers name it: absolute on local disk, without a trailing slash on gs://."""
    text = os.fspath(path)
    return os.path.abspath(text) if is_local(text) else (text.rstrip("/") or text)


def read_manifest_bytes(root: str) -> tuple[bytes, str]:
    """The bytes of ``root/manifest.json`` and its path.

    Raises:
      DatasetError: the folder does not exist, is a file, or holds no manifest.
      StorageError: it cannot be read (permissions, a missing bucket, the network).
    """
    path = join(root, MANIFEST)
    if is_local(root):
        return _read_local(root, path), path
    if not root.startswith("gs://"):
        raise StorageError(f"cannot read {path}: only local folders and gs:// are read without TensorFlow")
    from beam_prep.io.gcs import GcsClient

    client = GcsClient(connections=1)
    try:
        return client.read(path), path
    except StorageError as e:
        if getattr(e, "code", None) != 404:
            raise StorageError(f"cannot read {path}: {_reason(e, path)}") from e
        bucket = bucket_of(root)
        if bucket and not client.bucket_exists(bucket):
            raise StorageError(f"cannot read {path}: bucket {bucket} does not exist") from e
        raise DatasetError(f"no {MANIFEST} at {path}: {_NOT_FINISHED}") from e


def read_manifest_info(root: str) -> tuple[DatasetInfo, dict]:
    """``root``'s manifest, checked (``DatasetInfo``), and the whole parsed manifest. Raises as
    ``read_manifest_bytes``, and DatasetError for a malformed manifest."""
    text, path = read_manifest_bytes(root)
    manifest = parse_manifest(text, path)
    return DatasetInfo.from_json(manifest, root, path), manifest


def _read_local(root: str, path: str) -> bytes:
    if not os.path.exists(root):
        parent = os.path.dirname(root.rstrip(os.sep)) or "."
        where = "" if os.path.isdir(parent) else f" (nor does its parent {parent})"
        raise DatasetError(f"dataset folder {root} does not exist{where}: check the path")
    if not os.path.isdir(root):
        raise DatasetError(f"{root} is a file, not a dataset folder: pass the folder that holds it and "
                           f"{MANIFEST} ({os.path.dirname(root) or '.'})")
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError as e:
        raise DatasetError(f"no {MANIFEST} at {path}: {_NOT_FINISHED}") from e
    except PermissionError as e:
        raise StorageError(f"cannot read {path}: permission denied; make it readable to this user") from e
    except OSError as e:
        raise StorageError(f"cannot read {path}: {e.strerror or e}") from e


def _reason(error: BaseException, path: str) -> str:
    """A GCS failure's reason, without the client's own ``cannot read <path>:`` prefix."""
    text = str(error)
    prefix = f"cannot read {path}: "
    return text.removeprefix(prefix)
