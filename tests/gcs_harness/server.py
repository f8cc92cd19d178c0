"""A real GCS endpoint on loopback for tests of gs:// paths (pytest plugin).

Load it with ``pytest_plugins = ["gcs_harness.server"]`` in ``tests/conftest.py``.

There is no Google Cloud here, so every gs:// test talks to real servers on
127.0.0.1, started once per session::

    Beam / google-cloud-storage --http (STORAGE_EMULATOR_HOST)----+
                                                                  v
    TensorFlow's libcurl --HTTPS_PROXY: CONNECT *.googleapis.com:443,
        TLS with a cert of a test CA (CURL_CA_BUNDLE)------> GcsGateway --http--> gcp-storage-emulator
                                                             (thread here)        (child process)

* ``gcp-storage-emulator`` runs as its own process, in memory, and holds the
  data. It serves everything Beam's GcsIO does: listing with prefixes,
  resumable uploads, and the batch copy/delete that Beam's file sinks use to
  finalise.
* ``GcsGateway`` sits in front of it for every client, for three reasons:

  - TensorFlow's GCS filesystem has ``www.googleapis.com`` and
    ``storage.googleapis.com`` compiled in and no emulator setting (the
    tensorflow-io GCS plugin does not load into TF 2.21), but its libcurl
    honours ``HTTPS_PROXY`` and TF hands ``CURL_CA_BUNDLE`` to curl. The
    gateway answers ``CONNECT``, speaks TLS inside the tunnel with a cert
    from a ``trustme`` test CA and forwards plain HTTP to the emulator,
    mapping what TF asks for onto what the emulator serves.
  - It requires the bearer token of the fake credentials (401 without it),
    so a test fails if a client silently falls back to anonymous access
    instead of the Application Default Credentials the product relies on.
  - It answers 403 for chosen buckets: the emulator has no permission model,
    and the product must report a permission error clearly.
  - It makes the network and GCS's manners testable: a fixed delay on every
    request (as a distant bucket has), injected 429/5xx answers for chosen
    objects (before the emulator sees the request, or after it carried a
    write out, as when an answer is lost), paged listings, and a count of
    the requests in flight at once.
  - It forwards a media upload of JSON (``Content-Type: application/json``)
    as the equivalent multipart upload: the emulator would parse the body as
    JSON metadata and fail (a run's claim is such an upload).
  - It enforces generation preconditions, which the emulator ignores: an
    upload (media, multipart, or the start of a resumable one) or an object
    delete with ``ifGenerationMatch=N`` gets GCS's 412 ``conditionNotMet``
    unless the object's current generation is N (0: the object must not
    exist; a delete of a missing object stays the emulator's 404). The check
    and the write happen under the lock that already makes the gateway
    forward one request at a time, so no other request lands between them:
    atomic, as on GCS. A resumable upload is checked when it starts, not
    again when its last chunk arrives; preconditions inside batch bodies and
    ``ifGenerationNotMatch``/``ifMetageneration*`` are not enforced.

Generations
-----------
The emulator gives every write a new generation, its ``time.time_ns()``, and
reports it with a new ``updated`` time in the upload's answer and in the
object's metadata, as GCS does; ``test_gcs_client.py`` checks this, since
the preconditions above rely on it. The numbers only ever grow while the
clock does.

Credentials
-----------
Without credentials, Beam's lookup (``google.auth.default`` inside Beam's
own retry with back-off) took 18-27 s per process here before Beam went
anonymous, with or without ``NO_GCE_CHECK=true``: the time is Beam's retry,
not the metadata probe. Instead ``GOOGLE_APPLICATION_CREDENTIALS``
names a fake *authorized_user* ADC file (the kind ``gcloud auth
application-default login`` writes) that holds an access token with a
far-future expiry: ``google.auth.default`` returns at once, nothing is
refreshed, and Beam builds its storage client *with* credentials as it does
in production; every request carries ``Authorization: Bearer <token>``. A
``FileSystems.match`` in a fresh process then takes well under a second.
TensorFlow ignores the cached token and refreshes it at
``https://www.googleapis.com/oauth2/v3/token``, which goes through the proxy;
the gateway answers with the same token.

Environment
-----------
``GcsServer.env()`` holds the variables (see its docstring for why each);
``GcsServer.subprocess_env()`` is a full environment for child processes:
the pipeline run as ``python -m pipelines.prepare_images``, Beam's
multi-processing workers, TF readers. The ``gcs_env`` fixture also puts the
variables into ``os.environ`` for the test, which child processes inherit.

TensorFlow reads its GCS retry and timeout settings and fetches its token
once per process, when the process first touches gs://; the proxy and the CA
bundle it reads per request. The values are fixed for the session, so
in-process TF works once ``gcs_env`` is in place, but if TF touched gs://
earlier in the process it keeps its old settings. Run TF code in a child
process (``GcsServer.run``) unless the test owns the whole process. Beam and
google-auth also decide on credentials once per process: in-process Beam
gs:// code must run under ``gcs_env`` (every bucket fixture implies it).

Errors
------
A missing bucket is the emulator's own 404: Beam raises ``BeamIOError``
around google-cloud-storage's ``NotFound``, TF ``tf.errors.NotFoundError``.
A forbidden bucket gets a GCS-style 403 from the gateway: Beam raises
``BeamIOError`` around ``Forbidden`` (``google.api_core.exceptions.Forbidden``
itself when reading an object), TF ``tf.errors.PermissionDeniedError`` (but
TF's ``listdir`` reports any failure as NotFound). A request without the test
token gets 401, which an anonymous google-cloud-storage client reports as
"Anonymous credentials cannot be refreshed".

Usage::

    def test_pipeline_writes_to_gcs(gcs_server, gcs_bucket, tmp_path):
        make_tree(tmp_path / "in", {"cats": 2})
        gcs_bucket.upload_tree(tmp_path / "in", "images")
        gcs_server.run(prepare_images.command(
                           *pipeline_flags(gcs_bucket.url("images"), gcs_bucket.url("out"))),
                       cwd=REPO_ROOT)  # or conftest's run_prepare(..., env=gcs_env)
        assert gcs_bucket.list_names("out/")

    def test_reader(gcs_server, gcs_bucket):
        gcs_server.run(child("read_gs_train", gcs_bucket.url("out"), ...), cwd=REPO)  # tests/children

Fixtures
--------
``gcs_server`` (session)   the running servers and helpers, ``GcsServer``
``gcs_env``                the variables in ``os.environ``; returns the full env
``gcs_bucket``             a new, empty ``GcsBucket`` with a unique name
``gcs_missing_bucket``     the name of a bucket that does not exist (404)
``gcs_forbidden_bucket``   an existing ``GcsBucket`` that answers 403
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import email
import http.client
import http.server
import json
import logging
import os
import pathlib
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from typing import Iterator, Mapping, Sequence

import pytest
import trustme
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

_log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
PROJECT = "beam-prep-test"
#: The access token every client must present to the gateway.
ACCESS_TOKEN = "beam-prep-test-access-token"

_EMULATOR_START_TIMEOUT_S = 30.0
_EMULATOR_STOP_TIMEOUT_S = 10.0
_POLL_INTERVAL_S = 0.05
_UPSTREAM_TIMEOUT_S = 60.0
# Idle keep-alive connections to the gateway are dropped after this long, so
# a stuck client cannot hold a handler thread for ever.
_CLIENT_IDLE_TIMEOUT_S = 60.0
_DEFAULT_RUN_TIMEOUT_S = 180.0

# TensorFlow's defaults (1 s first back-off, 32 s cap, 10 retries, request
# timeouts of up to an hour) turn a broken setup into a hang of many minutes;
# these make it fail in seconds. Every request here is local and small.
_TF_GCS_SETTINGS = {
    "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "10000",
    "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "200000",
    "GCS_RETRY_CONFIG_MAX_RETRIES": "2",
    "GCS_REQUEST_CONNECTION_TIMEOUT_SECS": "5",
    "GCS_REQUEST_IDLE_TIMEOUT_SECS": "20",
    "GCS_METADATA_REQUEST_TIMEOUT_SECS": "20",
    "GCS_READ_REQUEST_TIMEOUT_SECS": "30",
    "GCS_WRITE_REQUEST_TIMEOUT_SECS": "30",
}

_TUNNEL_HOST = re.compile(r"[a-z0-9-]+\.googleapis\.com")
_TOKEN_PATHS = frozenset({"/token", "/oauth2/v3/token", "/oauth2/v4/token"})
# Hop-by-hop headers, and the framing headers the gateway sets itself.
_NOT_FORWARDED = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
    "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "expect",
    "content-length",
})
# Bucket names in JSON API paths (/storage/v1/b/NAME/o/OBJ, .../copyTo/b/NAME)
# and in the request lines of a batch body. Object names are %2F-escaped by
# every client, so they cannot contain the pattern.
_BUCKET_IN_PATH = re.compile(r"/b/([-.\w]+)")
# A list request: GET /storage/v1/b/NAME/o
_LIST_PATH = re.compile(r"/storage/v1/b/[-.\w]+/o")
# GCS answers a list request with at most this many items and prefixes, and a token for the rest.
_MAX_PAGE = 1000
_KEPT_PAGE_TOKENS = 256
# An object in a JSON API path: /storage/v1/b/NAME/o/OBJ and /download/storage/v1/b/NAME/o/OBJ.
_OBJECT_IN_PATH = re.compile(r"/b/([-.\w]+)/o/([^/?]+)")
# GCS's answer to a write or delete whose ifGenerationMatch does not hold.
_CONDITION_NOT_MET = "At least one of the pre-conditions you specified did not hold."


def _free_port() -> int:
    """A port that the kernel just handed out and nobody holds."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def _gcs_error(status: HTTPStatus, reason: str, message: str) -> bytes:
    """An error body in the JSON API's format, so clients parse it as GCS's."""
    error = {"code": status.value, "message": message,
             "errors": [{"domain": "global", "reason": reason, "message": message}]}
    return json.dumps({"error": error}).encode()


