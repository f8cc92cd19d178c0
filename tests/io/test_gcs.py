"""gs:// as the pipeline lists and reads it: folders listed concurrently, one request an image,
retries, reports, and reads that overlap the work; and the conditional writes of a run's claim.

Against the GCS server on loopback (``tests/gcs_harness/server.py``), whose gateway
can add latency to every request and fail chosen objects with chosen statuses.
"""
from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import http.server
import json
import threading
import urllib.parse

import google_crc32c
import pytest
from helpers import REPO, make_tree, read_split

from beam_prep.errors import ImageError, StorageError
from beam_prep.io.gcs import GcsClient, GcsPreconditionFailed, RetryPolicy
from beam_prep.write.images.examples import FileReader
from pipelines import prepare_images

FAST_RETRY = RetryPolicy(attempts=3, first_delay_s=0.01, max_delay_s=0.05)


def object_gets(gcs_server, bucket, name: str, since: int = 0) -> list:
    """The requests for object ``name`` (metadata and media alike) the gateway saw after the first ``since``."""
    quoted = urllib.parse.quote(name, safe="")
    return [r for r in gcs_server.gateway.seen()[since:]
            if bucket.name in r.buckets and f"/o/{quoted}" in r.path]


def test_an_object_is_read_in_one_request(gcs_server, gcs_bucket):
    url = gcs_bucket.write_bytes("images/cat/a b.jpg", b"x" * 5000)
    assert GcsClient().read(url) == b"x" * 5000
    (request,) = object_gets(gcs_server, gcs_bucket, "images/cat/a b.jpg")
    assert request.method == "GET" and "alt=media" in request.path and request.status == 200


def test_a_read_that_fails_twice_with_503_is_retried_and_succeeds(gcs_server, gcs_bucket):
    url = gcs_bucket.write_bytes("flaky.jpg", b"payload")
    gcs_server.gateway.fail(gcs_bucket.name, "flaky.jpg", 503, times=2)
    assert GcsClient(retry=FAST_RETRY).read(url) == b"payload"
    assert [r.status for r in object_gets(gcs_server, gcs_bucket, "flaky.jpg")] == [503, 503, 200]


@pytest.mark.parametrize("status", [429, 500, 503])
def test_a_read_that_keeps_failing_gives_up_after_its_attempts(gcs_server, gcs_bucket, status):
    url = gcs_bucket.write_bytes("down.jpg", b"payload")
    gcs_server.gateway.fail(gcs_bucket.name, "down.jpg", status)
    with pytest.raises(StorageError, match=rf"cannot read {url}: HTTP {status}.*gave up after 3 attempts"):
        GcsClient(retry=FAST_RETRY).read(url)
    assert len(object_gets(gcs_server, gcs_bucket, "down.jpg")) == 3


def test_a_missing_object_is_reported_at_once(gcs_server, gcs_bucket):
    url = gcs_bucket.url("gone.jpg")
    with pytest.raises(ImageError, match=r"not found \(HTTP 404\)") as error:
        FileReader()(url)
    assert error.value.stage == "read"
    assert len(object_gets(gcs_server, gcs_bucket, "gone.jpg")) == 1


def test_a_forbidden_bucket_is_reported_as_such(gcs_server, gcs_forbidden_bucket):
    url = gcs_forbidden_bucket.write_bytes("a.jpg", b"payload")
    with pytest.raises(StorageError, match="permission denied"):
        GcsClient(retry=FAST_RETRY).read(url)


def test_many_reads_share_one_reader_across_threads(gcs_server, gcs_bucket):
    from concurrent.futures import ThreadPoolExecutor

    urls = [gcs_bucket.write_bytes(f"many/{i}.jpg", bytes([i]) * 1000) for i in range(40)]
    reader = GcsClient(connections=8)
    gcs_server.gateway.set_latency(0.05)
    gcs_server.gateway.reset_in_flight()
    try:
        with ThreadPoolExecutor(8) as pool:
            data = list(pool.map(reader.read, urls))
    finally:
        gcs_server.gateway.set_latency(0.0)
    assert data == [bytes([i]) * 1000 for i in range(40)]
    assert gcs_server.gateway.max_in_flight >= 6


