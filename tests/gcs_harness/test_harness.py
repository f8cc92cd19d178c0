"""The gs:// test harness (``server.py``) serves the code paths the product really uses.

These test the test server and Google's clients against it, not beam-prep: its
gs:// behaviour is tested in ``tests/write/test_gcs_pipeline.py``, ``tests/io/test_gcs.py``
and ``tests/write/test_claim.py``.

Beam's FileSystems and a DirectRunner pipeline go through google-cloud-storage
(``STORAGE_EMULATOR_HOST``); TensorFlow goes through its own libcurl GCS
filesystem and the TLS gateway (``HTTPS_PROXY``). TF runs in a child process
because it fixes its GCS settings when a process first touches gs://; one
child runs every TF step, so TF is imported once for the whole module.
"""
from __future__ import annotations

import hashlib
import http.client
import json
import os
import pathlib
import socket
import struct
import sys
from typing import TYPE_CHECKING

import pytest
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems

from gcs_harness.children.write_tfrecords import RECORDS
from gcs_harness.emulator import LOOPBACK
from gcs_harness.gateway import ACCESS_TOKEN

if TYPE_CHECKING:  # imported by pytest as a plugin; importing it first would
    from gcs_harness.server import GcsBucket, GcsServer  # stop pytest rewriting it

REPO = pathlib.Path(__file__).resolve().parents[2]


def _child(name: str, *args: str) -> list[str]:
    """The command that runs ``children/<name>.py`` in a fresh Python process (cwd: REPO)."""
    return [sys.executable, "-m", f"tests.gcs_harness.children.{name}", *args]


def _paths(pattern: str) -> list[str]:
    return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)


# --- The helpers that set up and check data ---------------------------------


def test_bucket_helpers_upload_and_download_a_tree(
        gcs_bucket: GcsBucket, tmp_path: pathlib.Path) -> None:
    for relative in ["cats/1.jpg", "dogs/deeper/2.jpg"]:
        (tmp_path / "in" / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / relative).write_bytes(relative.encode())
    assert gcs_bucket.upload_tree(tmp_path / "in", "images/") == [
        gcs_bucket.url("images/cats/1.jpg"), gcs_bucket.url("images/dogs/deeper/2.jpg")]
    gcs_bucket.download_tree("images", tmp_path / "out")
    assert (tmp_path / "out/dogs/deeper/2.jpg").read_bytes() == b"dogs/deeper/2.jpg"
    assert gcs_bucket.exists("images/cats/1.jpg") and not gcs_bucket.exists("images/cats")


# --- Beam's FileSystems against the emulator -------------------------------


def test_beam_match_with_prefix_lists_only_objects_under_it(gcs_bucket: GcsBucket) -> None:
    for name in ["data/a.txt", "data/b.txt", "other/c.txt"]:
        gcs_bucket.write_bytes(name, b"x")
    assert _paths(gcs_bucket.url("data/*")) == [gcs_bucket.url("data/a.txt"),
                                                gcs_bucket.url("data/b.txt")]


def test_beam_match_expands_wildcards_in_folder_and_file(
        gcs_bucket: GcsBucket, tmp_path: pathlib.Path) -> None:
    for relative in ["cats/1.jpg", "cats/2.jpg", "dogs/1.jpg", "dogs/deeper/3.jpg"]:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_bytes(b"jpeg")
    gcs_bucket.upload_tree(tmp_path, "images")
    assert _paths(gcs_bucket.url("images/*/*")) == [
        gcs_bucket.url(f"images/{n}") for n in ["cats/1.jpg", "cats/2.jpg", "dogs/1.jpg"]]


def test_beam_match_reports_object_sizes(gcs_bucket: GcsBucket) -> None:
    gcs_bucket.write_bytes("sized.bin", b"12345")
    [metadata] = FileSystems.match([gcs_bucket.url("sized.bin")])[0].metadata_list
    assert metadata.size_in_bytes == 5


def test_beam_open_reads_object_contents(gcs_bucket: GcsBucket) -> None:
    gcs_bucket.write_bytes("in.bin", bytes(range(256)) * 100)
    with FileSystems.open(gcs_bucket.url("in.bin")) as f:
        assert f.read() == bytes(range(256)) * 100


@pytest.mark.parametrize("name", ["a;$(touch x).jpg", "pct%41.jpg", "q?x.jpg", "hash#x.jpg", "sp ace é.jpg"])
def test_beam_open_reads_an_object_whose_name_a_url_must_quote(gcs_bucket: GcsBucket, name: str) -> None:
    # google-cloud-storage reads through the object's mediaLink, which GCS quotes (the emulator did not).
    gcs_bucket.write_bytes(f"in/{name}", name.encode())
    gcs_bucket.write_bytes("in/pctA.jpg", b"another object")
    with FileSystems.open(gcs_bucket.url(f"in/{name}")) as f:
        assert f.read() == name.encode()