# gcp-storage-emulator's entry point without two costs real GCS does not have.
_EMULATOR_MAIN = pathlib.Path(__file__).with_name("emulator_main.py")


class EmulatorProcess:
    """``gcp-storage-emulator`` as a child process on a free loopback port.

    A process rather than a thread: the emulator is a single-threaded
    ``HTTPServer`` and would otherwise compete for this process's GIL with
    the code under test; it is also how a developer runs it by hand.
    """

    def __init__(self, workdir: pathlib.Path) -> None:
        self._workdir = workdir
        self._proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> pathlib.Path:
        return self._workdir / "gcp-storage-emulator.log"

    def start(self) -> None:
        """Starts the emulator and returns once it answers HTTP."""
        port = _free_port()
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, str(_EMULATOR_MAIN), "start",
                 "--host", LOOPBACK, "--port", str(port), "--in-memory"],
                cwd=self._workdir, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT)
        self._proc, self.port = proc, port
        try:
            self._wait_until_ready(proc)
        except RuntimeError:
            self.stop()
            raise
        _log.info("gcp-storage-emulator pid %d on %s, log %s", proc.pid, self.url, self.log_path)

    def _wait_until_ready(self, proc: subprocess.Popen[bytes]) -> None:
        """Polls the health endpoint until it answers, the child exits, or time is up."""
        deadline = time.monotonic() + _EMULATOR_START_TIMEOUT_S
        while time.monotonic() < deadline:
            conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=2)
            try:
                conn.request("GET", "/")
                response = conn.getresponse()
                if response.status == HTTPStatus.OK and response.read() == b"OK":
                    return
            except OSError:
                pass  # not listening yet
            finally:
                conn.close()
            try:  # the pause between polls, cut short if the child exits
                code = proc.wait(timeout=_POLL_INTERVAL_S)
            except subprocess.TimeoutExpired:
                continue
            raise RuntimeError(f"gcp-storage-emulator exited with {code}:\n{self._log_tail()}")
        raise RuntimeError(f"gcp-storage-emulator did not answer on port {self.port} within "
                           f"{_EMULATOR_START_TIMEOUT_S:.0f} s:\n{self._log_tail()}")

    def _log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """Terminates the child by its PID, killing it if it does not exit."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        proc.terminate()
        try:
            proc.wait(timeout=_EMULATOR_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=_EMULATOR_STOP_TIMEOUT_S)
        _log.info("gcp-storage-emulator pid %d stopped (%s)", proc.pid, proc.returncode)


@dataclass(frozen=True)
class SeenRequest:
    """One request as the gateway handled it, for tests to assert on."""

    host: str | None  # the tunnel's host (TensorFlow), None for plain HTTP
    method: str
    path: str  # as forwarded to the emulator, query included
    authorization: str | None
    status: int
    buckets: frozenset[str]  # named in the path, or in a batch body


class _GatewayHTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, gateway: GcsGateway) -> None:
        self.gateway = gateway
        super().__init__((LOOPBACK, 0), _GatewayHandler)

    def handle_error(self, request: object, client_address: tuple[str, int]) -> None:
        """Logs instead of printing; clients that exit drop connections."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, ssl.SSLError)):
            _log.debug("gateway: %s dropped the connection: %s", client_address, error)
        else:
            _log.exception("gateway: error serving %s", client_address)