# --- listing ---------------------------------------------------------------------

def test_a_tree_is_listed_whole_with_sizes(gcs_server, gcs_bucket):
    names = ["root/loose.jpg", "root/cat/a.jpg", "root/cat/b.jpg", "root/dog/deep/c.jpg",
             "root/train/cat/d.jpg", "rootless/e.jpg"]
    for i, name in enumerate(names):
        gcs_bucket.write_bytes(name, b"x" * (i + 1))
    listed = GcsClient().list(gcs_bucket.url("root"))
    assert sorted(listed) == sorted((gcs_bucket.url(n), i + 1) for i, n in enumerate(names)
                                    if n.startswith("root/"))


def test_split_folders_are_listed_a_level_deeper(gcs_server, gcs_bucket):
    names = [f"t/{split}/{label}/{i}.jpg" for split in ("train", "validation")
             for label in ("a", "b", "c") for i in range(2)]
    for name in names:
        gcs_bucket.write_bytes(name, b"x")
    since = len(gcs_server.gateway.seen())
    assert sorted(p for p, _ in GcsClient().list(gcs_bucket.url("t"))) == sorted(map(gcs_bucket.url, names))
    prefixes = sorted(urllib.parse.parse_qs(urllib.parse.urlsplit(r.path).query)["prefix"][0]
                      for r in gcs_server.gateway.seen()[since:])
    assert prefixes == ["t/", "t/train/", "t/train/a/", "t/train/b/", "t/train/c/", "t/validation/",
                        "t/validation/a/", "t/validation/b/", "t/validation/c/"]


def test_pages_are_followed_to_the_end(gcs_server, gcs_bucket, monkeypatch):
    monkeypatch.setattr("beam_prep.io.gcs.PAGE_SIZE", 4)
    names = [f"p/cat/{i:02d}.jpg" for i in range(10)] + [f"p/{label}/x.jpg" for label in "abcdefg"]
    for name in names:
        gcs_bucket.write_bytes(name, b"x")
    since = len(gcs_server.gateway.seen())
    assert sorted(p for p, _ in GcsClient().list(gcs_bucket.url("p"))) == sorted(map(gcs_bucket.url, names))
    assert len([r for r in gcs_server.gateway.seen()[since:] if "pageToken=" in r.path]) >= 3


def test_folders_are_listed_concurrently(gcs_server, gcs_bucket):
    for label in range(24):
        gcs_bucket.write_bytes(f"c/label{label:02d}/img.jpg", b"x")
    gcs_server.gateway.set_latency(0.05)
    gcs_server.gateway.reset_in_flight()
    try:
        assert len(GcsClient().list(gcs_bucket.url("c"))) == 24
    finally:
        gcs_server.gateway.set_latency(0.0)
    assert gcs_server.gateway.max_in_flight >= 8


def test_listing_a_missing_bucket_says_so(gcs_server, gcs_missing_bucket):
    with pytest.raises(StorageError, match="not found") as error:
        GcsClient().list(f"gs://{gcs_missing_bucket}/images")
    assert error.value.code == 404


def test_listing_a_forbidden_bucket_says_so(gcs_server, gcs_forbidden_bucket):
    gcs_forbidden_bucket.write_bytes("images/cat/a.jpg", b"x")
    with pytest.raises(StorageError, match="permission denied") as error:
        GcsClient(retry=FAST_RETRY).list(gcs_forbidden_bucket.url("images"))
    assert error.value.code == 403


# --- the pipeline from gs://, both sinks -------------------------------------------

LABELS = {"cat": 8, "dog": 8}


@pytest.fixture(scope="module")
def image_bucket(gcs_server, tmp_path_factory):
    tree = tmp_path_factory.mktemp("tree")
    make_tree(tree, LABELS)
    bucket = gcs_server.new_bucket()
    bucket.upload_tree(tree, "images")
    return bucket