def test_beam_create_writes_object_with_resumable_upload(
        gcs_server: GcsServer, gcs_bucket: GcsBucket) -> None:
    data = b"z" * (3 * 1024 * 1024 + 17)
    with FileSystems.create(gcs_bucket.url("out/new.bin")) as f:
        f.write(data)
    assert gcs_bucket.read_bytes("out/new.bin") == data
    assert any("uploadType=resumable" in r.path
               for r in gcs_server.gateway.requests_for(gcs_bucket.name))


def test_beam_rename_moves_objects_with_batch_copy_and_delete(
        gcs_server: GcsServer, gcs_bucket: GcsBucket) -> None:
    for name in ["tmp/a", "tmp/b"]:
        gcs_bucket.write_bytes(name, name.encode())
    FileSystems.rename([gcs_bucket.url("tmp/a"), gcs_bucket.url("tmp/b")],
                       [gcs_bucket.url("final/a"), gcs_bucket.url("final/b")])
    assert gcs_bucket.list_names() == ["final/a", "final/b"]
    assert gcs_bucket.read_bytes("final/b") == b"tmp/b"
    assert any(r.path.startswith("/batch/")
               for r in gcs_server.gateway.requests_for(gcs_bucket.name))


def test_beam_delete_removes_objects(gcs_bucket: GcsBucket) -> None:
    for name in ["a", "b", "keep"]:
        gcs_bucket.write_bytes(name, b"x")
    FileSystems.delete([gcs_bucket.url("a"), gcs_bucket.url("b")])
    assert gcs_bucket.list_names() == ["keep"]


def test_beam_requests_carry_the_adc_bearer_token(
        gcs_server: GcsServer, gcs_bucket: GcsBucket) -> None:
    gcs_bucket.write_bytes("a", b"x")
    _paths(gcs_bucket.url("*"))
    seen = gcs_server.gateway.requests_for(gcs_bucket.name)
    assert seen and {r.authorization for r in seen} == {f"Bearer {gcs_server.access_token}"}


def test_gateway_rejects_requests_without_the_adc_token(
        gcs_server: GcsServer, gcs_bucket: GcsBucket) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", gcs_server.gateway.port, timeout=10)
    try:
        conn.request("GET", f"/storage/v1/b/{gcs_bucket.name}/o")
        response = conn.getresponse()
        assert response.status == 401
        assert json.loads(response.read())["error"]["code"] == 401
    finally:
        conn.close()


def test_beam_match_of_missing_bucket_fails_with_not_found(gcs_missing_bucket: str) -> None:
    with pytest.raises(BeamIOError, match="NotFound"):
        FileSystems.match([f"gs://{gcs_missing_bucket}/*"])


def test_beam_match_of_forbidden_bucket_fails_with_forbidden(
        gcs_forbidden_bucket: GcsBucket) -> None:
    gcs_forbidden_bucket.write_bytes("a", b"x")
    with pytest.raises(BeamIOError, match="Forbidden"):
        FileSystems.match([gcs_forbidden_bucket.url("*")])


def test_beam_credential_lookup_in_a_fresh_process_is_fast(
        gcs_server: GcsServer, gcs_bucket: GcsBucket) -> None:
    gcs_bucket.write_bytes("a", b"x")
    result = gcs_server.run(_child("beam_match_timing", gcs_bucket.url("*")), cwd=REPO, timeout_s=60)
    seconds, matched = result.stdout.split()
    assert matched == "1" and float(seconds) < 5


# --- A Beam pipeline writing GZIP TFRecords, read back by Beam and TF ------


@pytest.fixture(scope="module")
def beam_tfrecords(gcs_server: GcsServer,
                   tmp_path_factory: pytest.TempPathFactory) -> GcsBucket:
    """A bucket holding ``tree/`` (small files) and ``records/`` (RECORDS as
    two GZIP TFRecord shards written by a Beam pipeline in a child process)."""
    bucket = gcs_server.new_bucket()
    for name in ["tree/cats/a.txt", "tree/cats/b.txt", "tree/dogs/c.txt"]:
        bucket.write_bytes(name, name.encode())
    gcs_server.run(_child("write_tfrecords", bucket.url("records/part")), cwd=REPO, timeout_s=120)
    return bucket