class _GatewayHandler(http.server.BaseHTTPRequestHandler):
    """Serves one client connection for ``GcsGateway``."""

    protocol_version = "HTTP/1.1"  # keep-alive, as GCS clients expect
    # Headers and body go out in separate writes: with Nagle on, a keep-alive client
    # waits for the delayed ACK (40 ms) before each response's body.
    disable_nagle_algorithm = True
    timeout = _CLIENT_IDLE_TIMEOUT_S
    server: _GatewayHTTPServer

    def setup(self) -> None:
        super().setup()
        self.tunnel_host: str | None = None
        self.server.gateway._track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.gateway._untrack(self.connection)
            if self.tunnel_host is not None:  # socketserver closes only the raw socket
                self.connection.close()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib's name)
        _log.debug("gateway %s: " + format, self.tunnel_host or "http", *args)

    def do_CONNECT(self) -> None:
        """Opens a TLS tunnel for *.googleapis.com:443; nothing else is proxied."""
        host, _, port = self.path.rpartition(":")
        if port != "443" or not _TUNNEL_HOST.fullmatch(host):
            self._reply(HTTPStatus.FORBIDDEN, b"only *.googleapis.com:443\n", "text/plain")
            self.close_connection = True
            return
        self.send_response(HTTPStatus.OK, "Connection established")
        self.end_headers()
        self.wfile.flush()
        gateway = self.server.gateway
        try:
            tls = gateway.tls_context.wrap_socket(self.connection, server_side=True)
        except (ssl.SSLError, OSError) as err:
            _log.warning("gateway: TLS handshake for %s failed: %s", host, err)
            self.close_connection = True
            return
        gateway._untrack(self.connection)
        gateway._track(tls)
        self.rfile.close()
        self.wfile.close()
        self.connection = tls
        self.rfile = tls.makefile("rb")
        self.wfile = tls.makefile("wb")
        self.tunnel_host = host
        self.close_connection = False

    def do_GET(self) -> None:
        self._serve()

    do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _serve(self) -> None:
        body = self._read_body()
        with self.server.gateway._in_flight():
            time.sleep(self.server.gateway.latency_s)  # concurrent requests wait side by side
            self._serve_request(body)

    def _serve_request(self, body: bytes) -> None:
        url = urllib.parse.urlsplit(self.path)
        path, query = url.path, url.query
        if self.command == "POST" and path in _TOKEN_PATHS:
            token = {"access_token": ACCESS_TOKEN, "token_type": "Bearer", "expires_in": 3600}
            self._record(path, HTTPStatus.OK, frozenset())
            self._reply(HTTPStatus.OK, json.dumps(token).encode())
            return
        if self.tunnel_host == "storage.googleapis.com":
            mapped = _xml_read_to_json_download(self.command, path)
            if mapped is None:
                self._reply(HTTPStatus.NOT_IMPLEMENTED, _gcs_error(
                    HTTPStatus.NOT_IMPLEMENTED, "notImplemented",
                    f"the test gateway serves no {self.command} on the XML API"))
                return
            path, query = mapped, "alt=media"
        elif self.tunnel_host not in (None, "www.googleapis.com"):
            self._reply(HTTPStatus.NOT_FOUND, _gcs_error(
                HTTPStatus.NOT_FOUND, "notFound", f"{self.tunnel_host} serves only tokens here"))
            return
        target = f"{path}?{query}" if query else path
        buckets = set(_BUCKET_IN_PATH.findall(path))
        if path.startswith("/batch/"):
            buckets.update(_BUCKET_IN_PATH.findall(body.decode("utf-8", "replace")))

        status, reason, headers, data = self._answer(target, body, frozenset(buckets))
        self._record(target, status, frozenset(buckets))
        self.send_response(status, reason)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.wfile.flush()

    def _answer(self, target: str, body: bytes,
                buckets: frozenset[str]) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """The gateway's own answer (401, 403, 502) or the emulator's."""
        gateway = self.server.gateway
        json_type = [("Content-Type", "application/json; charset=UTF-8")]
        if self.headers.get("Authorization") != f"Bearer {ACCESS_TOKEN}":
            return HTTPStatus.UNAUTHORIZED, "Unauthorized", json_type, _gcs_error(
                HTTPStatus.UNAUTHORIZED, "required",
                "Anonymous caller does not have storage access (the test gateway "
                "wants the token of the fake ADC file).")
        denied = sorted(buckets & gateway.forbidden_buckets())
        if denied:
            return HTTPStatus.FORBIDDEN, "Forbidden", json_type, _gcs_error(
                HTTPStatus.FORBIDDEN, "forbidden",
                f"{PROJECT}@example.com does not have storage access to the Google "
                f"Cloud Storage bucket {denied[0]}. Permission denied on resource.")
        expected = _generation_precondition(self.command, target)
        # Bodies are parsed for a name only where a precondition needs it: uploads can be large.
        obj = _object_named(self.command, target, body if expected is not None else b"",
                            self.headers.get("Content-Type", ""))
        fault = gateway._take_fault(obj, gateway._faults)
        if fault is not None:
            return fault, HTTPStatus(fault).phrase, json_type, _gcs_error(
                HTTPStatus(fault), "backendError", f"injected by the test gateway: HTTP {fault}")
        listing = _LIST_PATH.fullmatch(urllib.parse.urlsplit(target).path) and self.command == "GET"
        page_token = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query).get("pageToken", [None])[0]
        if listing and page_token is not None:
            return gateway._next_page(page_token, target)
        forwarded = [(k, v) for k, v in self.headers.items() if k.lower() not in _NOT_FORWARDED]
        upstream = target
        if obj is not None and _is_json_media_upload(self.command, target, self.headers):
            upstream, forwarded, body = _as_multipart_upload(target, forwarded, body, obj[1])
        if body or self.command in ("POST", "PUT", "PATCH"):
            forwarded.append(("Content-Length", str(len(body))))
        try:
            if obj is not None and expected is not None:
                status, reason, headers, data = gateway._forward_if_generation(
                    self.command, upstream, forwarded, body, obj, expected)
            else:
                status, reason, headers, data = gateway._forward(self.command, upstream, forwarded, body)
        except OSError as err:
            _log.warning("gateway: emulator unreachable for %s %s: %s", self.command, target, err)
            return HTTPStatus.BAD_GATEWAY, "Bad Gateway", json_type, _gcs_error(
                HTTPStatus.BAD_GATEWAY, "backendError", f"emulator unreachable: {err}")
        kept = []
        for name, value in headers:
            lower = name.lower()
            if lower in _NOT_FORWARDED or lower in ("server", "date"):
                continue  # send_response adds its own Server and Date
            if lower == "location" and self.tunnel_host is not None:
                # The emulator builds URLs from the Host header, over http;
                # the client must come back through the tunnel.
                value = re.sub(r"^http://", "https://", value)
            kept.append((name, value))
        if listing and status == HTTPStatus.OK:
            data = gateway._first_page(data, target)
        lost = gateway._take_fault(obj, gateway._lost_answers)
        if lost is not None:
            return lost, HTTPStatus(lost).phrase, json_type, _gcs_error(
                HTTPStatus(lost), "backendError",
                f"injected by the test gateway after the emulator answered {status}: HTTP {lost}")
        return status, reason, kept, data

    def _read_body(self) -> bytes:
        """The request body; chunked wins over Content-Length (RFC 9112, 6.3).

        TF's resumable-upload PUT sends both headers, and the emulator, which
        prefers Content-Length, would read the chunk framing as data.
        """
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailer fields, which GCS clients do not send
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _record(self, path: str, status: int, buckets: frozenset[str]) -> None:
        self.server.gateway._record(SeenRequest(
            self.tunnel_host, self.command, path, self.headers.get("Authorization"),
            int(status), buckets))

    def _reply(self, status: HTTPStatus, body: bytes,
               content_type: str = "application/json; charset=UTF-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()


def _object_named(method: str, target: str, body: bytes, content_type: str) -> tuple[str, str] | None:
    """(bucket, object name) a request is about: from its path, or an upload's ``name``.

    An upload names its object in the query, or (multipart, or the start of a
    resumable upload without ``name``) in the JSON metadata of its body.
    """
    url = urllib.parse.urlsplit(target)
    match = _OBJECT_IN_PATH.search(url.path)
    if match is not None:
        return match.group(1), urllib.parse.unquote(match.group(2))
    bucket = _BUCKET_IN_PATH.search(url.path)
    if method != "POST" or not url.path.startswith("/upload/") or bucket is None:
        return None
    query = urllib.parse.parse_qs(url.query)
    if "name" in query:
        return bucket.group(1), query["name"][0]
    name = _name_in_upload_body(body, content_type)
    return (bucket.group(1), name) if name else None


def _name_in_upload_body(body: bytes, content_type: str) -> str | None:
    """The ``name`` in a multipart upload's metadata part, or in a resumable upload's JSON body."""
    try:
        if content_type.startswith("multipart/"):
            message = email.message_from_bytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body)
            metadata = message.get_payload()[0].get_payload(decode=True)
        else:
            metadata = body
        name = json.loads(metadata or b"{}").get("name")
    except (ValueError, IndexError, TypeError, AttributeError):
        return None
    return name if isinstance(name, str) else None


