"""gs:// reads on one event-loop thread (``gcs_batch.BatchedReads``, through ``FileReader.submit``):
the same bytes as ``GcsClient.read``, many in flight without a thread each, and every failure
handed to the threaded read, which retries and reports as before.

Against the GCS server on loopback (``tests/gcs_harness/server.py``), and for answers it cannot
give (a body cut short, a wrong checksum), a small server of the test's own.
"""
from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import http.server
import os
import threading
from typing import ClassVar

import google_crc32c
import pytest

from beam_prep.errors import ImageError
from beam_prep.io.gcs import GcsClient
from beam_prep.io.gcs_batch import BatchedReads
from beam_prep.write.images.examples import FileReader


@pytest.fixture
def reader():
    reader = FileReader(connections=16)
    yield reader
    reader.close()


@pytest.fixture
def one_thread():
    """A pool of one thread: reads in flight at once cannot each have one."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        yield pool


def _media_gets(gcs_server, bucket, since: int) -> list:
    return [r for r in gcs_server.gateway.seen()[since:] if bucket.name in r.buckets and r.method == "GET"]


def test_many_reads_are_in_flight_at_once_without_a_thread_each(gcs_server, gcs_bucket, reader, one_thread):
    datas = {f"i/{n}.jpg": os.urandom(n * 997 % 150_000 + 10_000) for n in range(36)}
    for name in ["sp ace/ü.jpg", "a%2Fb?c#d.jpg", "+&=;.jpg"]:  # names to quote (the emulator stores no "..")
        datas[name] = os.urandom(5000)
    urls = {gcs_bucket.write_bytes(name, data): data for name, data in datas.items()}
    gateway = gcs_server.gateway
    gateway.set_latency(0.3)
    gateway.reset_in_flight()
    since = len(gateway.seen())
    try:
        futures = {url: reader.submit(url, one_thread) for url in urls}
        read = {url: future.result(timeout=120) for url, future in futures.items()}
    finally:
        gateway.set_latency(0.0)
    assert {url: hashlib.sha256(data).hexdigest() for url, data in read.items()} == {
        url: hashlib.sha256(data).hexdigest() for url, data in urls.items()}
    gets = _media_gets(gcs_server, gcs_bucket, since)
    assert len(gets) == len(urls) and {r.status for r in gets} == {200}  # one request an object
    assert gateway.max_in_flight > 1  # with one pool thread: only the loop explains it
    assert len({r.connection for r in gets}) <= 16  # kept-alive connections, reused


def test_a_read_that_fails_twice_is_retried_on_the_thread_and_succeeds(gcs_server, gcs_bucket, reader,
                                                                       one_thread):
    url = gcs_bucket.write_bytes("a.jpg", b"jpeg bytes")
    gcs_server.gateway.fail(gcs_bucket.name, "a.jpg", 503, times=2)
    assert reader.submit(url, one_thread).result(timeout=120) == b"jpeg bytes"


@pytest.mark.parametrize("status, message", [(None, "not found (HTTP 404)"), (403, "permission denied (HTTP 403)"),
                                             (500, "HTTP 500")])
def test_a_failed_read_is_the_same_image_error_as_a_threaded_read(gcs_server, gcs_bucket, reader, one_thread,
                                                                  status, message, monkeypatch):
    """The loop hands a failure to the threaded read, whose error (type, stage, message) the future raises."""
    monkeypatch.setattr("beam_prep.io.gcs_transport.RetryPolicy.delays", lambda self: iter([0.0, 0.0]))
    url = gcs_bucket.url("missing.jpg")
    if status is not None:
        url = gcs_bucket.write_bytes("failing.jpg", b"x")
        gcs_server.gateway.fail(gcs_bucket.name, "failing.jpg", status)
    try:
        with pytest.raises(ImageError) as batched:
            reader.submit(url, one_thread).result(timeout=120)
        with pytest.raises(ImageError) as threaded:
            FileReader()(url)
    finally:
        gcs_server.gateway.fail(gcs_bucket.name, "failing.jpg", 200, times=0)
    assert batched.value.stage == threaded.value.stage == "read"
    assert str(batched.value) == str(threaded.value) and message in str(batched.value)
    assert url in str(batched.value)


class _Flaky(http.server.BaseHTTPRequestHandler):
    """Answers as GCS does, except the first answer of each kind in ``faults``: ``short`` cuts the body
    and drops the connection, ``crc32c`` sends a wrong checksum."""

    protocol_version = "HTTP/1.1"
    body = os.urandom(50_000)
    faults: ClassVar[list[str]] = []
    lock = threading.Lock()

    def do_GET(self) -> None:
        with self.lock:
            fault = self.faults.pop(0) if self.faults else None
        crc = google_crc32c.value(self.body) ^ (1 if fault == "crc32c" else 0)
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.send_header("x-goog-hash", "crc32c=" + base64.b64encode(crc.to_bytes(4, "big")).decode())
        self.end_headers()
        self.wfile.write(self.body[:1000] if fault == "short" else self.body)
        if fault == "short":
            self.close_connection = True

    def log_message(self, *args) -> None:
        pass


@pytest.mark.parametrize("fault", ["short", "crc32c"])
def test_a_body_cut_short_or_a_wrong_checksum_is_read_again(fault, one_thread):
    handler = type("Handler", (_Flaky,), {"faults": [fault]})
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        client = GcsClient(endpoint=f"http://127.0.0.1:{server.server_port}")
        reads = BatchedReads(client, client.read, connections=2)
        try:
            assert reads.submit("gs://b/a.jpg", one_thread).result(timeout=60) == _Flaky.body
            assert handler.faults == []  # the fault was met, and read past
            assert [reads.submit("gs://b/a.jpg", one_thread).result(timeout=60) for _ in range(3)] == [_Flaky.body] * 3
        finally:
            reads.close()
            server.shutdown()


def test_close_ends_the_loop_thread_and_reads_still_work_through_a_new_one(gcs_server, gcs_bucket, one_thread):
    url = gcs_bucket.write_bytes("a.jpg", b"abc")
    reader = FileReader(connections=2)
    assert reader.submit(url, one_thread).result(timeout=60) == b"abc"
    loops = [t for t in threading.enumerate() if t.name == "beam-prep-gcs-reads"]
    reader.close()
    assert loops and not any(t.is_alive() for t in loops)
    assert reader.submit(url, one_thread).result(timeout=60) == b"abc"
    reader.close()
