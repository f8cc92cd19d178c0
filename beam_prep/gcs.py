"""GCS for the pipeline's own hot paths: listing a tree, and reading whole objects.

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
failure raises ``GcsError`` naming the object and the reason.

Listing goes the same way. GCS returns at most 1,000 names a page, one page
after another, so a serial listing of a large bucket (Beam's ``match``) waits
a round trip per thousand objects and parses every object's full metadata.
``GcsClient.list`` asks only for names and sizes, finds the tree's folders
with one delimited listing and lists them concurrently.
"""
from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import json
import logging
import os
import random
import threading
import time
import urllib.parse
from typing import Iterator

import urllib3

from beam_prep.errors import StorageError

__all__ = ["GcsClient", "GcsError", "RetryPolicy", "split_gs_path"]

_LOG = logging.getLogger(__name__)

READ_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
DEFAULT_ENDPOINT = "https://storage.googleapis.com"
# Statuses GCS documents as retryable; 401 is retried once after a token refresh.
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_TIMEOUT = urllib3.Timeout(connect=20.0, read=120.0)
LIST_THREADS = 16
_LIST_FIELDS = "items(name,size),prefixes,nextPageToken"
PAGE_SIZE = 1000  # the most GCS returns a page


class GcsError(StorageError):
    """A GCS request that failed for good; ``code`` is its HTTP status, if it got one."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


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


def split_gs_path(path: str, object_optional: bool = False) -> tuple[str, str]:
    """``gs://bucket/name`` -> ``("bucket", "name")``."""
    if not path.startswith("gs://"):
        raise ValueError(f"not a gs:// path: {path}")
    bucket, _, name = path[len("gs://"):].partition("/")
    if not bucket or not (name or object_optional):
        raise ValueError(f"not a gs:// object path: {path}")
    return bucket, name


class _Transient(Exception):
    """A failure worth another attempt."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class GcsClient:
    """Reads whole objects and lists trees; thread-safe, so one client serves a worker's read threads.

    Args:
      connections: connections kept open to GCS: as many as requests run at once.
      retry: the retry policy for transient failures.
      endpoint: the server; ``STORAGE_EMULATOR_HOST`` (as google-cloud-storage
        honours it) or GCS itself by default.
    """

    def __init__(self, connections: int = LIST_THREADS, retry: RetryPolicy = RetryPolicy(),
                 endpoint: str | None = None) -> None:
        endpoint = endpoint or os.environ.get("STORAGE_EMULATOR_HOST") or DEFAULT_ENDPOINT
        if "://" not in endpoint:
            endpoint = "http://" + endpoint
        self._retry = retry
        # One host, so one pool, asked with paths: a PoolManager would parse each URL again.
        self._pool = urllib3.connection_from_url(endpoint, maxsize=max(1, connections), retries=False,
                                                 timeout=_TIMEOUT)
        self._credentials = _default_credentials()
        self._auth_lock = threading.Lock()

    @staticmethod
    def request_path(path: str) -> str:
        """The JSON API's media download of ``gs://bucket/name``: the object's bytes, no metadata."""
        bucket, name = split_gs_path(path)
        return f"/download/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media"

    def read(self, path: str) -> bytes:
        """The object's bytes, in one request.

        Raises:
          GcsError: the object is missing or forbidden, or every attempt failed.
        """
        return self._get(f"read {path}", self.request_path(path), checked=True)

    def list(self, root: str, threads: int = LIST_THREADS) -> list[tuple[str, int]]:
        """Every object under the folder ``root`` (``gs://bucket/prefix``) as ``(gs:// path, size)``.

        One delimited listing finds the folders (one level further down where
        there are fewer than ``threads``, as in a ``train/``, ``validation/``
        tree); each folder is then listed whole, ``threads`` at a time.

        Raises:
          GcsError: the bucket is missing or forbidden, or a page failed for good.
        """
        bucket, prefix = split_gs_path(root.rstrip("/") + "/", object_optional=True)
        prefix = prefix.lstrip("/")
        found, folders = self._list_pages(bucket, prefix, "/")
        with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="beam-prep-list") as pool:
            if 0 < len(folders) < threads:
                deeper = []
                for objects, subfolders in pool.map(lambda f: self._list_pages(bucket, f, "/"), folders):
                    found += objects
                    deeper += subfolders
                folders = deeper
            for objects, _ in pool.map(lambda f: self._list_pages(bucket, f, None), folders):
                found += objects
        return [(f"gs://{bucket}/{name}", size) for name, size in found]

    def _list_pages(self, bucket: str, prefix: str,
                    delimiter: str | None) -> tuple[list[tuple[str, int]], list[str]]:
        """Objects and (with a delimiter) sub-folders directly under ``prefix``, every page."""
        objects: list[tuple[str, int]] = []
        folders: list[str] = []
        query = {"prefix": prefix, "fields": _LIST_FIELDS, "maxResults": str(PAGE_SIZE)}
        if delimiter:
            query["delimiter"] = delimiter
        while True:
            url = f"/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}"
            page = json.loads(self._get(f"list gs://{bucket}/{prefix}", url, checked=False))
            objects += [(item["name"], int(item["size"])) for item in page.get("items", ())]
            folders += page.get("prefixes", ())
            if not page.get("nextPageToken"):
                return objects, folders
            query["pageToken"] = page["nextPageToken"]

    def _get(self, what: str, url: str, checked: bool) -> bytes:
        refreshed = False
        delays = self._retry.delays()
        while True:
            try:
                return self._attempt(what, url, checked)
            except _Unauthorized as e:
                if refreshed:
                    raise GcsError(f"cannot {what}: {e}", 401) from e
                refreshed = True
                self._refresh()
            except _Transient as e:
                delay = next(delays, None)
                if delay is None:
                    raise GcsError(f"cannot {what}: {e} (gave up after {self._retry.attempts} attempts)",
                                   e.code) from e
                _LOG.debug("retrying %s in %.2f s: %s", what, delay, e)
                time.sleep(delay)

    def _attempt(self, what: str, url: str, checked: bool) -> bytes:
        try:
            response = self._pool.urlopen("GET", url, headers=self._headers(), decode_content=False)
        except urllib3.exceptions.HTTPError as e:  # reset, refused, timed out, cut short
            raise _Transient(f"{type(e).__name__}: {e}") from e
        status = response.status
        if status == 200:
            data = response.data
            if checked:
                _check_crc32c(response.headers, data)
            return data
        if status == 401:
            raise _Unauthorized(f"HTTP 401 {_reason(response)}")
        if status in TRANSIENT_STATUS:
            raise _Transient(f"HTTP {status} {_reason(response)}", status)
        if status == 404:
            raise GcsError(f"cannot {what}: not found (HTTP 404)", 404)
        if status == 403:
            raise GcsError(f"cannot {what}: permission denied (HTTP 403); grant the credentials in "
                           "use access to the bucket", 403)
        raise GcsError(f"cannot {what}: HTTP {status} {_reason(response)}", status)

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
