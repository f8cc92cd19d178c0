"""The columns with a meaning, and their values checked: which column holds the image, its
path made canonical and kept under ``--input``, label names as labels.txt can hold them.
"""
from __future__ import annotations

import json
import posixpath
import re
from typing import Any

from beam_prep.errors import OptionsError

__all__ = ["FILE_NAME", "LABEL", "LABELS", "RESERVED", "SPLIT", "canonical_file_name", "image_column", "label_name",
           "where"]

FILE_NAME = "file_name"
LABEL = "label"
LABELS = "labels"
SPLIT = "split"
RESERVED = (FILE_NAME, LABEL, LABELS, SPLIT)


def where(path: str, line: int) -> str:
    """How a message names a row: its table and line."""
    return f"--metadata {path} line {line}"


_PLAIN_PATH = re.compile(r"[^/\s.:\\][^:\\]*")  # no leading slash, dot or space: canonical unless it has "." parts


def image_column(header: list[str], here: str, split_folder: str | None) -> list[str]:
    """The header with its image column named ``file_name``: Hugging Face reads a lone
    ``*_file_name`` column (``image_file_name``) as the image too. One image a record: a
    second image column, or a list of them, is refused.

    Raises:
      OptionsError: no image column, or more than one.
    """
    images = [name for name in header
              if name in (FILE_NAME, "file_names") or name.endswith(("_" + FILE_NAME, "_file_names"))]
    if not images:
        under = f"its split folder {split_folder}" if split_folder else "--input"
        raise OptionsError(f"{here}: no {FILE_NAME} column (columns: {', '.join(header)}): "
                           f"add one with each image's path under {under}")
    if len(images) > 1 or images[0].endswith("file_names"):
        raise OptionsError(f"{here}: image columns {', '.join(images)}: a record holds one image; keep one "
                           f"{FILE_NAME} column (and store other paths under a name not ending in _{FILE_NAME})")
    return [FILE_NAME if name == images[0] else name for name in header]


def canonical_file_name(value: Any, path: str, line: int, split_folder: str | None = None) -> str:
    """``file_name`` made canonical (``./a.jpg`` is ``a.jpg``, ``a\\b.jpg`` is ``a/b.jpg``, as Hugging
    Face reads it); refused where it leaves ``--input`` (or, in a split folder's table, that folder)."""
    if (isinstance(value, str) and _PLAIN_PATH.fullmatch(value) and "//" not in value and "/." not in value
            and not value.endswith(("/", " ", "\t"))):
        return value  # already canonical: the common case, checked cheaply
    under = f"its split folder {split_folder}" if split_folder else "--input"
    if not isinstance(value, str) or not value.strip():
        raise OptionsError(f"{where(path, line)}: {FILE_NAME} is empty: give the image's path under {under}")
    text = value.strip()
    if text.startswith(("/", "\\")) or "://" in text or re.match(r"[A-Za-z]:[\\/]", text):
        raise OptionsError(f"{where(path, line)}: {FILE_NAME} {text!r} is an absolute path: "
                           f"give the path under {under}")
    name = posixpath.normpath(text.replace("\\", "/"))
    if name == ".." or name.startswith("../"):
        raise OptionsError(f"{where(path, line)}: {FILE_NAME} {text!r} leaves {under}: give a path under {under}")
    if name == ".":
        raise OptionsError(f"{where(path, line)}: {FILE_NAME} {text!r} names {under} itself: "
                           "give an image's path")
    return name


def label_name(value: Any, path: str, line: int) -> str:
    """A label name as labels.txt can hold it: text (an integer is its digits), no line breaks."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise OptionsError(f"{where(path, line)}: a label must be a name, not {json.dumps(value)}")
    name = value.strip()
    if not name.isprintable() and name.splitlines() not in ([name], []):
        raise OptionsError(f"{where(path, line)}: label {name!r} has a line break: "
                           "labels.txt holds one label a line")
    return name
