"""What names mean in an image tree: split folders, junk left by operating systems, label
names labels.txt can hold (and ``--labels_file``'s), and each reason a file is skipped.
"""
from __future__ import annotations

import collections

from apache_beam.io.filesystems import FileSystems

from beam_prep.errors import OptionsError
from beam_prep.write.shared.entry import printable

__all__ = ["JUNK_NAMES", "SKIP_DEPTH", "SKIP_HIDDEN", "SKIP_NOT_IMAGE", "SKIP_NO_ROW", "SPLIT_NAMES",
           "check_label_name", "is_junk", "read_labels_file", "split_rank"]

SPLIT_NAMES = ("train", "validation", "val", "test")
# Folders and files that operating systems, archivers and notebooks leave in a tree;
# skipped wherever they are, as are names starting with a dot.
JUNK_NAMES = frozenset({"__MACOSX", "@eaDir", "Thumbs.db", "desktop.ini", "$RECYCLE.BIN",
                        "System Volume Information", "lost+found"})

# Why a file was skipped: the manifest counts each reason (walk.py has the walk's own two).
SKIP_HIDDEN = "hidden or system file"
SKIP_NOT_IMAGE = "not an image file"
SKIP_DEPTH = "image outside the label folders"
SKIP_NO_ROW = "image no --metadata row names"


def is_junk(part: str) -> bool:
    """Whether a file or folder name is one the tree's owner never made (``JUNK_NAMES``, or hidden)."""
    return part.startswith(".") or part in JUNK_NAMES


def split_rank(name: str) -> tuple[int, str]:
    """Orders split names as ``SPLIT_NAMES`` does (train first), any other after them by name."""
    return (SPLIT_NAMES.index(name) if name in SPLIT_NAMES else len(SPLIT_NAMES), name)


def check_label_name(name: str, where: str, what: str = "label folder") -> None:
    """Refuses a label name that labels.txt (one label a line, the line number its id) cannot hold.

    ``what`` and ``where`` name it in the message: a label folder and its path, or
    (``WriteImageDataset``) a label given in ``labels`` and the label itself.

    Raises:
      OptionsError: naming the label and what to change.
    """
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise OptionsError(f"{what} {printable(where)} has a name that is not UTF-8: "
                           "labels.txt and the records hold label names as UTF-8; rename it") from None
    if name.splitlines() != [name] or name.strip() != name:
        raise OptionsError(f"{what} {where!r} has a line break or edge spaces in its name: "
                           "labels.txt holds one label a line, its line number the id; rename it")


def read_labels_file(path: str) -> list[str]:
    """One label a line; the line number is the id."""
    try:
        with FileSystems.open(path) as f:
            text = f.read().decode("utf-8")
    except Exception as e:
        raise OptionsError(f"cannot read --labels_file {path}: {e}") from e
    names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        raise OptionsError(f"--labels_file {path} lists no labels")
    duplicates = [n for n, c in collections.Counter(names).items() if c > 1]
    if duplicates:
        raise OptionsError(f"--labels_file {path} lists {duplicates[0]!r} more than once")
    return names