@pytest.fixture(scope="module")
def tf_report(gcs_server: GcsServer, beam_tfrecords: GcsBucket,
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Runs ``children/tf_steps.py`` once in a child process and returns its report."""
    report = tmp_path_factory.mktemp("tf") / "report.json"
    with gcs_server.forbidden_bucket() as forbidden:
        gcs_server.run(_child("tf_steps", beam_tfrecords.name,
                              beam_tfrecords.url("records/part-*.tfrecord.gz"),
                              gcs_server.missing_bucket_name(), forbidden.name, str(report)),
                       cwd=REPO, extra_env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout_s=120)
    return json.loads(report.read_text())


def test_beam_pipeline_writes_two_gzip_tfrecord_shards(beam_tfrecords: GcsBucket) -> None:
    assert beam_tfrecords.list_names("records/") == [
        "records/part-00000-of-00002.tfrecord.gz", "records/part-00001-of-00002.tfrecord.gz"]
    assert beam_tfrecords.read_bytes("records/part-00000-of-00002.tfrecord.gz")[:2] == b"\x1f\x8b"


def test_beam_reads_back_the_gzip_tfrecords_it_wrote(
        beam_tfrecords: GcsBucket, gcs_env: dict[str, str]) -> None:
    import apache_beam as beam
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.testing.util import assert_that, equal_to

    with beam.Pipeline(runner="DirectRunner") as p:
        read = p | beam.io.ReadFromTFRecord(
            beam_tfrecords.url("records/part-*"), compression_type=CompressionTypes.GZIP)
        assert_that(read, equal_to(RECORDS))


def test_tf_gfile_glob_matches_objects(tf_report: dict, beam_tfrecords: GcsBucket) -> None:
    assert tf_report["glob"] == {"ok": [beam_tfrecords.url(f"tree/{n}")
                                        for n in ["cats/a.txt", "cats/b.txt", "dogs/c.txt"]]}


def test_tf_gfile_exists_tells_present_from_absent(tf_report: dict) -> None:
    assert tf_report["exists"] == {"ok": [True, False]}


def test_tf_gfile_writes_with_resumable_upload_and_reads_back(
        tf_report: dict, beam_tfrecords: GcsBucket) -> None:
    assert tf_report["write_read"] == {"ok": True}
    assert beam_tfrecords.read_bytes("tf/written.bin") == bytes(range(256)) * 1024


def test_tf_gfile_rename_moves_object(tf_report: dict) -> None:
    assert tf_report["rename"] == {"ok": [False, "moved"]}


def test_tf_tfrecord_dataset_reads_beam_gzip_output(
        tf_report: dict, beam_tfrecords: GcsBucket) -> None:
    assert tf_report["tfrecords"] == {"ok": {
        "files": [beam_tfrecords.url(f"records/part-0000{i}-of-00002.tfrecord.gz")
                  for i in range(2)],
        "records": [r.decode() for r in RECORDS]}}


def test_tf_reports_missing_bucket_as_not_found(tf_report: dict) -> None:
    assert tf_report["missing_bucket"] == {"ok": "NotFoundError"}


def test_tf_reports_forbidden_bucket_as_permission_denied(tf_report: dict) -> None:
    assert tf_report["forbidden_bucket"] == {"ok": "PermissionDeniedError"}


def test_tf_fetches_its_token_through_the_proxy_and_uses_it(
        tf_report: dict, gcs_server: GcsServer, beam_tfrecords: GcsBucket) -> None:
    seen = gcs_server.gateway.seen()
    assert any(r.host == "www.googleapis.com" and r.path.startswith("/oauth2/") for r in seen)
    tf_seen = [r for r in gcs_server.gateway.requests_for(beam_tfrecords.name) if r.host]
    assert tf_seen and {r.authorization for r in tf_seen} == {
        f"Bearer {gcs_server.access_token}"}



# --- How the servers answer --------------------------------------------------


def _data_segments_in(sock: socket.socket) -> int:
    """``tcpi_data_segs_in`` of Linux's ``TCP_INFO``: the segments with data this socket received."""
    return struct.unpack_from("I", sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232), 152)[0]


