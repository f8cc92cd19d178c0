"""The read-ahead window: reads overlap, results come back in order, and the caps hold."""
from __future__ import annotations

import concurrent.futures
import itertools
import json
import pathlib
import threading
import time

import pytest
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.window import GlobalWindow
from helpers import REPO, make_tree

from beam_prep.errors import ImageError, StorageError
from beam_prep.io.storage import write_lines
from beam_prep.io.tfrecord import read_records
from beam_prep.model.features import decode_all
from beam_prep.write.images.imaging import ImageSpec
from beam_prep.write.images.readahead import ReadAhead, ReadAheadConfig, thread_pool
from beam_prep.write.journal import resume
from beam_prep.write.shared import layout
from beam_prep.write.shared.entry import FileEntry
from beam_prep.write.sinks.steps import SinkConfig, WriteShardFn
from pipelines import prepare_images


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


def test_a_reader_that_starts_its_own_reads_is_given_them_with_the_pool(pool):
    """``FileReader.submit``: gs:// reads on its own loop thread, the pool for the rest."""
    read = RecordingRead(seconds=0)
    submitted = []

    def submit(path, executor):
        submitted.append((path, executor))
        return executor.submit(read, path)

    read.submit = submit
    fetched = list(ReadAhead(read, ReadAheadConfig(concurrency=4), pool).stream(paths(6), lambda p: p, lambda p: 1))
    assert [f.data for f in fetched] == [p.encode() for p in paths(6)]
    assert submitted == [(p, pool) for p in paths(6)]


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


# --- across shard ends, on the GCS test server --------------------------------------

SHARDS = 4
IMAGES = 24


