"""Reads that overlap the work: files fetched ahead of their turn, handed back in order.

A worker that reads one file, then decodes it, then reads the next, waits a
full round trip per image: from GCS that wait, not the CPU, sets the pace.
``ReadAhead`` keeps the next files' reads running on a thread pool while the
caller works on the current one, and gives the results back in exactly the
order the files went in, so a shard's records and their order stay what the
listing says. The window is capped both by count and by bytes (from the sizes
the listing recorded), so memory stays bounded however large the files.

Both sinks use it, one window a bundle: the streaming sink over the listings
of the shards it writes, one after the other (the next shard's reads start
before the current one's last are done), the shuffle sink over the elements.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from beam_prep.errors import ImageError

__all__ = ["Fetched", "ReadAhead", "ReadAheadConfig"]

T = TypeVar("T")

DEFAULT_MAX_BYTES = 64 * 2**20


@dataclasses.dataclass(frozen=True)
class ReadAheadConfig:
    """How many reads a worker keeps in flight, and how many bytes they may hold.

    ``concurrency`` 0 reads each file in the caller's thread when its turn comes
    (no threads: local disk, where a read is cheaper than a hand-off); N keeps up
    to N reads running ahead of the work.
    """

    concurrency: int = 0
    max_bytes: int = DEFAULT_MAX_BYTES


@dataclasses.dataclass(frozen=True)
class Fetched(Generic[T]):
    """One item's read: ``data`` or, if the read failed, ``error``."""

    item: T
    data: bytes | None
    error: ImageError | None


class ReadAhead(Generic[T]):
    """An in-order read-ahead window; the caller pushes items and gets them back read.

    ``push`` returns the items that must leave the window to make room (oldest
    first, already read, waiting for them if need be); ``drain`` returns the
    rest. A file larger than the byte cap is still read, alone.

    Args:
      read: path -> bytes; raises ImageError for a file that cannot be read.
        If it has ``submit(path, pool)`` (``examples.FileReader``), reads are
        started with it, for the reader to run them as it sees fit; else
        ``pool.submit(read, path)``.
      config: the window's caps.
      pool: the threads that run the reads (at least ``config.concurrency`` of
        them); unused, and may be None, when ``config.concurrency`` is 0.
    """

    def __init__(self, read: Callable[[str], bytes], config: ReadAheadConfig,
                 pool: concurrent.futures.Executor | None) -> None:
        if config.concurrency and pool is None:
            raise ValueError("a read-ahead with concurrency needs a thread pool")
        self._read = read
        self._submit = getattr(read, "submit", None)
        self._config = config
        self._pool = pool
        self._window: collections.deque[tuple[T, int, concurrent.futures.Future[bytes]]] = collections.deque()
        self._bytes = 0

    def push(self, item: T, path: str, size: int) -> list[Fetched[T]]:
        if not self._config.concurrency:
            return [self._fetched(item, lambda: self._read(path))]
        done = []
        while self._window and (len(self._window) >= self._config.concurrency
                                or self._bytes + size > self._config.max_bytes):
            done.append(self._pop())
        future = self._submit(path, self._pool) if self._submit else self._pool.submit(self._read, path)
        self._window.append((item, size, future))
        self._bytes += size
        return done

    def stream(self, items: Iterable[T], path: Callable[[T], str],
               size: Callable[[T], int]) -> Iterator[Fetched[T]]:
        """Every item of ``items``, read, in their order."""
        for item in items:
            yield from self.push(item, path(item), size(item))
        yield from self.drain()

    def drain(self) -> Iterator[Fetched[T]]:
        while self._window:
            yield self._pop()

    def cancel(self) -> None:
        """Drops the reads not yet started (the caller failed and will not take them)."""
        for _, _, future in self._window:
            future.cancel()
        self._window.clear()
        self._bytes = 0

    def __enter__(self) -> ReadAhead[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    def _pop(self) -> Fetched[T]:
        item, size, future = self._window.popleft()
        self._bytes -= size
        return self._fetched(item, future.result)

    @staticmethod
    def _fetched(item: T, get: Callable[[], bytes]) -> Fetched[T]:
        try:
            return Fetched(item, get(), None)
        except ImageError as e:
            return Fetched(item, None, e)


def thread_pool(config: ReadAheadConfig) -> concurrent.futures.ThreadPoolExecutor | None:
    """The pool a worker's read-ahead runs on, or None when it reads inline."""
    if not config.concurrency:
        return None
    return concurrent.futures.ThreadPoolExecutor(config.concurrency, thread_name_prefix="beam-prep-read")
