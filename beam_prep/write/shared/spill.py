"""Rows kept on disk instead of in memory: the launcher's external sort.

A tree of millions of files cannot be held in the launcher as Python objects
(hundreds of bytes each). Rows go to a temporary folder in pickled chunks, and a
``SortedSpill`` partitions them by the top bits of a 64-bit key into buckets
small enough to sort one at a time: reading the buckets in turn, each sorted,
gives every row in key order while memory holds one bucket. Rows whose order is
their own (paths, not uniform keys) go to a ``SortedRows`` instead: sorted runs
on disk, merged as they are read back.
"""
from __future__ import annotations

import heapq
import operator
import os
import pickle
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from beam_prep.errors import StorageError
from beam_prep.io.storage import storage_error

__all__ = ["RowFile", "SortedRows", "SortedSpill", "SpillFolder"]

_CHUNK_ROWS = 8192  # rows a RowFile holds before appending them to its file
_BUFFERED_ROWS = 1 << 16  # rows a SortedSpill holds across its buckets before appending
_BUCKET_ROWS = 1 << 15  # rows a bucket is sized for: sorted in memory at once
_RUN_ROWS = 1 << 16  # rows a SortedRows sorts in memory before writing them as one run
# Rows a run's chunk holds: a merge holds one chunk of every run at once, so smaller than a
# RowFile's (a table of 2 million rows makes 31 runs: 31 chunks of 1,024 rows, not of 8,192).
_RUN_CHUNK_ROWS = 1 << 10


def _spill_error(action: str, path: str, error: OSError) -> StorageError:
    """A spill's write that failed, said as a storage error: where it was, and where a full disk
    leaves room (the temp folder is the spill's, not the dataset's)."""
    temp = tempfile.gettempdir()
    return storage_error(action, path, error, room=f"beam-prep spills large tables to the temp folder {temp}: "
                                                   "free space there, or point TMPDIR at a folder with room")


class SpillFolder:
    """A temporary folder, removed by ``close`` or, at the latest, when the object is collected.

    Raises:
      StorageError: the folder cannot be made, naming the temp folder.
    """

    def __init__(self, prefix: str = "beam-prep-listing-") -> None:
        try:
            self.path = tempfile.mkdtemp(prefix=prefix)
        except OSError as e:
            raise _spill_error("make a folder in", tempfile.gettempdir(), e) from e
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.path, ignore_errors=True)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def close(self) -> None:
        self._finalizer()


class RowFile:
    """Rows (any picklable tuples) appended in chunks, read back in the order written."""

    def __init__(self, path: str, chunk_rows: int = _CHUNK_ROWS) -> None:
        self.path = path
        self.count = 0
        self._rows: list[Any] = []
        self._chunk_rows = chunk_rows

    def append(self, row: Any) -> None:
        self._rows.append(row)
        self.count += 1
        if len(self._rows) >= self._chunk_rows:
            self.flush()

    def flush(self) -> None:
        """Appends the rows held to the file.

        Raises:
          StorageError: naming the file, where it cannot be written (a full temp folder).
        """
        if self._rows:
            try:
                with open(self.path, "ab") as f:
                    pickle.dump(self._rows, f, protocol=pickle.HIGHEST_PROTOCOL)
            except OSError as e:
                raise _spill_error("write", self.path, e) from e
            self._rows = []

    def __iter__(self) -> Iterator[Any]:
        if not os.path.exists(self.path):  # never flushed: all in memory (a few rows), not written to be read back
            yield from list(self._rows)
            return
        self.flush()
        with open(self.path, "rb") as f:
            while True:
                try:
                    rows = pickle.load(f)
                except EOFError:
                    return
                yield from rows


class SortedSpill:
    """Rows whose first field is a uniform 64-bit key, read back sorted by it.

    ``expected_rows`` sizes the buckets; more rows only make each bucket larger. ``key``
    sorts each bucket; None sorts the rows themselves, ties in the key broken by the next
    fields (as fast where the keys differ: CPython compares the first fields first).
    """

    def __init__(self, folder: SpillFolder, name: str, expected_rows: int,
                 key: Callable[[tuple], Any] | None = operator.itemgetter(0)) -> None:
        self._key = key
        self._buckets = [RowFile(folder.file(f"{name}-{i:05d}")) for i in range(expected_rows // _BUCKET_ROWS + 1)]
        self._buffered = 0
        self._limit = max(_BUFFERED_ROWS, 64 * len(self._buckets))

    def add(self, row: tuple) -> None:
        bucket = self._buckets[(row[0] * len(self._buckets)) >> 64]
        bucket._rows.append(row)  # flushed below, all buckets at once
        bucket.count += 1
        self._buffered += 1
        if self._buffered >= self._limit:
            self._flush()

    def _flush(self) -> None:
        for bucket in self._buckets:
            bucket.flush()
        self._buffered = 0

    def __iter__(self) -> Iterator[tuple]:
        for bucket in self._buckets:  # each read back from its file, or from memory where it was never flushed
            rows = list(bucket)
            rows.sort(key=self._key)
            yield from rows


class SortedRows:
    """Rows read back in their own order (tuples compared as Python compares them).

    For rows without a uniform key to bucket by (``SortedSpill``): every
    ``_RUN_ROWS`` rows are sorted in memory and written as a run, and reading
    merges the runs, holding a chunk of each (``_RUN_CHUNK_ROWS``): a million rows take 16 runs.
    Fewer rows than a run are sorted in memory and never written. Rows that come in order from the
    first go to one run as they come, ``_CHUNK_ROWS`` at a time (millions of rows in order hold no
    more); those after the first out of order, to runs sorted as above.
    """

    def __init__(self, folder: SpillFolder, name: str) -> None:
        self._folder = folder
        self._name = name
        self._runs: list[RowFile] = []
        self._rows: list[Any] = []
        self._ordered: RowFile | None = None  # the run of the rows in order from the first, where written
        self._last: Any = None  # the last row, while every row came in order; None: one did not, or none yet
        self.count = 0

    def append(self, row: tuple) -> None:
        if self.count and self._last is not None and not row < self._last:
            self._last = row
        elif self.count:
            self._last = None
        else:
            self._last = row
        self._rows.append(row)
        self.count += 1
        if len(self._rows) >= (min(_CHUNK_ROWS, _RUN_ROWS) if self._last is not None else _RUN_ROWS):
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        if self._last is not None:  # in order since the first: onto the run of those
            if self._ordered is None:
                self._ordered = RowFile(self._folder.file(f"{self._name}-ordered"), _RUN_CHUNK_ROWS)
                self._runs.append(self._ordered)
            for row in self._rows:
                self._ordered.append(row)
            self._ordered.flush()
            self._rows = []
            return
        run = RowFile(self._folder.file(f"{self._name}-{len(self._runs):05d}"), _RUN_CHUNK_ROWS)
        for row in sorted(self._rows):
            run.append(row)
        run.flush()
        self._runs.append(run)
        self._rows = []

    def __iter__(self) -> Iterator[Any]:
        if not self._runs:  # fewer than a run: sorted where they are
            self._rows.sort()
            return iter(list(self._rows))
        self._flush()
        return heapq.merge(*self._runs)