def _segments_per_answer(port: int, target: str, times: int,
                         token: bool = True) -> list[tuple[int, int, bytes]]:
    """``target`` asked ``times`` over one connection (with the test token, or without):
    (status, data segments, body) of each answer."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=10)
    answers = []
    try:
        conn.connect()
        for _ in range(times):
            before = _data_segments_in(conn.sock)
            conn.request("GET", target, headers={"Authorization": f"Bearer {ACCESS_TOKEN}"} if token else {})
            response = conn.getresponse()
            body = response.read()
            answers.append((response.status, _data_segments_in(conn.sock) - before, body))
    finally:
        conn.close()
    return answers


def test_gateway_answers_in_one_segment_with_nodelay(gcs_server: GcsServer, gcs_bucket: GcsBucket) -> None:
    """Headers and body in one write, Nagle off: a body written after its headers, Nagle on, waits for
    the client's delayed ACK (40 ms) and inflates every client's figures."""
    data = os.urandom(3000)  # one segment, however it is written
    gcs_bucket.write_bytes("a/x.jpg", data)
    for target, token, status in [
            (f"/download/storage/v1/b/{gcs_bucket.name}/o/a%2Fx.jpg?alt=media", True, 200),  # a read
            (f"/{gcs_bucket.name}/a%2Fx.jpg", True, 200),  # an XML API read
            (f"/storage/v1/b/{gcs_bucket.name}/o/missing", True, 404),  # the emulator's error
            (f"/storage/v1/b/{gcs_bucket.name}/o", False, 401)]:  # the gateway's own
        answers = _segments_per_answer(gcs_server.gateway.port, target, 3, token)
        assert [(status, segments) for status, segments, _ in answers] == [(status, 1)] * 3, target
    assert {body for _, _, body in _segments_per_answer(
        gcs_server.gateway.port, f"/{gcs_bucket.name}/a%2Fx.jpg", 1)} == {data}
    with socket.create_connection((LOOPBACK, gcs_server.gateway.port), timeout=10) as client:
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        client.recv(65536)
        port = client.getsockname()[1]
        # The gateway's end of this connection.
        served = [s for s in list(gcs_server.gateway._open) if s.getpeername()[1] == port]
        assert [s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in served] == [1]


def test_emulator_answers_in_one_segment(gcs_server: GcsServer, gcs_bucket: GcsBucket) -> None:
    """The emulator behind the gateway too (a fresh connection each request, so only the first answer
    of a keep-alive would wait for an ACK, but every answer gets one segment all the same)."""
    data = os.urandom(3000)
    gcs_bucket.write_bytes("a/x.jpg", data)
    request = f"GET /download/storage/v1/b/{gcs_bucket.name}/o/a%2Fx.jpg?alt=media HTTP/1.0\r\n\r\n"
    for _ in range(3):
        with socket.create_connection((LOOPBACK, gcs_server.emulator.port), timeout=10) as client:
            client.sendall(request.encode())
            answer = b""
            while chunk := client.recv(65536):  # it closes the connection after the answer
                answer += chunk
            assert answer.startswith(b"HTTP/1.0 200 ") and answer.endswith(b"\r\n\r\n" + data)
            assert _data_segments_in(client) == 1


def test_gateway_serves_xml_api_reads_as_gcs_does(gcs_server: GcsServer, gcs_bucket: GcsBucket) -> None:
    """``GET /BUCKET/OBJECT`` over plain HTTP, names percent-encoded to the last character (as obstore
    sends them), with the object headers GCS's XML API sends and that obstore requires."""
    data = os.urandom(5000)
    gcs_bucket.write_bytes("a b/ü+x.jpg", data)
    quoted = "".join(f"%{b:02X}" for b in f"{gcs_bucket.name}/a b/ü+x.jpg".encode())
    conn = http.client.HTTPConnection(LOOPBACK, gcs_server.gateway.port, timeout=10)
    try:
        conn.request("GET", "/" + quoted.replace("%2F", "/", 1),
                     headers={"Authorization": f"Bearer {ACCESS_TOKEN}"})
        response = conn.getresponse()
        assert (response.status, response.read()) == (200, data)
        assert response.getheader("ETag") == f'"{hashlib.md5(data).hexdigest()}"'
        assert response.getheader("Last-Modified").endswith(" GMT")
        assert int(response.getheader("x-goog-generation")) > 0
        conn.request("GET", f"/{gcs_bucket.name}/missing.jpg", headers={"Authorization": f"Bearer {ACCESS_TOKEN}"})
        missing = conn.getresponse()
        missing.read()
        assert missing.status == 404
    finally:
        conn.close()


# --- Starting beside other processes --------------------------------------------


def test_the_emulator_starts_again_on_another_port_when_its_port_is_taken(tmp_path, monkeypatch):
    """Another process (a second pytest-xdist worker's emulator) binding the chosen port first."""
    import socket

    from gcs_harness import emulator

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind((emulator.LOOPBACK, 0))
        holder.listen()
        taken, other = holder.getsockname()[1], emulator.free_port()
        ports = iter([taken, other])
        monkeypatch.setattr(emulator, "free_port", lambda: next(ports))
        process = emulator.EmulatorProcess(tmp_path)
        process.start()
        try:
            assert process.port == other
            conn = http.client.HTTPConnection(emulator.LOOPBACK, other, timeout=5)
            conn.request("GET", "/")
            assert conn.getresponse().read() == b"OK"
            conn.close()
        finally:
            process.stop()
    assert "Address already in use" in (tmp_path / "gcp-storage-emulator.log").read_text()
