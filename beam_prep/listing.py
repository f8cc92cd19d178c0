"""Listing an image tree: which files, which label, which split, in which order.

Runs in the launching process, before the pipeline: the label map, the split
layout, the shard count and every fail-fast check need the whole listing:
folders listed concurrently on GCS, ``os.scandir`` on local disk. Every
decision here is a pure function of a file's path relative to the root, so
reruns and workers agree without coordination.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
import stat
from typing import Sequence

from apache_beam.io.filesystems import FileSystems

from beam_prep.errors import OptionsError
from beam_prep.gcs import GcsClient
from beam_prep.imaging import is_image_name
from beam_prep.storage import is_local, join, storage_error

_LOG = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "validation", "val", "test")
DEFAULT_SPLIT = "train"
VALIDATION_SPLIT = "validation"
UNKNOWN_LABEL = -1
# Folders and files that operating systems, archivers and notebooks leave in a tree;
# skipped wherever they are, as are names starting with a dot.
JUNK_NAMES = frozenset({"__MACOSX", "@eaDir", "Thumbs.db", "desktop.ini", "$RECYCLE.BIN",
                        "System Volume Information", "lost+found"})

# Why a file was skipped: the manifest counts each reason.
SKIP_HIDDEN = "hidden or system file"
SKIP_NOT_IMAGE = "not an image file"
SKIP_DEPTH = "image outside the label folders"
SKIP_SPECIAL = "not a regular file"
SKIP_SEEN_FOLDER = "link to a folder listed already"


def raw_name(text: str) -> bytes:
    """A path's bytes as the filesystem holds them.

    Python gives an undecodable byte of a local file name as a lone surrogate
    (PEP 383); encoding it back gives the original bytes, and valid UTF-8 names
    are unchanged.
    """
    return text.encode("utf-8", "surrogateescape")


def printable(text: str) -> str:
    """A path fit for messages, JSON and logs: undecodable bytes shown as ``\\xff``."""
    return raw_name(text).decode("utf-8", "backslashreplace")


def stable_hash(text: str, salt: str) -> int:
    """A 64-bit hash that is the same on every machine, process and run.

    Hashes the name's raw bytes, so a file name that is not UTF-8 hashes too.
    """
    digest = hashlib.sha256(salt.encode() + b":" + raw_name(text)).digest()
    return int.from_bytes(digest[:8], "big")


def order_key(relpath: str) -> int:
    """A file's place in its split: files are dealt to shards in key order and written in it.

    A hash, not the path, so classes are interleaved in every shard.
    """
    return stable_hash(relpath, "order")


def split_for(relpath: str, validation_percent: float) -> str:
    fraction = stable_hash(relpath, "split") / 2**64
    return VALIDATION_SPLIT if fraction * 100 < validation_percent else DEFAULT_SPLIT


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """One listed image, carrying everything a worker needs to turn it into a record."""

    path: str
    relpath: str
    split: str
    label: str
    label_id: int  # the id stored in the record: the label's index plus --label_offset
    size: int

    def to_json(self) -> str:
        # vars(), not dataclasses.asdict(), which deep-copies every field: the launcher
        # writes one line per listed file, so this runs once per image. ASCII escapes
        # carry a non-UTF-8 name's lone surrogates through the file unchanged.
        return json.dumps(vars(self))

    @classmethod
    def from_json(cls, line: str) -> "FileEntry":
        return cls(**json.loads(line))


@dataclasses.dataclass(frozen=True)
class Listing:
    entries: list[FileEntry]
    labels: list[str]
    splits: list[str]
    skipped: dict[str, str]  # printable relative path -> why it was skipped

    @property
    def unknown_label_entries(self) -> list[FileEntry]:
        return [e for e in self.entries if e.label_id == UNKNOWN_LABEL]

    def skipped_by_reason(self) -> dict[str, int]:
        return dict(sorted(collections.Counter(self.skipped.values()).items()))

    def split_counts(self) -> dict[str, int]:
        return dict(collections.Counter(e.split for e in self.entries if e.label_id != UNKNOWN_LABEL))


def _match_all(root: str) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """Every file under ``root`` as (path, size in bytes), and the paths passed over, with why.

    gs:// trees are listed folder by folder, concurrently (``GcsClient.list``);
    other schemes through Beam's ``FileSystems.match``.
    """
    if is_local(root):
        return _walk_local(root)
    try:
        if root.startswith("gs://"):
            return GcsClient().list(root), {}
        return [(m.path, m.size_in_bytes) for m in FileSystems.match([join(root, "**")])[0].metadata_list], {}
    except Exception as e:  # noqa: BLE001 - each filesystem raises its own types.
        raise storage_error("list", root, e) from e


def _walk_local(root: str) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """Walks a local tree with ``os.scandir`` (a quarter of the time of Beam's ``match``).

    Links are followed, files and folders alike, since datasets are often
    assembled from linked class folders. A folder reached a second time (a
    loop, or two links to one folder) is listed once, in a walk order that does
    not depend on the filesystem: breadth first, by name. A link that cannot
    be resolved (broken, or pointing at itself) is listed, so that its read
    fails and is reported: no image is lost without a word. Pipes, sockets and
    devices are passed over: reading one could block forever. An unreadable
    folder raises, naming that folder.
    """
    found: list[tuple[str, int]] = []
    passed: dict[str, str] = {}
    seen: dict[tuple[int, int], str] = {}
    folders = collections.deque([root])
    while folders:
        folder = folders.popleft()
        try:
            seen.setdefault(_folder_key(os.stat(folder)), folder)
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            raise storage_error("list", folder, e) from e
        for entry in entries:
            try:
                info = entry.stat()  # follows links
            except OSError:  # broken, a loop of links, or a target we may not see
                found.append((entry.path, 0))
                continue
            if stat.S_ISDIR(info.st_mode):
                key = _folder_key(info)
                if key in seen:
                    passed[entry.path] = SKIP_SEEN_FOLDER
                    _LOG.warning("%s links to %s, which is listed already: listed once",
                                 printable(entry.path), printable(seen[key]))
                else:
                    seen[key] = entry.path
                    folders.append(entry.path)
            elif stat.S_ISREG(info.st_mode):
                found.append((entry.path, info.st_size))
            else:
                passed[entry.path] = SKIP_SPECIAL
    return found, passed


def _folder_key(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


def _is_junk(part: str) -> bool:
    return part.startswith(".") or part in JUNK_NAMES


def _has_split_folders(rel: Sequence[tuple[str, str, int]]) -> bool:
    """True when a split-named top folder holds images at ``<split>/<label>/<image>``.

    Decided by where the images are, not by which folders exist, so a stray
    folder or file beside ``train/`` and ``validation/`` cannot switch the
    layout (its files are skipped with their reason instead).
    """
    for relpath, _, _ in rel:
        parts = relpath.split("/")
        if len(parts) == 3 and parts[0] in SPLIT_NAMES and is_image_name(relpath):
            return True
    return False


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


def list_tree(
    root: str,
    *,
    validation_percent: float = 0.0,
    labels: Sequence[str] | None = None,
    label_offset: int = 0,
) -> Listing:
    """Lists ``root/<label>/<file>`` or ``root/<split>/<label>/<file>``.

    Every file found ends in the listing or in ``skipped`` with its reason:
    hidden and system files (names starting with a dot, ``JUNK_NAMES``, at any
    depth), files that are not images, images outside a label folder, and
    special files.

    Args:
      root: local path or gs:// prefix.
      validation_percent: share of files put in "validation" when the tree has no splits.
      labels: the label order (from --labels_file); by default the sorted folder names.
        Files under a folder not in it are kept with ``label_id == UNKNOWN_LABEL`` so the
        pipeline reports them instead of dropping them.
      label_offset: added to each label's index to give its ``label_id``, the id stored in
        the records (``--label_offset``).

    Raises:
      OptionsError: an empty tree, a split tree with ``validation_percent``, or a
        label folder name that labels.txt cannot hold.
      StorageError: the root or a folder under it cannot be listed.
    """
    root = root.rstrip("/")
    found, passed = _match_all(root)
    skipped = {printable(path[len(root) + 1:]): reason for path, reason in passed.items()}
    rel = []
    for path, size in sorted(found):
        if not path.startswith(root + "/"):
            continue
        relpath = path[len(root) + 1:]
        if any(_is_junk(part) for part in relpath.split("/")):
            skipped[printable(relpath)] = SKIP_HIDDEN
        else:
            rel.append((relpath, path, size))

    split_layout = _has_split_folders(rel)
    if split_layout and validation_percent:
        split_folders = sorted({r.split("/", 1)[0] for r, _, _ in rel} & set(SPLIT_NAMES))
        raise OptionsError(
            f"{root} already has split folders ({', '.join(split_folders)}); "
            "drop --validation_percent")
    depth = 3 if split_layout else 2

    candidates: list[tuple[str, str, str, str, int]] = []  # split, label, relpath, path, size
    for relpath, path, size in rel:
        parts = relpath.split("/")
        if not is_image_name(relpath):
            skipped[printable(relpath)] = SKIP_NOT_IMAGE
        elif len(parts) != depth or (split_layout and parts[0] not in SPLIT_NAMES):
            skipped[printable(relpath)] = SKIP_DEPTH
        else:
            split = parts[0] if split_layout else split_for(relpath, validation_percent)
            candidates.append((split, parts[-2], relpath, path, size))

    if not candidates:
        layout = "ROOT/<label>/<image> or ROOT/<split>/<label>/<image>"
        raise OptionsError(
            f"no images under {root}: expected {layout} with image files "
            f"({len(skipped)} other files skipped)")

    for label, folder in {c[1]: c[2].rsplit("/", 1)[0] for c in candidates}.items():
        check_label_name(label, join(root, folder))
    names = list(labels) if labels is not None else sorted({c[1] for c in candidates})
    ids = {name: i + label_offset for i, name in enumerate(names)}
    entries = [FileEntry(path, relpath, split, label, ids.get(label, UNKNOWN_LABEL), size)
               for split, label, relpath, path, size in candidates]
    splits = sorted({e.split for e in entries if e.label_id != UNKNOWN_LABEL}, key=_split_rank)
    listing = Listing(entries=entries, labels=names, splits=splits, skipped=dict(sorted(skipped.items())))
    for reason, count in listing.skipped_by_reason().items():
        example = next(p for p, r in listing.skipped.items() if r == reason)
        _LOG.warning("skipped %d files: %s (e.g. %s)", count, reason, example)
    return listing


def _split_rank(name: str) -> tuple[int, str]:
    return (SPLIT_NAMES.index(name) if name in SPLIT_NAMES else len(SPLIT_NAMES), name)


def read_labels_file(path: str) -> list[str]:
    """One label a line; the line number is the id."""
    try:
        with FileSystems.open(path) as f:
            text = f.read().decode("utf-8")
    except Exception as e:  # noqa: BLE001
        raise OptionsError(f"cannot read --labels_file {path}: {e}") from e
    names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        raise OptionsError(f"--labels_file {path} lists no labels")
    duplicates = [n for n, c in collections.Counter(names).items() if c > 1]
    if duplicates:
        raise OptionsError(f"--labels_file {path} lists {duplicates[0]!r} more than once")
    return names