def _is_json_media_upload(method: str, target: str, headers: Mapping[str, str]) -> bool:
    """A media upload of a JSON object, which the emulator would parse as JSON and fail on."""
    url = urllib.parse.urlsplit(target)
    return (method == "POST" and url.path.startswith("/upload/")
            and urllib.parse.parse_qs(url.query).get("uploadType") == ["media"]
            and headers.get("Content-Type", "").startswith("application/json"))


def _as_multipart_upload(target: str, headers: list[tuple[str, str]], body: bytes,
                         name: str) -> tuple[str, list[tuple[str, str]], bytes]:
    """The same upload as a multipart one, which the emulator stores as GCS does.

    The emulator reads the metadata from the first part, and the object's
    bytes and content type from the second.
    """
    url = urllib.parse.urlsplit(target)
    query = [(k, "multipart" if k == "uploadType" else v) for k, v in urllib.parse.parse_qsl(url.query)]
    target = f"{url.path}?{urllib.parse.urlencode(query)}"
    content_type = {k.lower(): v for k, v in headers}["content-type"]
    boundary = uuid.uuid4().hex
    metadata = json.dumps({"name": name, "contentType": content_type}).encode()
    multipart = b"".join([
        f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(), metadata,
        f"\r\n--{boundary}\r\nContent-Type: {content_type}\r\n\r\n".encode(), body,
        f"\r\n--{boundary}--\r\n".encode()])
    kept = [(k, v) for k, v in headers if k.lower() != "content-type"]
    return target, kept + [("Content-Type", f"multipart/related; boundary={boundary}")], multipart


