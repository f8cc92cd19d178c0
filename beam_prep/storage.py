"""Storage failures, said plainly: which path, and whether it is missing or forbidden.

Beam's filesystems wrap the client's exceptions (``BeamIOError`` holding a dict of
``google.api_core`` errors for GCS), so the useful fact is a few levels down.
"""
from __future__ import annotations

from typing import Iterator

from beam_prep.errors import StorageError


def is_local(path: str) -> bool:
    """A path on this machine's disk, as opposed to a ``scheme://`` URL (gs://)."""
    return "://" not in path


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


def bucket_of(path: str) -> str | None:
    """``gs://bucket`` of a GCS path, else None."""
    return "gs://" + path[len("gs://"):].split("/", 1)[0] if path.startswith("gs://") else None


def storage_error(action: str, path: str, error: BaseException) -> StorageError:
    """A StorageError that names ``path`` and says what to fix."""
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
