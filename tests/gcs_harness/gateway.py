"""The gateway every client goes through to the emulator: TLS for TensorFlow, the
test token, 403s, injected faults and latency, paged listings and generation
preconditions (see ``server.py`` for why each).
"""
from __future__ import annotations

import collections
import contextlib
import email
import http.client
import http.server
import json
import logging
import re
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus

from .emulator import LOOPBACK

_log = logging.getLogger(__name__)

PROJECT = "beam-prep-test"
#: The access token every client must present to the gateway.
ACCESS_TOKEN = "beam-prep-test-access-token"

_UPSTREAM_TIMEOUT_S = 60.0
# Idle keep-alive connections to the gateway are dropped after this long, so
# a stuck client cannot hold a handler thread for ever.
_CLIENT_IDLE_TIMEOUT_S = 60.0

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


def _gcs_error(status: HTTPStatus, reason: str, message: str) -> bytes:
    """An error body in the JSON API's format, so clients parse it as GCS's."""
    error = {"code": status.value, "message": message,
             "errors": [{"domain": "global", "reason": reason, "message": message}]}
    return json.dumps({"error": error}).encode()


@dataclass(frozen=True)
class SeenRequest:
    """One request as the gateway handled it, for tests to assert on."""

    host: str | None  # the tunnel's host (TensorFlow), None for plain HTTP
    method: str
    path: str  # as forwarded to the emulator, query included
    authorization: str | None
    status: int
    buckets: frozenset[str]  # named in the path, or in a batch body
    # Other requests the gateway was handling (waiting out the latency, or being answered) when
    # this one came in: a request counts from its arrival until its answer is ready to send.
    others_in_flight: int = 0
    connection: int = 0  # the client's port: requests over one kept-alive connection share it


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
    # Every answer goes out in one write (``_send``), and with Nagle off: a body written after
    # its headers, Nagle on, would wait for a keep-alive client's delayed ACK (40 ms).
    disable_nagle_algorithm = True
    timeout = _CLIENT_IDLE_TIMEOUT_S
    server: _GatewayHTTPServer

    def setup(self) -> None:
        super().setup()
        self.tunnel_host: str | None = None
        self.others_in_flight = 0
        self._flying = False
        self.server.gateway._track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.gateway._untrack(self.connection)
            if self.tunnel_host is not None:  # socketserver closes only the raw socket
                self.connection.close()

    def log_message(self, format: str, *args: object) -> None:  # stdlib's name
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
        gateway = self.server.gateway
        self.others_in_flight = gateway._take_off()
        self._flying = True
        try:
            gateway._arrive(self.command, self.path)
            time.sleep(gateway.latency_s)  # concurrent requests wait side by side
            self._serve_request(body)
        finally:
            self._land()

    def _land(self) -> None:
        """Ends this request's time in flight: its answer is ready, so the client may already
        have it (and send its next request) before the gateway's thread counts it done."""
        if self._flying:
            self._flying = False
            self.server.gateway._landed()

    def _serve_request(self, body: bytes) -> None:
        url = urllib.parse.urlsplit(self.path)
        path, query = url.path, url.query
        if self.command == "POST" and path in _TOKEN_PATHS:
            token = {"access_token": ACCESS_TOKEN, "token_type": "Bearer", "expires_in": 3600}
            self._record(path, HTTPStatus.OK, frozenset())
            self._reply(HTTPStatus.OK, json.dumps(token).encode())
            return
        if self.tunnel_host == "storage.googleapis.com" or (
                self.tunnel_host is None and _is_xml_read(self.command, path)):
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
        self._land()
        self._send(status, reason, headers, data)

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
            int(status), buckets, self.others_in_flight, self.client_address[1]))

    def _reply(self, status: HTTPStatus, body: bytes,
               content_type: str = "application/json; charset=UTF-8") -> None:
        self._send(status, None, [("Content-Type", content_type)], body)

    def _send(self, status: int, reason: str | None, headers: Sequence[tuple[str, str]],
              body: bytes) -> None:
        """The answer, status line to body, in one write (one segment, where it fits one)."""
        self.send_response(status, reason)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self._headers_buffer.append(b"\r\n")  # what end_headers adds, before it writes
        head = b"".join(self._headers_buffer)
        self._headers_buffer = []
        self.wfile.write(head if self.command == "HEAD" else head + body)
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


