"""One GCS request over a pooled connection, retried: what ``gcs.GcsClient``'s calls all go through.

The connections are the standard library's ``http.client``, kept open and
reused (``_Connections``): a worker reads every image as one request, and
urllib3's pool spent about twice ``http.client``'s CPU per request on the same
reads (URL re-encoding, its response wrapper; docs/guides/gcs-dataflow.md).

Every read is checked against the CRC32C that GCS sends in ``x-goog-hash``, and
transient failures (429, 5xx, dropped or timed-out connections, a checksum
mismatch) are retried with exponential back-off and full jitter; the final
failure raises ``GcsError`` naming the object and the reason.

Writes ask for the read-write scope, with credentials of their own made at the
first write; reads keep the read-only scope, so a job that only reads never
asks for more.
"""
from __future__ import annotations

import base64
import dataclasses
import http.client
import logging
import os
import random
import select
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping

from beam_prep.errors import StorageError

__all__ = ["DEFAULT_TIMEOUT", "Endpoint", "GcsError", "GcsPreconditionFailed", "RetryPolicy", "Timeout", "Transport",
           "crc32c_matches"]

_LOG = logging.getLogger(__name__)

READ_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
WRITE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
DEFAULT_ENDPOINT = "https://storage.googleapis.com"
# Statuses GCS documents as retryable; 401 is retried once after a token refresh.
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


@dataclasses.dataclass(frozen=True)
class Timeout:
    """Seconds to wait for a connection, and between bytes of an answer."""

    connect: float
    read: float


DEFAULT_TIMEOUT = Timeout(connect=20.0, read=120.0)


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Where a ``Transport``'s requests go: for a client that opens connections of its own."""

    host: str
    port: int
    host_header: str  # the Host header's value
    prefix: str  # the endpoint URL's path, before every request's
    ssl_context: ssl.SSLContext | None  # None: plain HTTP
    timeout: Timeout


class GcsError(StorageError):
    """A GCS request that failed for good; ``code`` is its HTTP status, if it got one."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class GcsPreconditionFailed(GcsError):
    """HTTP 412: the object's generation was not the one a write or delete required.

    ``after_retry`` says an earlier attempt of the same call had failed in a
    way that leaves unknown whether GCS applied it (a dropped connection, a
    5xx): the 412 may then answer our own earlier success.
    """

    def __init__(self, message: str, after_retry: bool = False) -> None:
        super().__init__(message, 412)
        self.after_retry = after_retry


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a request (a read, a list page) is retried after a transient failure.

    The delays grow as ``first_delay_s * 2**n`` up to ``max_delay_s``, each drawn
    uniformly below that bound (full jitter), so that many workers throttled at
    once do not come back in step.
    """

    attempts: int = 6
    first_delay_s: float = 0.25
    max_delay_s: float = 8.0

    def delays(self) -> Iterator[float]:
        for n in range(self.attempts - 1):
            yield random.uniform(0, min(self.max_delay_s, self.first_delay_s * 2**n))


class _Transient(Exception):
    """A failure worth another attempt."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class Transport:
    """Connections to one GCS endpoint, and the credentials for reads and (made at the first
    write) for writes. Thread-safe; arguments as ``GcsClient``'s."""

    def __init__(self, connections: int, retry: RetryPolicy, endpoint: str | None,
                 timeout: Timeout = DEFAULT_TIMEOUT) -> None:
        endpoint = endpoint or os.environ.get("STORAGE_EMULATOR_HOST") or DEFAULT_ENDPOINT
        if "://" not in endpoint:
            endpoint = "http://" + endpoint
        self._retry = retry
        self._connections = _Connections(endpoint, max(1, connections), timeout)
        self._read_auth = _Auth(_default_credentials(READ_SCOPE, "reading"))
        self._write_auth: _Auth | None = None  # made at the first write
        self._write_auth_lock = threading.Lock()

    def endpoint(self) -> Endpoint:
        """Where the requests go, and how long a connection and an answer may take."""
        return self._connections.endpoint()

    def read_headers(self) -> dict[str, str]:
        """The headers that authorise a read (the token, refreshed when it has expired)."""
        return self._read_auth.headers()

    def call(self, what: str, method: str, url: str, body: bytes | None = None,
             headers: dict[str, str] | None = None, checked: bool = False) -> bytes:
        """One request with retries: the answer's body, or GcsError."""
        auth = self._read_auth if method == "GET" else self._auth_for_writes()
        refreshed = False
        retried = False
        delays = self._retry.delays()
        while True:
            try:
                return self._attempt(what, method, url, body, {**(headers or {}), **auth.headers()},
                                     checked)
            except _Unauthorized as e:
                if refreshed:
                    raise GcsError(f"cannot {what}: {e}", 401) from e
                refreshed = True
                auth.refresh()
            except _PreconditionFailed as e:
                raise GcsPreconditionFailed(f"cannot {what}: {e}", after_retry=retried) from e
            except _Transient as e:
                delay = next(delays, None)
                if delay is None:
                    raise GcsError(f"cannot {what}: {e} (gave up after {self._retry.attempts} attempts)",
                                   e.code) from e
                _LOG.debug("retrying %s in %.2f s: %s", what, delay, e)
                retried = True
                time.sleep(delay)

    def _attempt(self, what: str, method: str, url: str, body: bytes | None,
                 headers: dict[str, str], checked: bool) -> bytes:
        try:
            response = self._connections.request(method, url, body, headers)
        except (OSError, http.client.HTTPException) as e:  # reset, refused, timed out, cut short
            raise _Transient(f"{type(e).__name__}: {e}") from e
        status = response.status
        if status in (200, 204):
            data = response.data
            if checked:
                _check_crc32c(response.headers, data)
            return data
        if status == 401:
            raise _Unauthorized(f"HTTP 401 {_reason(response)}")
        if status == 412:
            raise _PreconditionFailed("the object's generation was not the one required (HTTP 412)")
        if status in TRANSIENT_STATUS:
            raise _Transient(f"HTTP {status} {_reason(response)}", status)
        if status == 404:
            raise GcsError(f"cannot {what}: not found (HTTP 404)", 404)
        if status == 403:
            raise GcsError(f"cannot {what}: permission denied (HTTP 403); grant the credentials in "
                           "use access to the bucket", 403)
        raise GcsError(f"cannot {what}: HTTP {status} {_reason(response)}", status)

    def _auth_for_writes(self) -> _Auth:
        with self._write_auth_lock:
            if self._write_auth is None:
                self._write_auth = _Auth(_default_credentials(WRITE_SCOPE, "writing"))
            return self._write_auth