@pytest.mark.parametrize("sink", ["streaming", "shuffle"])
def test_reads_overlap_and_faults_are_retried_or_reported(gcs_server, image_bucket, sink, tmp_path):
    """One worker, 40 ms a request: with read-ahead, many reads are in flight at once.

    cat/img_001 fails twice with 503 and is written; dog/img_002 always fails
    and is reported at stage read; every other image is asked for exactly once.
    """
    gateway = gcs_server.gateway
    gateway.fail(image_bucket.name, "images/cat/img_001.jpg", 503, times=2)
    gateway.fail(image_bucket.name, "images/dog/img_002.jpg", 503)
    out = tmp_path / "out"
    gateway.set_latency(0.04)
    gateway.reset_in_flight()
    since = len(gateway.seen())
    try:
        result = gcs_server.run(
            prepare_images.command(
                "--input", image_bucket.url("images"), "--output", str(out), "--image_size", "16",
                "--sink", sink, "--read_concurrency", "8", "--direct_num_workers", "1"), cwd=REPO)
    finally:
        gateway.set_latency(0.0)
        gateway.fail(image_bucket.name, "images/dog/img_002.jpg", 503, times=0)
    assert "15 of 16 images written" in result.stdout
    assert gateway.max_in_flight >= 6  # one worker process: only read-ahead explains it

    names = sorted(r["image/filename"].decode() for r in read_split(out, "train"))
    assert "cat/img_001.jpg" in names and "dog/img_002.jpg" not in names and len(names) == 15
    (error,) = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert error["relpath"] == "dog/img_002.jpg" and error["stage"] == "read"
    assert "HTTP 503" in error["message"] and "gave up" in error["message"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"] == {"listed": 16, "written": 15, "failed": 1, "skipped": 0}
    for label, n in LABELS.items():
        for i in range(n):
            name = f"images/{label}/img_{i:03d}.jpg"
            gets = [r for r in object_gets(gcs_server, image_bucket, name, since)
                    if r.method == "GET" and r.status == 200]
            assert len(gets) == (0 if name.endswith("dog/img_002.jpg") else 1), name


# --- conditional writes, as a run's claim makes them ---------------------------------------

def test_create_only_if_absent_refuses_a_second_create(gcs_server, gcs_bucket):
    url = gcs_bucket.url("o/claim.json")
    client = GcsClient()
    assert client.stat(url) is None
    first = client.create(url, b"first")
    with pytest.raises(GcsPreconditionFailed) as error:
        client.create(url, b"second")
    assert error.value.code == 412 and not error.value.after_retry
    assert gcs_bucket.read_bytes("o/claim.json") == b"first"
    assert client.stat(url) == first


def test_every_write_gets_a_new_generation_and_update_time(gcs_server, gcs_bucket):
    """The emulator's generations and ``updated`` times behave as GCS's; preconditions rely on it."""
    url = gcs_bucket.url("o/claim.json")
    client = GcsClient()
    first = client.create(url, b"first")
    second = client.create(url, b"second", if_generation_match=first.generation)
    assert second.generation > first.generation and second.updated > first.updated
    assert client.stat(url) == second and client.read(url) == b"second"
    with pytest.raises(GcsPreconditionFailed):  # the old version is no longer current
        client.create(url, b"third", if_generation_match=first.generation)


def test_delete_with_a_wrong_generation_is_refused(gcs_server, gcs_bucket):
    url = gcs_bucket.url("o/claim.json")
    client = GcsClient()
    info = client.create(url, b"data")
    with pytest.raises(GcsPreconditionFailed):
        client.delete(url, if_generation_match=info.generation + 1)
    with pytest.raises(GcsPreconditionFailed):
        client.delete(url, if_generation_match=0)
    assert gcs_bucket.exists("o/claim.json")
    assert client.delete(url, if_generation_match=info.generation) is True
    assert not gcs_bucket.exists("o/claim.json")
    assert client.delete(url, if_generation_match=info.generation) is False


def test_a_retried_create_that_meets_its_own_first_write_succeeds(gcs_server, gcs_bucket):
    """The first attempt is written but answered 503; the retry gets 412 and reads back its own bytes."""
    url = gcs_bucket.url("o/claim.json")
    gcs_server.gateway.lose_answers(gcs_bucket.name, "o/claim.json", 503)
    since = len(gcs_server.gateway.seen())
    info = GcsClient(retry=FAST_RETRY).create(url, b"ours")
    assert info == GcsClient().stat(url)
    uploads = [r.status for r in gcs_server.gateway.seen()[since:]
               if gcs_bucket.name in r.buckets and r.path.startswith("/upload/")]
    assert uploads == [503, 412]


def test_a_retried_create_that_meets_another_write_fails(gcs_server, gcs_bucket):
    url = gcs_bucket.url("o/claim.json")
    gcs_bucket.write_bytes("o/claim.json", b"theirs")
    gcs_server.gateway.fail(gcs_bucket.name, "o/claim.json", 503, times=1)
    with pytest.raises(GcsPreconditionFailed) as error:
        GcsClient(retry=FAST_RETRY).create(url, b"ours")
    assert error.value.after_retry
    assert gcs_bucket.read_bytes("o/claim.json") == b"theirs"


def test_of_racing_creates_exactly_one_wins(gcs_server, gcs_bucket):
    """The gateway checks and writes under one lock, as GCS does atomically."""
    url = gcs_bucket.url("o/race.json")
    client = GcsClient(connections=8)
    start = threading.Barrier(8)

    def create(i: int) -> bool:
        start.wait()
        try:
            client.create(url, f"writer {i}".encode())
        except GcsPreconditionFailed:
            return False
        return True

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        won = list(pool.map(create, range(8)))
    assert won.count(True) == 1
    assert gcs_bucket.read_bytes("o/race.json") == f"writer {won.index(True)}".encode()


def test_a_multipart_upload_with_a_precondition_is_checked(gcs_server, gcs_bucket):
    """google-cloud-storage names the object in the body of a multipart upload, not the query."""
    import google.auth
    from google.api_core.exceptions import PreconditionFailed
    from google.cloud import storage

    credentials, project = google.auth.default()  # as Beam does: with the emulator host set,
    client = storage.Client(project=project, credentials=credentials)  # the default is anonymous
    blob = client.bucket(gcs_bucket.name).blob("o/multi.json")
    blob.upload_from_string(b"first", if_generation_match=0)
    with pytest.raises(PreconditionFailed):
        blob.upload_from_string(b"second", if_generation_match=0)
    assert gcs_bucket.read_bytes("o/multi.json") == b"first"


class _HashesApart(http.server.BaseHTTPRequestHandler):
    """Answers every GET as GCS does: the body, and each checksum in an ``x-goog-hash`` header of
    its own (the test gateway sends both in one), the CRC32C second; ``crc32c`` is the server's."""

    protocol_version = "HTTP/1.1"  # keep-alive, as GCS: the connection is reused between reads
    body = b"image bytes" * 100
    crc32c = base64.b64encode(google_crc32c.value(body).to_bytes(4, "big")).decode()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.send_header("x-goog-hash", "md5=" + base64.b64encode(hashlib.md5(self.body).digest()).decode())
        self.send_header("x-goog-hash", "crc32c=" + self.crc32c)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args) -> None:
        pass


@pytest.mark.parametrize("crc32c_right", [True, False])
def test_each_checksum_header_is_read_when_gcs_sends_them_apart(crc32c_right):
    """Real GCS repeats ``x-goog-hash``: the CRC32C in the second is checked all the same, and a body
    that does not match it is retried, then reported, never returned."""
    handler = type("Handler", (_HashesApart,), {} if crc32c_right else {"crc32c": "AAAAAA=="})
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            client = GcsClient(retry=FAST_RETRY, endpoint=f"http://127.0.0.1:{server.server_port}")
            if crc32c_right:
                assert [client.read("gs://b/a.jpg") for _ in range(3)] == [_HashesApart.body] * 3
            else:
                with pytest.raises(StorageError, match="CRC32C mismatch"):
                    client.read("gs://b/a.jpg")
        finally:
            server.shutdown()
