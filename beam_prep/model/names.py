"""The one rule for names and paths read from a dataset's own files.

A manifest is data: it may come from a bucket someone else controls. A shard
name such as ``../../victim/evil.txt`` or ``/etc/passwd``, joined to the dataset
folder or to the shard cache's, would reach outside it: the readers would open
it and the cache would write there. So every name a reader or a tool takes from
a dataset's files is checked here, before anything is read or written, and
anything but a plain file name in the folder is refused with one line naming
the file, the field and the value.

No Beam and no TensorFlow here: the readers without TensorFlow use it too.
"""
from __future__ import annotations

import os
import posixpath
import re
import unicodedata
from typing import Any

from beam_prep.errors import UnsafeName
from beam_prep.io.storage import is_local

__all__ = ["check_file_name", "path_under"]

_DRIVE = re.compile(r"[A-Za-z]:")  # a Windows drive: C:x is a path on drive C


def _problem(name: str) -> str | None:
    """Why ``name`` is not a plain file name, or None. Checked as written and in Unicode's
    compatibility form (NFKC), so that ``．．／`` (fullwidth) cannot stand for ``../``
    wherever names are normalised."""
    if not name:
        return "is empty"
    if any(unicodedata.category(c) == "Cc" for c in name):
        return "holds a control character (NUL, a line break...)"
    for form in dict.fromkeys((name, unicodedata.normalize("NFKC", name))):
        parts = form.replace("\\", "/").split("/")
        if form.startswith(("/", "\\")) or _DRIVE.match(form):
            return "is an absolute path"
        if ".." in parts:
            return "climbs out of the folder with '..'"
        if form == ".":
            return "names the folder itself"
        if len(parts) > 1 or ":" in form:
            return "holds a path separator (a file in another folder)"
    return None


def check_file_name(name: Any, field: str, where: str | None = None) -> str:
    """``name``, once checked to be a plain file name: the name of a file directly in the folder.

    Args:
      name: the value read (a shard name from ``manifest.json``).
      field: where in its file (``splits.train.shards[0]``), for the message.
      where: the file it was read from, for the message; None where the caller adds it.

    Returns:
      ``name``, unchanged.

    Raises:
      UnsafeName: not a string, empty, with a control character, ``.`` or ``..``, or with a
        separator or drive (an absolute path, ``../x``, ``a/b``, ``C:x``), as written or once
        Unicode-normalised.
    """
    why = "is not a string" if not isinstance(name, str) else _problem(name)
    if why is not None:
        prefix = f"{where}: " if where is not None else ""
        raise UnsafeName(f"{prefix}{field} is {name!r}, which {why}: a dataset names only files in its own "
                         "folder, by their plain names")
    return name


def path_under(root: str, path: Any, where: str, field: str) -> str:
    """``path`` (absolute, or relative to ``root``) once checked to lie under ``root``, local or ``gs://``.

    The check is on the path as written: no ``.`` or ``..`` component, no control
    character, and ``root`` as its prefix. Links inside ``root`` are the tree's own and
    are followed when the file is opened, as the run that listed it did.

    Args:
      root: the folder the path must lie under (a run's ``--input``).
      path: the value read.
      where: the file it was read from, for the message.
      field: where in that file, for the message.

    Returns:
      The full path.

    Raises:
      UnsafeName: ``root`` is empty, or ``path`` is not a string or not under ``root``.
    """
    if not root:
        raise UnsafeName(f"{where}: {field} is {path!r}, and the run recorded no input folder that it should lie "
                         "under (written by WriteImageDataset without root): nothing from it is opened")
    if not isinstance(path, str) or not path or any(unicodedata.category(c) == "Cc" for c in path):
        raise UnsafeName(f"{where}: {field} is {path!r}, not a path under {root}: only files under it are opened")
    local = is_local(root)
    full = os.path.join(root, path) if local else (path if "://" in path else posixpath.join(root, path))
    parts = full.replace("\\", "/").split("/")
    base = root.rstrip("/\\") + ("/" if not local else os.sep)
    if (any(p in (".", "..") for p in parts[1:]) or not full.startswith(base)
            or (local and os.path.normpath(full) != full.rstrip(os.sep))):
        raise UnsafeName(f"{where}: {field} is {path!r}, not a path under {root} (it is absolute elsewhere, or "
                         "holds . or ..): only files under it are opened")
    return full