@pytest.fixture(scope="module")
def shard_bucket(gcs_server, tmp_path_factory):
    tree = tmp_path_factory.mktemp("tree")
    make_tree(tree, {"ant": IMAGES // 2, "bee": IMAGES // 2}, size=(32, 24))
    bucket = gcs_server.new_bucket()
    bucket.upload_tree(tree, "images")
    return bucket


def _prepare(gcs_server, bucket, out, sink: str, concurrency: int, latency_s: float,
             hold_s: float | None = None) -> list:
    """One worker writes ``SHARDS`` shards from gs://; returns the image reads the gateway saw. With
    ``hold_s``, the gateway holds the reads until ``concurrency`` are held at once (``GcsGateway.hold_reads``)."""
    gateway = gcs_server.gateway
    since = len(gateway.seen())
    gateway.set_latency(latency_s)
    if hold_s is not None:
        gateway.hold_reads(bucket.name, concurrency, hold_s)
    try:
        gcs_server.run(prepare_images.command(
            "--input", bucket.url("images"), "--output", str(out), "--image_size", "16", "--sink", sink,
            "--num_shards", str(SHARDS), "--direct_num_workers", "1", "--read_concurrency", str(concurrency)),
            cwd=REPO)
    finally:
        gateway.set_latency(0.0)
        gateway.hold_reads(None)
    return [r for r in gateway.seen()[since:]
            if bucket.name in r.buckets and r.method == "GET" and "alt=media" in r.path]


def _shard_heads(out: pathlib.Path, n: int) -> list[list[str]]:
    """Each shard's first ``n`` images (``images/<relpath>``), from the shards written."""
    manifest = json.loads((out / "manifest.json").read_text())
    return [["images/" + decode_all(record)["image/filename"][0].decode()
             for record in itertools.islice(read_records(str(out / name), "gzip"), n)]
            for name in manifest["splits"]["train"]["shards"]]


def test_the_next_shards_reads_start_before_a_shard_is_done(gcs_server, shard_bucket, tmp_path):
    """One worker writes 4 shards of 6 images, 4 reads ahead, and the server holds the reads until 4 are
    held at once (then lets them all go). Carried over shard ends, the window keeps 4 reads out: each
    read consumed sends the next, so the reads go in groups of 4, the 24 in 6, and none waits. A window
    drained at each shard's end has only the shard's last reads out there (6 is no multiple of 4), and
    those wait out the hold. A count, not a time: however slow the machine, no read waits unless the
    reader stops sending while fewer than 4 are out."""
    window = 4
    reads = _prepare(gcs_server, shard_bucket, tmp_path / "ahead", "streaming", concurrency=window, latency_s=0.0,
                     hold_s=10.0)
    assert len(reads) == IMAGES and all(r.status == 200 for r in reads)
    assert len(_shard_heads(tmp_path / "ahead", window)) == SHARDS
    assert gcs_server.gateway.held_out == 0
    assert max(r.others_in_flight for r in reads) <= window - 1  # the window's cap holds across shards
    # One request an image, over the worker's kept-alive connections: none opened per read.
    assert len({r.connection for r in reads}) <= window


def test_shards_read_ahead_across_their_ends_are_those_read_one_by_one(gcs_server, shard_bucket, tmp_path):
    """The same shards, byte for byte, as a run that reads each image in its turn: a window
    carried over shard ends keeps each shard's records, in listing order, in its own file."""
    _prepare(gcs_server, shard_bucket, tmp_path / "ahead", "streaming", concurrency=4, latency_s=0.02)
    _prepare(gcs_server, shard_bucket, tmp_path / "inline", "streaming", concurrency=0, latency_s=0.0)
    shards = sorted(p.name for p in (tmp_path / "inline").glob("train-*"))
    assert len(shards) == SHARDS
    assert sorted(p.name for p in (tmp_path / "ahead").glob("train-*")) == shards
    for name in shards:
        assert (tmp_path / "ahead" / name).read_bytes() == (tmp_path / "inline" / name).read_bytes(), name


# --- the streaming sink's DoFn, called as a runner calls it ------------------------------------


@pytest.fixture
def shard_work(tmp_path):
    """A run's folder with 3 shard listings of 6 local images each, and the sink's config (4 ahead)."""
    images = make_tree(tmp_path / "tree", {"cat": 18}, size=(32, 24))
    work = tmp_path / "work"
    work.mkdir()
    for index in range(3):
        write_lines(str(work / layout.shard_listing_name("train", index)), [
            FileEntry(str(p), f"cat/{p.name}", "train", "cat", 0, p.stat().st_size).to_json()
            for p in images[index * 6:(index + 1) * 6]])
    return SinkConfig(ImageSpec(16, 16), ReadAheadConfig(concurrency=4), str(work), "gzip", {"train": 3})


def _shards_out(outputs) -> list[str]:
    """The shard names among a call's outputs (the main output's rows)."""
    return [o.value[1] for o in outputs if not isinstance(o, TaggedOutput)]


def _call(fn, index: int) -> list:
    return list(fn.process(index, timestamp=0, window=GlobalWindow()))


def test_a_shard_is_finished_by_the_call_after_it_when_its_last_reads_are_in_flight(shard_work):
    names = [layout.shard_name("train", i, 3, shard_work.shard_suffix) for i in range(3)]
    fn = WriteShardFn(shard_work, "train")
    fn.setup()
    try:
        fn.start_bundle()
        assert _shards_out(_call(fn, 0)) == []  # its last 4 reads are still in the window
        assert resume.finished_shard(shard_work.work, names[0]) is None
        assert _shards_out(_call(fn, 1)) == [names[0]]  # finished while shard 1's reads went out
        assert resume.finished_shard(shard_work.work, names[0]).records == 6
        assert _shards_out(list(fn.finish_bundle())) == [names[1]]
        assert resume.finished_shard(shard_work.work, names[1]).records == 6
    finally:
        fn.teardown()


def test_a_failed_call_leaves_the_shards_it_had_open_unfinished_and_a_new_bundle_writes_them(shard_work):
    name = layout.shard_name("train", 0, 3, shard_work.shard_suffix)
    (pathlib.Path(shard_work.work) / layout.shard_listing_name("train", 2)).unlink()
    fn = WriteShardFn(shard_work, "train")
    fn.setup()
    try:
        fn.start_bundle()
        _call(fn, 0)
        with pytest.raises(StorageError):
            _call(fn, 2)  # its listing is gone: shard 0's last reads are dropped with it
        assert resume.finished_shard(shard_work.work, name) is None
        assert not (pathlib.Path(shard_work.work) / name).exists()
        fn.start_bundle()  # the runner retries
        assert _shards_out(_call(fn, 0) + list(fn.finish_bundle())) == [name]
    finally:
        fn.teardown()
    assert resume.finished_shard(shard_work.work, name).records == 6
