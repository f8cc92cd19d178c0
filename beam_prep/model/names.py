"""The one rule for names read from a dataset's own files: those beam-prep writes, and no others.

A manifest is data: it may come from a bucket someone else controls. Its names
become paths (joined to the dataset folder or the shard cache's), URLs, and words in
commands (WebDataset's ``pipe:``), so each is checked here before anything is read
or written: a plain file name of ASCII letters, digits, ``.``, ``_`` and ``-``, not
starting with ``.`` or ``-``, at most ``NAME_MAX`` bytes; anything else is refused
with one line naming the file, the field and the value. The writer's split names
obey the same rule (a split names its shard files). See docs/reference/manifest.md.

No Beam and no TensorFlow here: the readers without TensorFlow use it too.
"""
from __future__ import annotations

import os
import posixpath
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

from beam_prep.errors import UnsafeName
from beam_prep.io.storage import is_local

__all__ = ["NAME_MAX", "check_distinct", "check_file_name", "name_problem", "path_under"]

# The most bytes a name may have: a file name's limit on ext4, XFS, APFS and most others.
NAME_MAX = 255
_DRIVE = re.compile(r"[A-Za-z]:")  # a Windows drive: C:x is a path on drive C
_OTHER = re.compile(r"[^A-Za-z0-9_.-]")  # a character outside the allow-list
_RULE = ": a dataset names only files in its own folder, by their plain names"
_SHOWN = 300  # characters of a value a message shows


def _structure(name: str) -> str | None:
    """Why ``name`` reaches outside its folder, or None. Checked as written and in Unicode's
    compatibility form (NFKC), so that ``．．／`` (fullwidth) is said to be ``../``."""
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


def name_problem(name: str) -> str | None:
    """Why ``name`` is not a name beam-prep writes, or None: the allow-list.

    A name is at most ``NAME_MAX`` bytes of ASCII letters, digits, ``.``, ``_`` and ``-``, and
    starts with neither ``.`` (a hidden file, ``..``) nor ``-`` (an option, to a command).

    Args:
      name: the name.

    Returns:
      The reason, to follow "which" in a message (``holds ';', ...``), or None for a good name.
    """
    if not name:
        return "is empty"
    if any(unicodedata.category(c) == "Cc" for c in name):
        return "holds a control character (NUL, a line break...)"
    why = _structure(name)
    if why is not None:
        return why
    other = _OTHER.search(name)
    if other is not None:
        return f"holds {other[0]!r} (beam-prep writes names of ASCII letters, digits, '.', '_' and '-' only)"
    if name[0] in ".-":
        return (f"starts with {name[0]!r} (beam-prep's names start with a letter, a digit or '_': '.' makes a "
                "hidden file, '-' an option to a command)")
    if len(name) > NAME_MAX:
        return f"is {len(name)} bytes long, more than a file name may be ({NAME_MAX})"
    return None


def _shown(name: Any) -> str:
    """``repr(name)``, cut short past ``_SHOWN`` characters: a message stays a line a person reads."""
    if isinstance(name, str) and len(name) > _SHOWN:
        return f"{name[:_SHOWN]!r}... ({len(name)} characters)"
    return repr(name)


def _refuse(name: Any, field: str, why: str, where: str | None) -> UnsafeName:
    prefix = f"{where}: " if where is not None else ""
    return UnsafeName(f"{prefix}{field} is {_shown(name)}, which {why}{_RULE}")


def check_file_name(name: Any, field: str, where: str | None = None) -> str:
    """``name``, once checked to be a name beam-prep writes: a plain file name in the folder (``name_problem``).

    Args:
      name: the value read (a shard name from ``manifest.json``).
      field: where in its file (``splits.train.shards[0]``), for the message.
      where: the file it was read from, for the message; None where the caller adds it.

    Returns:
      ``name``, unchanged.

    Raises:
      UnsafeName: not a string, empty, with a control character, ``.`` or ``..``, a separator or
        drive (an absolute path, ``../x``, ``a/b``, ``C:x``; as written or once Unicode-normalised),
        a character outside the allow-list (a space, ``;``, ``$``, a fullwidth letter...), a first
        ``.`` or ``-``, or more than ``NAME_MAX`` bytes.
    """
    why = "is not a string" if not isinstance(name, str) else name_problem(name)
    if why is not None:
        raise _refuse(name, field, why, where)
    return name


def check_distinct(names: Sequence[str], field: str, seen: dict[str, tuple[str, str]],
                   where: str | None = None) -> None:
    """Refuses a name (checked by ``check_file_name``) that names a file already named, in any case.

    Compared in lower case as well: on a case-insensitive file system (macOS's, Windows')
    ``Train.tar`` is ``train.tar``, and two fills of one file at once, or a shard written over the
    manifest, would follow.

    Args:
      names: the names of ``field``, in order.
      field: their field (``splits.train.shards``); a name's is ``field[i]``.
      seen: lower-case name -> (what it is, the name): the files named so far (``the manifest``,
        ``splits.train.shards[0]``); ``names`` are added to it.
      where: the file they were read from, for the message; None where the caller adds it.

    Raises:
      UnsafeName: a name of ``seen``, or twice in ``names``: naming the file, the field and the value.
    """
    for i, name in enumerate(names):
        taken, other = seen.setdefault(name.lower(), (f"{field}[{i}]", name))
        if taken == f"{field}[{i}]":
            continue
        why = (f"names the same file as {taken}" if other == name else
               f"names the same file as {taken} ({other!r}) where case is not told apart (macOS, Windows)")
        raise _refuse(name, f"{field}[{i}]", why, where)


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
