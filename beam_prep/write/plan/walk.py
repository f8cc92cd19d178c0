"""Every file under a tree's root, streamed: ``os.scandir`` on local disk (links followed,
each folder once), folder by folder and concurrently on gs://, Beam's ``match`` elsewhere.

Each file comes with its stamp (``Stamp``), what an append compares with the one its record
keeps to tell an unchanged file without reading it (``plan.listing.stamps``). What the files
become (labels, splits, skipped names) is ``listing``'s to decide.
"""
from __future__ import annotations

import collections
import logging
import os
import stat
from collections.abc import Iterator

from apache_beam.io.filesystems import FileSystems

from beam_prep.io.gcs import GcsClient
from beam_prep.io.storage import is_local, join, storage_error
from beam_prep.write.shared.entry import printable

__all__ = ["SKIP_SEEN_FOLDER", "SKIP_SPECIAL", "Stamp", "walk_tree"]

_LOG = logging.getLogger(__name__)

# Why the walk passes a path over (``listing`` has the other reasons a file is skipped).
SKIP_SPECIAL = "not a regular file"
SKIP_SEEN_FOLDER = "link to a folder listed already"

Stamp = str | None
"""What tells a version of a file from another without reading it, beside its size (as rsync and
make tell): a local file's modification time (``st_mtime_ns``, in decimal), a gs:// object's
generation (``g`` and the number, new with every write); None: none (another scheme). A file
rewritten with its size and its old time put back, or within one tick of a coarse clock (a second
on some network filesystems, two on FAT) after it was listed, keeps its stamp."""


def walk_tree(root: str) -> Iterator[tuple[str, int, Stamp, str | None]]:
    """Every file under ``root`` as (path, size in bytes, stamp, None), and each path passed
    over as (path, 0, None, why), streamed.

    gs:// trees are listed folder by folder, concurrently (``GcsClient.iter_objects``);
    other schemes through Beam's ``FileSystems.match``.
    """
    if is_local(root):
        yield from _walk_local(root)
        return
    try:
        if root.startswith("gs://"):
            yield from ((path, size, f"g{generation}", None)
                        for path, size, generation in GcsClient().iter_objects(root))
        else:
            yield from ((m.path, m.size_in_bytes, None, None)
                        for m in FileSystems.match([join(root, "**")])[0].metadata_list)
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("list", root, e) from e


def _walk_local(root: str) -> Iterator[tuple[str, int, Stamp, str | None]]:
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
                yield entry.path, 0, None, None
                continue
            if stat.S_ISREG(info.st_mode):
                yield entry.path, info.st_size, str(info.st_mtime_ns), None
            elif stat.S_ISDIR(info.st_mode):
                key = _folder_key(info)
                if key in seen:
                    _LOG.warning("%s links to %s, which is listed already: listed once",
                                 printable(entry.path), printable(seen[key]))
                    yield entry.path, 0, None, SKIP_SEEN_FOLDER
                else:
                    seen[key] = entry.path
                    folders.append(entry.path)
            else:
                yield entry.path, 0, None, SKIP_SPECIAL


def _folder_key(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino
