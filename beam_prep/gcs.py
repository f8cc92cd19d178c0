"""Reading whole GCS objects: one request each, checked, retried with back-off.

A worker reads every image once, whole, and most are small, so what costs is
the number of round trips and the client's own CPU per request, not bandwidth.
Beam's ``FileSystems.open`` first fetches the object's metadata, then reads it
through a buffered reader (two round trips, and the most client CPU of the
clients we measured); google-cloud-storage's ``Blob.download_as_bytes`` makes
one request but spends several times the CPU of a plain pooled HTTP GET. So
this module sends that GET itself: the JSON API's media download, with the
Application Default Credentials Beam uses, over a urllib3 pool with a
connection per concurrent read. The README's Performance section has the
figures.

Every read is checked against the CRC32C that GCS sends in ``x-goog-hash``, and
transient failures (429, 5xx, dropped or timed-out connections, a checksum
mismatch) are retried with exponential back-off and full jitter; the final
failure raises ``StorageError`` naming the object and the reason.
"""
from __future__ import annotations

import base64
import dataclasses
import logging
import os
import random
import threading
import time
import urllib.parse
from typing import Iterator

import urllib3

from beam_prep.errors import StorageError

__all__ = ["GcsReader", "RetryPolicy", "split_gs_path"]

_LOG = logging.getLogger(__name__)

READ_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
DEFAULT_ENDPOINT = "https://storage.googleapis.com"
# Statuses GCS documents as retryable; 401 is retried once after a token refresh.
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_TIMEOUT = urllib3.Timeout(connect=20.0, read=120.0)


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a read is retried after a transient failure.

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


def split_gs_path(path: str) -> tuple[str, str]:
    """``gs://bucket/name`` -> ``("bucket", "name")``."""
    if not path.startswith("gs://"):
        raise ValueError(f"not a gs:// path: {path}")
    bucket, _, name = path[len("gs://"):].partition("/")
    if not bucket or not name:
        raise ValueError(f"not a gs:// object path: {path}")
    return bucket, name


class _Transient(Exception):
    """A failure worth another attempt."""


class GcsReader:
    """Reads whole objects; thread-safe, so one reader serves a worker's read-ahead threads.

    Args:
      connections: connections kept open to GCS: as many as reads run at once.
      retry: the retry policy for transient failures.
      endpoint: the server; ``STORAGE_EMULATOR_HOST`` (as google-cloud-storage
        honours it) or GCS itself by default.
    """

    def __init__(self, connections: int = 10, retry: RetryPolicy = RetryPolicy(),
                 endpoint: str | None = None) -> None:
        endpoint = endpoint or os.environ.get("STORAGE_EMULATOR_HOST") or DEFAULT_ENDPOINT
        if "://" not in endpoint:
            endpoint = "http://" + endpoint
        self._endpoint = endpoint.rstrip("/")
        self._retry = retry
        self._pool = urllib3.PoolManager(num_pools=4, maxsize=max(1, connections), retries=False,
                                         timeout=_TIMEOUT)
        self._credentials = _default_credentials()
        self._auth_lock = threading.Lock()

    def url(self, path: str) -> str:
        bucket, name = split_gs_path(path)
        return (f"{self._endpoint}/download/storage/v1/b/{bucket}/o/"
                f"{urllib.parse.quote(name, safe='')}?alt=media")

    def read(self, path: str) -> bytes:
        """The object's bytes.

        Raises:
          StorageError: the object is missing or forbidden, or every attempt failed.
        """
        url = self.url(path)
        refreshed = False
        delays = self._retry.delays()
        while True:
            try:
                return self._get(path, url)
            except _Unauthorized as e:
                if refreshed:
                    raise StorageError(f"cannot read {path}: {e}") from e
                refreshed = True
                self._refresh()
            except _Transient as e:
                delay = next(delays, None)
                if delay is None:
                    raise StorageError(f"cannot read {path}: {e} "
                                       f"(gave up after {self._retry.attempts} attempts)") from e
                _LOG.debug("retrying %s in %.2f s: %s", path, delay, e)
                time.sleep(delay)

    def _get(self, path: str, url: str) -> bytes:
        try:
            response = self._pool.request("GET", url, headers=self._headers(), decode_content=False)
        except urllib3.exceptions.HTTPError as e:  # reset, refused, timed out, cut short
            raise _Transient(f"{type(e).__name__}: {e}") from e
        status = response.status
        if status == 200:
            data = response.data
            _check_crc32c(response.headers, data)
            return data
        if status == 401:
            raise _Unauthorized(f"HTTP 401 {_reason(response)}")
        if status in TRANSIENT_STATUS:
            raise _Transient(f"HTTP {status} {_reason(response)}")
        if status == 404:
            raise StorageError(f"cannot read {path}: no such object (HTTP 404)")
        if status == 403:
            raise StorageError(f"cannot read {path}: permission denied (HTTP 403); grant the "
                               "credentials in use read access to the bucket")
        raise StorageError(f"cannot read {path}: HTTP {status} {_reason(response)}")

    def _headers(self) -> dict[str, str]:
        if self._credentials is None:
            return {}
        with self._auth_lock:
            if not self._credentials.valid:
                self._refresh_locked()
            return {"Authorization": f"Bearer {self._credentials.token}"}

    def _refresh(self) -> None:
        if self._credentials is not None:
            with self._auth_lock:
                self._refresh_locked()

    def _refresh_locked(self) -> None:
        from google.auth.transport.requests import Request

        self._credentials.refresh(Request())


class _Unauthorized(Exception):
    """401: the token may have expired; refresh it once, then give up."""


def _default_credentials():
    """The Application Default Credentials, or None (anonymous: public buckets) if there are none."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        credentials, _ = google.auth.default(scopes=[READ_SCOPE])
    except DefaultCredentialsError as e:
        _LOG.warning("no Google credentials found (%s); reading gs:// anonymously", e)
        return None
    return credentials


def _reason(response: urllib3.BaseHTTPResponse) -> str:
    text = response.data[:300].decode("utf-8", "replace").strip()
    return f"{response.reason or ''}{': ' + text if text else ''}".strip()


def _check_crc32c(headers, data: bytes) -> None:
    """Compares the body with GCS's CRC32C of the stored object.

    Skipped for objects stored gzip-encoded, which GCS may serve decompressed.
    """
    if headers.get("x-goog-stored-content-encoding", "identity") != "identity":
        return
    for part in headers.get("x-goog-hash", "").split(","):
        algorithm, _, value = part.strip().partition("=")
        if algorithm == "crc32c":
            import google_crc32c

            expected = int.from_bytes(base64.b64decode(value), "big")
            if google_crc32c.value(data) != expected:
                raise _Transient(f"CRC32C mismatch ({len(data)} bytes received)")
            return