# The first segments of the JSON API's paths; any other plain-HTTP GET or HEAD is an XML API
# object read, GET /BUCKET/OBJECT (obstore's, with its base URL at the gateway).
_JSON_API_ROOTS = frozenset({"storage", "download", "upload", "batch", "b"})


def _is_xml_read(method: str, path: str) -> bool:
    """A plain-HTTP XML API object read: ``GET /BUCKET/OBJECT``, the bucket not a JSON API root."""
    root, sep, obj = path.lstrip("/").partition("/")
    return (method in ("GET", "HEAD") and bool(sep and obj)
            and urllib.parse.unquote(root) not in _JSON_API_ROOTS)


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
    return f"/download/storage/v1/b/{urllib.parse.unquote(bucket)}/o/{quoted}"


class GcsGateway:
    """The HTTP gateway in front of the emulator (see the module docstring).

    It serves plain HTTP (``STORAGE_EMULATOR_HOST`` clients) and, as an
    ``HTTPS_PROXY``, ``CONNECT`` tunnels to *.googleapis.com:443 in which it
    speaks TLS itself. Per request it:

    * answers token requests (``POST /token``, ``/oauth2/v3|v4/token``);
    * maps XML API reads, ``GET storage.googleapis.com/BUCKET/OBJECT`` in a
      tunnel (TensorFlow) or ``GET /BUCKET/OBJECT`` over plain HTTP (obstore),
      to the emulator's ``/download/storage/v1/b/BUCKET/o/OBJECT?alt=media``
      (which carries the object's ``ETag``, ``Last-Modified`` and generation,
      see ``emulator_main.py``); the JSON API on www.googleapis.com (metadata,
      listing, uploads, rewrite) passes as is;
    * answers every request in one write, with ``TCP_NODELAY``;
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
      the most requests in flight at once (``max_in_flight``), and with each
      request seen, how many others were in flight when it came in
      (``SeenRequest.others_in_flight``).

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
        # hold_reads: the bucket whose reads are held, in groups of how many, for how long at most; the
        # reads held now, and how many groups went.
        self._hold = threading.Condition()
        self._held_bucket: str | None = None
        self._hold_group = 1
        self._hold_timeout_s = 0.0
        self._held_now = 0
        self._released = 0
        #: Reads ``hold_reads`` let go because no request came after them in time.
        self.held_out = 0

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

    def hold_reads(self, bucket: str | None, group: int = 1, timeout_s: float = 0.0) -> None:
        """From now on (None: no longer), holds each object read of ``bucket`` until ``group`` reads are
        held at once, then lets them all go; a read held ``timeout_s`` goes alone (counted in ``held_out``).

        A reader that keeps ``group`` reads in flight sends its next one while the others are held, so
        its reads go in groups and none waits; one that waits for an answer before sending its next
        read, with fewer out, meets the timeout: which it does shows in a count, not in how long
        anything took, and not in the order concurrent requests happen to reach the server.
        """
        with self._hold:
            if bucket is not None:
                self.held_out = 0  # a new hold's count: None ends the hold and keeps it
            self._held_bucket, self._hold_group, self._hold_timeout_s = bucket, group, timeout_s
            self._held_now = 0
            self._hold.notify_all()

    def _arrive(self, method: str, path: str) -> None:
        """Holds a read of the held bucket until its group is complete (``hold_reads``)."""
        with self._hold:
            bucket = self._held_bucket
            if bucket is None or method != "GET" or "alt=media" not in path or f"/b/{bucket}/o/" not in path:
                return
            self._held_now += 1
            if self._held_now >= self._hold_group:  # the group is complete: all of it goes
                self._held_now = 0
                self._released += 1
                self._hold.notify_all()
                return
            released = self._released
            if not self._hold.wait_for(lambda: self._released != released or self._held_bucket != bucket,
                                       self._hold_timeout_s):
                self._held_now -= 1
                self.held_out += 1

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

    def _take_off(self) -> int:
        """Counts a request in flight; returns how many others were."""
        with self._state_lock:
            self._active += 1
            self.max_in_flight = max(self.max_in_flight, self._active)
            return self._active - 1

    def _landed(self) -> None:
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