def _generation_precondition(method: str, target: str) -> int | None:
    """``ifGenerationMatch`` of an upload or a delete, which the gateway enforces; else None."""
    url = urllib.parse.urlsplit(target)
    query = urllib.parse.parse_qs(url.query)
    if "ifGenerationMatch" not in query or "upload_id" in query:
        return None
    if not (method == "DELETE" or (method == "POST" and url.path.startswith("/upload/"))):
        return None
    return int(query["ifGenerationMatch"][0])


def _xml_read_to_json_download(method: str, path: str) -> str | None:
    """Maps TF's object read, ``GET storage.googleapis.com/BUCKET/OBJECT``
    with a Range header, to the emulator's JSON API media download.

    The emulator also has a public ``/BUCKET/OBJECT`` route, but it is listed
    after its API routes and would take a bucket named ``b`` or ``download``
    for one of them; the JSON download route is unambiguous.
    """
    bucket, sep, obj = path.lstrip("/").partition("/")
    if method not in ("GET", "HEAD") or not sep or not obj:
        return None
    quoted = urllib.parse.quote(urllib.parse.unquote(obj), safe="")
    return f"/download/storage/v1/b/{bucket}/o/{quoted}"


class GcsGateway:
    """The HTTP gateway in front of the emulator (see the module docstring).

    It serves plain HTTP (``STORAGE_EMULATOR_HOST`` clients) and, as an
    ``HTTPS_PROXY``, ``CONNECT`` tunnels to *.googleapis.com:443 in which it
    speaks TLS itself. Per request it:

    * answers token requests (``POST /token``, ``/oauth2/v3|v4/token``);
    * maps ``storage.googleapis.com/BUCKET/OBJECT`` reads to the emulator's
      ``/download/storage/v1/b/BUCKET/o/OBJECT?alt=media``; the JSON API on
      www.googleapis.com (metadata, listing, uploads, rewrite) passes as is;
    * answers 401 without the test bearer token, 403 for forbidden buckets;
    * decodes chunked request bodies and forwards them with Content-Length;
    * rewrites ``Location`` to https for tunnelled clients;
    * records what it handled, see ``seen``;
    * pages list answers as GCS does (at most 1,000 names, then a
      ``nextPageToken``; the emulator answers in one page);
    * enforces ``ifGenerationMatch`` on uploads and deletes, atomically
      (see the module docstring), and forwards media uploads of JSON as
      multipart ones, which the emulator can store;
    * on request, adds a fixed latency to every request (``set_latency``),
      fails chosen objects with chosen statuses (``fail``), carries out a
      request but answers it with a failure (``lose_answers``), and counts
      the most requests in flight at once (``max_in_flight``).

    The emulator serves one request at a time with a listen backlog of five,
    so the gateway forwards one at a time too, each on a fresh connection
    (the emulator speaks HTTP/1.0).
    """

    def __init__(self, upstream_port: int, tls_context: ssl.SSLContext) -> None:
        self._upstream_port = upstream_port
        self.tls_context = tls_context
        self._server = _GatewayHTTPServer(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
            name="gcs-gateway", daemon=True)
        self._upstream_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._forbidden: set[str] = set()
        self._open: set[socket.socket] = set()
        self._seen: collections.deque[SeenRequest] = collections.deque(maxlen=100_000)
        self._faults: dict[tuple[str, str], list[int | None]] = {}
        self._lost_answers: dict[tuple[str, str], list[int | None]] = {}
        # The rest of a paged listing, by page token (the emulator itself answers in one page).
        self._pages: collections.OrderedDict[str, list] = collections.OrderedDict()
        self._active = 0
        self.max_in_flight = 0
        #: Seconds added to every request before it is answered; see ``set_latency``.
        self.latency_s = 0.0

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stops accepting, then ends the connections clients left open."""
        self._server.shutdown()
        self._server.server_close()
        with self._state_lock:
            open_sockets = list(self._open)
        for sock in open_sockets:
            with contextlib.suppress(OSError):  # the client closed it meanwhile
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)

    def set_latency(self, seconds: float) -> None:
        """Adds ``seconds`` to every request from now on, as a distant server would.

        The wait happens in the request's own handler thread, before the
        emulator sees it, so concurrent requests wait side by side, as they do
        on a real network, and the one-at-a-time emulator is not held meanwhile.
        """
        self.latency_s = seconds

    def fail(self, bucket: str, name: str, status: int, times: int | None = None) -> None:
        """Answers the next ``times`` requests for object ``name`` with ``status`` (every one if None)."""
        with self._state_lock:
            self._faults[(bucket, name)] = [status] * times if times is not None else [None, status]

    def lose_answers(self, bucket: str, name: str, status: int, times: int = 1) -> None:
        """The next ``times`` requests for object ``name`` are carried out, then answered with ``status``.

        As when GCS applied a write but the answer was lost or came back as a
        5xx: a client that retries meets its own first attempt's result.
        """
        with self._state_lock:
            self._lost_answers[(bucket, name)] = [status] * times

    def reset_in_flight(self) -> None:
        """Starts a new count of ``max_in_flight``: the most requests handled at once."""
        with self._state_lock:
            self.max_in_flight = self._active

    @contextlib.contextmanager
    def _in_flight(self) -> Iterator[None]:
        with self._state_lock:
            self._active += 1
            self.max_in_flight = max(self.max_in_flight, self._active)
        try:
            yield
        finally:
            with self._state_lock:
                self._active -= 1

    def _first_page(self, data: bytes, target: str) -> bytes:
        """Pages the emulator's one-page answer as GCS does; the rest waits under a token."""
        answer = json.loads(data)
        entries = sorted([(item["name"], item, None) for item in answer.get("items") or []]
                         + [(p, None, p) for p in answer.get("prefixes") or []], key=lambda e: e[0])
        return self._page(entries, target)

    def _next_page(self, token: str, target: str) -> tuple[int, str, list[tuple[str, str]], bytes]:
        json_type = [("Content-Type", "application/json; charset=UTF-8")]
        with self._state_lock:
            rest = self._pages.pop(token, None)
        if rest is None:
            return HTTPStatus.BAD_REQUEST, "Bad Request", json_type, _gcs_error(
                HTTPStatus.BAD_REQUEST, "invalid", f"unknown or used page token {token}")
        return HTTPStatus.OK, "OK", json_type, self._page(rest, target)

    def _page(self, entries: list, target: str) -> bytes:
        """One page of at most maxResults (and at most 1000) of ``entries``: (name, item, prefix), sorted."""
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
        size = min(int(query.get("maxResults", [_MAX_PAGE])[0]), _MAX_PAGE)
        page, rest = entries[:size], entries[size:]
        answer: dict[str, object] = {"kind": "storage#objects",
                                     "items": [e[1] for e in page if e[1] is not None],
                                     "prefixes": [e[2] for e in page if e[2] is not None]}
        if rest:
            token = uuid.uuid4().hex
            answer["nextPageToken"] = token
            with self._state_lock:
                self._pages[token] = rest
                while len(self._pages) > _KEPT_PAGE_TOKENS:
                    self._pages.popitem(last=False)
        return json.dumps(answer).encode()

    def _take_fault(self, key: tuple[str, str] | None,
                    faults: dict[tuple[str, str], list[int | None]]) -> int | None:
        """The status to inject for a request about object ``key``, if ``faults`` (planned by
        ``fail`` or ``lose_answers``) names it."""
        if key is None:
            return None
        with self._state_lock:
            planned = faults.get(key)
            if not planned:
                return None
            if planned[0] is None:  # failing for ever
                return planned[1]
            return planned.pop(0)

    def forbid(self, bucket: str) -> None:
        """From now on, requests naming ``bucket`` get 403 Forbidden."""
        with self._state_lock:
            self._forbidden.add(bucket)

    def allow(self, bucket: str) -> None:
        with self._state_lock:
            self._forbidden.discard(bucket)

    def forbidden_buckets(self) -> frozenset[str]:
        with self._state_lock:
            return frozenset(self._forbidden)

    def seen(self) -> list[SeenRequest]:
        """Every request handled so far, oldest first."""
        with self._state_lock:
            return list(self._seen)

    def requests_for(self, bucket: str) -> list[SeenRequest]:
        """The requests handled so far that named ``bucket``."""
        return [r for r in self.seen() if bucket in r.buckets]

    def _record(self, request: SeenRequest) -> None:
        with self._state_lock:
            self._seen.append(request)

    def _track(self, sock: socket.socket) -> None:
        with self._state_lock:
            self._open.add(sock)

    def _untrack(self, sock: socket.socket) -> None:
        with self._state_lock:
            self._open.discard(sock)

    def _forward(self, method: str, target: str, headers: Sequence[tuple[str, str]],
                 body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        with self._upstream_lock:
            return self._forward_locked(method, target, headers, body)

    def _forward_if_generation(self, method: str, target: str, headers: Sequence[tuple[str, str]],
                               body: bytes, obj: tuple[str, str],
                               expected: int) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """Forwards the request only if ``obj``'s generation is ``expected`` (0: absent), else 412.

        The upstream lock is held from the check to the end of the write, so
        nothing else reaches the emulator in between.
        """
        with self._upstream_lock:
            current = self._generation_locked(*obj)
            if current != expected and not (method == "DELETE" and current == 0):
                return HTTPStatus.PRECONDITION_FAILED, "Precondition Failed", [
                    ("Content-Type", "application/json; charset=UTF-8")], _gcs_error(
                    HTTPStatus.PRECONDITION_FAILED, "conditionNotMet", _CONDITION_NOT_MET)
            return self._forward_locked(method, target, headers, body)

    def _generation_locked(self, bucket: str, name: str) -> int:
        """The object's current generation in the emulator, 0 if there is none."""
        path = f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}"
        status, _, _, data = self._forward_locked(
            "GET", path, [("Host", f"{LOOPBACK}:{self._upstream_port}")], b"")
        if status == HTTPStatus.NOT_FOUND:
            return 0
        if status != HTTPStatus.OK:
            raise OSError(f"metadata of gs://{bucket}/{name} for a precondition: HTTP {status}")
        return int(json.loads(data)["generation"])

    def _forward_locked(self, method: str, target: str, headers: Sequence[tuple[str, str]],
                        body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(LOOPBACK, self._upstream_port, timeout=_UPSTREAM_TIMEOUT_S)
        try:
            # Host passes through: the emulator builds Location and
            # mediaLink URLs from it, so they lead back to the gateway.
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                conn.putheader(name, value)
            conn.endheaders(body or None)
            response = conn.getresponse()
            return response.status, response.reason, response.getheaders(), response.read()
        finally:
            conn.close()


class GcsBucket:
    """A bucket in the emulator, with helpers that bypass the gateway.

    The helpers use an anonymous client of their own pointed straight at the
    emulator, so setting up and checking data depends neither on the
    environment under test nor on the gateway: it works for a forbidden
    bucket and does not show in ``GcsGateway.seen``.
    """

    def __init__(self, client: storage.Client, name: str) -> None:
        self.name = name
        self._bucket = client.bucket(name)

    def url(self, path: str = "") -> str:
        """``gs://NAME/path``."""
        return f"gs://{self.name}/{path}"

    def write_bytes(self, name: str, data: bytes) -> str:
        """Writes object ``name``; returns its gs:// URL."""
        self._bucket.blob(name).upload_from_string(data)
        return self.url(name)

    def read_bytes(self, name: str) -> bytes:
        return self._bucket.blob(name).download_as_bytes()

    def exists(self, name: str) -> bool:
        return self._bucket.blob(name).exists()

    def list_names(self, prefix: str = "") -> list[str]:
        """Object names starting with ``prefix``, sorted."""
        return sorted(blob.name for blob in self._bucket.list_blobs(prefix=prefix or None))

    def upload_tree(self, root: pathlib.Path, prefix: str = "", threads: int = 1) -> list[str]:
        """Copies every file under ``root`` to ``gs://NAME/prefix/<relative path>``.

        ``threads`` uploads run at once (for large trees). Returns the gs:// URLs written, sorted.
        """
        base = prefix.strip("/")
        names = {}
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            relative = path.relative_to(root).as_posix()
            names[f"{base}/{relative}" if base else relative] = path

        def upload(name: str) -> str:
            self._bucket.blob(name).upload_from_filename(str(names[name]))
            return self.url(name)

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            return list(pool.map(upload, names))

    def download_tree(self, prefix: str, dest: pathlib.Path) -> list[pathlib.Path]:
        """Copies every object under folder ``prefix`` to ``dest/<rest of its name>``."""
        base = prefix.strip("/")
        written = []
        for name in self.list_names(f"{base}/" if base else ""):
            target = dest / (name[len(base) + 1:] if base else name)
            target.parent.mkdir(parents=True, exist_ok=True)
            self._bucket.blob(name).download_to_filename(str(target))
            written.append(target)
        return written


class GcsServer:
    """The session's emulator and gateway, with the test CA and credentials."""

    def __init__(self, emulator: EmulatorProcess, gateway: GcsGateway,
                 ca_bundle: pathlib.Path, credentials_file: pathlib.Path) -> None:
        self.emulator = emulator
        self.gateway = gateway
        self.ca_bundle = ca_bundle
        self.credentials_file = credentials_file
        self.access_token = ACCESS_TOKEN
        self._admin = storage.Client(
            project=PROJECT, credentials=AnonymousCredentials(),
            client_options=ClientOptions(api_endpoint=emulator.url))

    def env(self) -> dict[str, str]:
        """The variables that point Beam, google-cloud-storage and TF here.

        ``STORAGE_EMULATOR_HOST``: google-cloud-storage (Beam's GCS client)
        sends its JSON API requests there (scheme included), to the gateway.
        ``GOOGLE_APPLICATION_CREDENTIALS``: the fake ADC file (see the module
        docstring); ``GOOGLE_CLOUD_PROJECT`` spares google-auth a project
        lookup. ``NO_GCE_CHECK``: neither google-auth nor TF probes the GCE
        metadata server, which here would time out rather than refuse.
        ``HTTPS_PROXY``/``https_proxy`` and ``CURL_CA_BUNDLE``: TF's libcurl
        reaches *.googleapis.com through the gateway and trusts the test CA.
        Python's ``requests`` honours the same two, so any https request from
        Python in this environment ends at the gateway too, never elsewhere.
        ``NO_PROXY``/``no_proxy``: loopback traffic stays direct even where
        an outer proxy is configured. ``GCS_*``: TF's retries and timeouts,
        kept short so a broken setup fails in seconds, not minutes.
        """
        no_proxy = {LOOPBACK, "localhost"}
        for name in ("NO_PROXY", "no_proxy"):
            no_proxy.update(filter(None, os.environ.get(name, "").split(",")))
        joined_no_proxy = ",".join(sorted(no_proxy))
        return {
            "STORAGE_EMULATOR_HOST": self.gateway.url,
            "GOOGLE_APPLICATION_CREDENTIALS": str(self.credentials_file),
            "GOOGLE_CLOUD_PROJECT": PROJECT,
            "NO_GCE_CHECK": "true",
            "HTTPS_PROXY": self.gateway.url,
            "https_proxy": self.gateway.url,
            "NO_PROXY": joined_no_proxy,
            "no_proxy": joined_no_proxy,
            "CURL_CA_BUNDLE": str(self.ca_bundle),
            **_TF_GCS_SETTINGS,
        }

    def subprocess_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A full environment for a child: ``os.environ``, ``env()``, then ``extra``."""
        return {**os.environ, **self.env(), **(extra or {})}

    def run(self, argv: Sequence[str], *, cwd: pathlib.Path | str | None = None,
            extra_env: Mapping[str, str] | None = None,
            timeout_s: float = _DEFAULT_RUN_TIMEOUT_S,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """Runs ``argv`` with ``subprocess_env(extra_env)``, killed after ``timeout_s``.

        With ``check``, a non-zero exit fails the test and shows the output;
        without, the caller inspects ``returncode`` and ``stderr`` (for the
        error cases the product must report).
        """
        result = subprocess.run(
            list(argv), cwd=cwd, env=self.subprocess_env(extra_env), stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=timeout_s)
        if check and result.returncode != 0:
            pytest.fail(f"{' '.join(argv)} exited with {result.returncode}\n--- stdout\n"
                        f"{result.stdout[-6000:]}\n--- stderr\n{result.stderr[-6000:]}",
                        pytrace=False)
        return result

    def new_bucket(self, name: str | None = None) -> GcsBucket:
        """Creates a bucket in the emulator, by default with a unique name.

        Nothing removes it: the emulator keeps data in memory and ends with
        the session, and unique names keep tests apart.
        """
        bucket = GcsBucket(self._admin, name or unique_bucket_name())
        self._admin.create_bucket(bucket.name)
        return bucket

    @staticmethod
    def missing_bucket_name() -> str:
        """A bucket name that nobody creates: GCS answers 404 for it."""
        return unique_bucket_name("missing")

    @contextlib.contextmanager
    def forbidden_bucket(self) -> Iterator[GcsBucket]:
        """A new bucket for which the gateway answers 403 inside the block.

        The emulator has no permission model, so the gateway injects it; the
        bucket's own helpers bypass the gateway and still work.
        """
        bucket = self.new_bucket(unique_bucket_name("forbidden"))
        self.gateway.forbid(bucket.name)
        try:
            yield bucket
        finally:
            self.gateway.allow(bucket.name)


def unique_bucket_name(prefix: str = "bp") -> str:
    """A valid bucket name that no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def _write_test_credentials(path: pathlib.Path) -> None:
    """An authorized_user ADC file whose access token never needs a refresh.

    google-auth ignores ``token_uri`` for this type and would refresh at
    oauth2.googleapis.com; a valid token with a far expiry means it never does.
    """
    path.write_text(json.dumps({
        "type": "authorized_user",
        "client_id": "beam-prep-test.apps.googleusercontent.com",
        "client_secret": "beam-prep-test-secret",
        "refresh_token": "beam-prep-test-refresh-token",
        "token": ACCESS_TOKEN,
        "expiry": "2999-01-01T00:00:00Z",
    }))


def _tls_context(ca: trustme.CA) -> ssl.SSLContext:
    """The server side of the tunnels: a cert for *.googleapis.com."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("*.googleapis.com").configure_cert(context)
    context.set_alpn_protocols(["http/1.1"])  # no HTTP/2 here
    return context


@contextlib.contextmanager
def running_gcs_server(workdir: pathlib.Path) -> Iterator[GcsServer]:
    """The emulator process and the gateway, for the block: for the tests and the benchmarks."""
    ca = trustme.CA()
    ca_bundle = workdir / "test-ca.pem"
    ca.cert_pem.write_to_path(str(ca_bundle))
    credentials_file = workdir / "application_default_credentials.json"
    _write_test_credentials(credentials_file)

    emulator = EmulatorProcess(workdir)
    emulator.start()
    try:
        gateway = GcsGateway(emulator.port, _tls_context(ca))
        gateway.start()
        try:
            _log.info("GCS gateway on %s", gateway.url)
            yield GcsServer(emulator, gateway, ca_bundle, credentials_file)
        finally:
            gateway.stop()
    finally:
        emulator.stop()


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsServer]:
    """Starts the emulator process and the gateway for the whole session."""
    with running_gcs_server(tmp_path_factory.mktemp("gcs")) as server:
        yield server


@pytest.fixture
def gcs_env(gcs_server: GcsServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Puts ``gcs_server.env()`` into ``os.environ`` for this test.

    Returns the full environment for child processes (``subprocess_env()``).
    """
    for name, value in gcs_server.env().items():
        monkeypatch.setenv(name, value)
    return gcs_server.subprocess_env()


@pytest.fixture
def gcs_bucket(gcs_server: GcsServer, gcs_env: dict[str, str]) -> GcsBucket:
    """A new, empty bucket with a unique name."""
    return gcs_server.new_bucket()


@pytest.fixture
def gcs_missing_bucket(gcs_server: GcsServer, gcs_env: dict[str, str]) -> str:
    """The name of a bucket that does not exist; GCS answers 404 for it."""
    return gcs_server.missing_bucket_name()


@pytest.fixture
def gcs_forbidden_bucket(gcs_server: GcsServer, gcs_env: dict[str, str]) -> Iterator[GcsBucket]:
    """An existing bucket for which the code under test gets 403 Forbidden
    (its helpers still work, for setting up data)."""
    with gcs_server.forbidden_bucket() as bucket:
        yield bucket
