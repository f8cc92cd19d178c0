"""The read-ahead window: reads overlap, results come back in order, and the caps hold."""
from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

from beam_prep.errors import ImageError
from beam_prep.write.images.readahead import ReadAhead, ReadAheadConfig, thread_pool


class RecordingRead:
    """A read that takes a while and records how many ran at once, and in which thread.

    With ``reach``, the first reads wait (10 s at most) until ``reach`` run at once: a window
    that allows that many then shows it on any machine, however late its threads are scheduled,
    and one that allows fewer shows fewer (after the wait).
    """

    def __init__(self, seconds: float = 0.02, fail: frozenset[str] = frozenset(), reach: int = 0) -> None:
        self._seconds = seconds
        self._fail = fail
        self._reach = reach
        self._lock = threading.Condition()
        self._active = 0
        self.max_active = 0
        self.threads: set[str] = set()

    def __call__(self, path: str) -> bytes:
        with self._lock:
            self._active += 1
            self.max_active = max(self.max_active, self._active)
            self.threads.add(threading.current_thread().name)
            self._lock.notify_all()
            self._lock.wait_for(lambda: self.max_active >= self._reach, timeout=10)
        try:
            time.sleep(self._seconds)
            if path in self._fail:
                raise ImageError("read", f"cannot read {path}")
            return path.encode()
        finally:
            with self._lock:
                self._active -= 1


@pytest.fixture
def pool():
    with concurrent.futures.ThreadPoolExecutor(16) as executor:
        yield executor


def paths(n: int) -> list[str]:
    return [f"file-{i:03d}" for i in range(n)]


def test_results_come_back_in_order_with_reads_in_flight_up_to_the_cap(pool):
    read = RecordingRead(reach=6)
    window = ReadAhead(read, ReadAheadConfig(concurrency=6), pool)
    fetched = list(window.stream(paths(40), lambda p: p, lambda p: 100))
    assert [f.item for f in fetched] == paths(40)
    assert [f.data for f in fetched] == [p.encode() for p in paths(40)]
    assert read.max_active == 6


def test_the_byte_cap_limits_reads_in_flight(pool):
    read = RecordingRead(reach=3)
    window = ReadAhead(read, ReadAheadConfig(concurrency=16, max_bytes=3_000), pool)
    fetched = list(window.stream(paths(30), lambda p: p, lambda p: 1_000))
    assert len(fetched) == 30
    assert read.max_active == 3


def test_a_file_larger_than_the_byte_cap_is_still_read_alone(pool):
    read = RecordingRead()
    window = ReadAhead(read, ReadAheadConfig(concurrency=8, max_bytes=1_000), pool)
    fetched = list(window.stream(paths(5), lambda p: p, lambda p: 5_000))
    assert [f.data for f in fetched] == [p.encode() for p in paths(5)]
    assert read.max_active == 1


def test_a_failed_read_is_handed_back_in_its_place(pool):
    read = RecordingRead(fail=frozenset({"file-003"}))
    fetched = list(ReadAhead(read, ReadAheadConfig(concurrency=4), pool).stream(
        paths(8), lambda p: p, lambda p: 10))
    assert [f.item for f in fetched] == paths(8)
    failed = [f for f in fetched if f.error is not None]
    assert [f.item for f in failed] == ["file-003"] and failed[0].data is None
    assert failed[0].error.stage == "read"


def test_push_holds_items_until_the_window_is_full(pool):
    window = ReadAhead(RecordingRead(seconds=0), ReadAheadConfig(concurrency=3), pool)
    assert [window.push(p, p, 1) for p in paths(3)] == [[], [], []]
    (oldest,) = window.push("file-003", "file-003", 1)
    assert oldest.item == "file-000"
    assert [f.item for f in window.drain()] == ["file-001", "file-002", "file-003"]


def test_concurrency_zero_reads_inline_in_the_callers_thread():
    read = RecordingRead(seconds=0)
    window = ReadAhead(read, ReadAheadConfig(concurrency=0), None)
    (fetched,) = window.push("file-000", "file-000", 1)
    assert fetched.data == b"file-000"
    assert read.threads == {threading.current_thread().name}
    assert thread_pool(ReadAheadConfig(concurrency=0)) is None


def test_cancel_drops_reads_not_started():
    gate = threading.Event()
    started = []

    def read(path: str) -> bytes:
        started.append(path)
        gate.wait(5)
        return b""

    with concurrent.futures.ThreadPoolExecutor(1) as one_thread:
        with ReadAhead(read, ReadAheadConfig(concurrency=4), one_thread) as window:
            for p in paths(4):
                window.push(p, p, 1)
        gate.set()
    assert started == ["file-000"]