@dataclasses.dataclass(frozen=True)
class _Response:
    status: int
    reason: str
    headers: Mapping[str, str]  # by lower-case name
    data: bytes


class _Connections:
    """Keep-alive connections to one endpoint (``http.client``), up to ``most`` kept idle; thread-safe.

    A connection the server has closed while idle (GCS closes idle ones) is found
    before it is used, as urllib3 finds it, and replaced; one that fails during a
    request is closed, and the failure goes to the caller (who retries).
    """

    def __init__(self, endpoint: str, most: int, timeout: Timeout) -> None:
        parts = urllib.parse.urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) endpoint: {endpoint}")
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._prefix = parts.path.rstrip("/")
        self._context = ssl.create_default_context() if self._https else None
        self._timeout = timeout
        self._most = most
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def endpoint(self) -> Endpoint:
        port = self._port or (443 if self._https else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host  # an IPv6 address
        default = self._port is None or self._port == (443 if self._https else 80)
        return Endpoint(self._host, port, host if default else f"{host}:{port}", self._prefix,
                        self._context, self._timeout)

    def request(self, method: str, target: str, body: bytes | None, headers: dict[str, str]) -> _Response:
        """One request and its whole answer. Raises OSError or ``http.client.HTTPException``."""
        connection = self._take()
        try:
            connection.request(method, self._prefix + target, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except BaseException:
            connection.close()
            raise
        if response.will_close:
            connection.close()
        else:
            self._give(connection)
        return _Response(response.status, response.reason, _joined(response.headers), data)

    def _take(self) -> http.client.HTTPConnection:
        with self._lock:
            while self._idle:
                connection = self._idle.pop()
                if _still_open(connection):
                    return connection
                connection.close()
        if self._https:
            connection = http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout.connect,
                                                     context=self._context)
        else:
            connection = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout.connect)
        connection.connect()
        connection.sock.settimeout(self._timeout.read)
        return connection

    def _give(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self._most:
                self._idle.append(connection)
                return
        connection.close()


def _joined(message: http.client.HTTPMessage) -> dict[str, str]:
    """The headers by lower-case name, a repeated one's values joined with commas, as HTTP
    allows: GCS sends ``x-goog-hash`` once per checksum, and ``get`` would give only the first."""
    headers: dict[str, str] = {}
    for name, value in message.items():
        name = name.lower()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def _still_open(connection: http.client.HTTPConnection) -> bool:
    """An idle connection with nothing to read: one the server closed (or wrote to) is readable."""
    if connection.sock is None:
        return False
    poller = select.poll()
    poller.register(connection.sock, select.POLLIN)
    return not poller.poll(0)


class _Auth:
    """One set of credentials (None: anonymous) and the lock that guards their refresh."""

    def __init__(self, credentials) -> None:
        self._credentials = credentials
        self._lock = threading.Lock()

    def headers(self) -> dict[str, str]:
        if self._credentials is None:
            return {}
        with self._lock:
            if not self._credentials.valid:
                self._refresh_locked()
            return {"Authorization": f"Bearer {self._credentials.token}"}

    def refresh(self) -> None:
        if self._credentials is not None:
            with self._lock:
                self._refresh_locked()

    def _refresh_locked(self) -> None:
        from google.auth.transport.requests import Request

        self._credentials.refresh(Request())


class _Unauthorized(Exception):
    """401: the token may have expired; refresh it once, then give up."""


class _PreconditionFailed(Exception):
    """412: never retried; the caller decides what a lost race means."""


def _default_credentials(scope: str, purpose: str):
    """The Application Default Credentials for ``scope``, or None (anonymous: public buckets) if there are none."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        credentials, _ = google.auth.default(scopes=[scope])
    except DefaultCredentialsError as e:
        _LOG.warning("no Google credentials found (%s); %s gs:// anonymously", e, purpose)
        return None
    return credentials


def _reason(response: _Response) -> str:
    text = response.data[:300].decode("utf-8", "replace").strip()
    return f"{response.reason or ''}{': ' + text if text else ''}".strip()


def _check_crc32c(headers, data: bytes) -> None:
    if not crc32c_matches(headers, data):
        raise _Transient(f"CRC32C mismatch ({len(data)} bytes received)")


def crc32c_matches(headers: Mapping[str, str], data: bytes) -> bool:
    """Whether the body matches GCS's CRC32C of the stored object (``x-goog-hash``, headers by
    lower-case name); True without one, and for objects stored gzip-encoded, which GCS may serve
    decompressed."""
    if headers.get("x-goog-stored-content-encoding", "identity") != "identity":
        return True
    for part in headers.get("x-goog-hash", "").split(","):
        algorithm, _, value = part.strip().partition("=")
        if algorithm == "crc32c":
            import google_crc32c

            return google_crc32c.value(data) == int.from_bytes(base64.b64decode(value), "big")
    return True
