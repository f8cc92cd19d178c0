"""skipped.jsonl: every file the listing passed over and why, beside errors.jsonl.

The summary's "skipped, not an image file: 4" is only useful with the four
names. The launcher writes the lines into the run's folder with the workers'
listings (``work_files``), sorted by path: a resumed run reuses that folder and
a rerun lists the same tree, so both publish the same bytes. The manifest step,
in the launcher or (shuffle sink) on a worker, checks their count against the
plan's and copies them into the dataset, on local disk or gs:// alike.
"""
from __future__ import annotations

import contextlib
import heapq
import io
import itertools
import json
import operator
import shutil
from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.io.filesystems import FileSystems

from beam_prep.errors import DatasetError
from beam_prep.io.storage import join, open_to_read, storage_error, write_lines
from beam_prep.write.plan.listing import Listing
from beam_prep.write.shared import layout
from beam_prep.write.shared.entry import printable

__all__ = ["check", "line", "lines", "publish"]

_COPY_BYTES = 1 << 20


def line(root: str, relpath: str, reason: str, **about: Any) -> str:
    """One file's line, named as errors.jsonl names files: ``path`` (under the input root as
    given) and ``relpath``, both as messages show them (``printable``); the ``reason``; and any
    more it says of the file (``about``: a file left out as a copy names what it copies)."""
    path = join(root, relpath) if root else relpath  # no root: WriteImageDataset's elements, named as given
    return json.dumps({"path": printable(path), "relpath": printable(relpath), "reason": reason,
                       **about}, ensure_ascii=False, sort_keys=True)


def lines(listing: Listing) -> Iterator[str]:
    """The listing's skipped files as lines, sorted by path."""
    for relpath, reason in listing.skipped_rows():
        yield line(listing.root, relpath, reason)


def check(work: str, expected: int) -> None:
    """Checks that the run's skipped.jsonl holds ``expected`` lines (the plan's skipped count),
    before anything is published.

    Raises:
      DatasetError: it holds another number: the manifest would not add up.
      StorageError: it cannot be read.
    """
    if not expected:
        return  # WriteImageDataset lists nothing and writes no such file
    path = join(work, layout.SKIPPED)
    try:
        with open_to_read(path) as f:
            found = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(_COPY_BYTES), b""))
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("read", path, e) from e
    if found != expected:
        raise DatasetError(f"{path} names {found} skipped files but the listing skipped {expected}: "
                           "no manifest written")


def publish(work: str, output: str, expected: int, added: Iterable[tuple[str, str]] = ()) -> None:
    """Copies the run's skipped.jsonl (``check``-ed) into ``output``, merged by path with the
    ``added`` lines (``(path, line)``, sorted by path: the files ``--cross_split_duplicates drop``
    left out); an empty one where nothing was skipped.

    Raises:
      StorageError: it cannot be read or written.
    """
    target = join(output, layout.SKIPPED)
    added = iter(added)
    first = next(added, None)
    if first is not None:
        added = itertools.chain([first], added)
    if not expected and first is None:
        write_lines(target, [])
        return
    source = join(work, layout.SKIPPED)
    with contextlib.ExitStack() as stack:
        try:
            src = stack.enter_context(open_to_read(source)) if expected else io.BytesIO()
        except Exception as e:  # each filesystem raises its own types.
            raise storage_error("read", source, e) from e
        try:
            with FileSystems.create(target, mime_type="text/plain") as dst:
                if first is None:
                    shutil.copyfileobj(src, dst, _COPY_BYTES)
                    return
                listed = ((json.loads(text)["path"], text.decode("utf-8").rstrip("\n")) for text in src)
                for _, text in heapq.merge(listed, added, key=operator.itemgetter(0)):
                    dst.write(text.encode("utf-8") + b"\n")
        except Exception as e:
            raise storage_error("write", target, e) from e
