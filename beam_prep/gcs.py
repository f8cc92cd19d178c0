"""GCS for the pipeline's own hot paths: listing a tree, and reading whole objects.

A worker reads every image once, whole, and most are small, so what costs is the
round trips and the client's CPU per request, not bandwidth. So reads are one
plain GET each (the JSON API's media download, with the Application Default
Credentials Beam uses, over a pooled connection), checked against the CRC32C GCS
sends and retried with back-off and jitter; the last failure raises ``GcsError``
naming the object. ``GcsClient.list`` asks only for names and sizes, and lists a
tree's folders concurrently, where Beam's ``match`` pages through the prefix.

A few small writes serve the output folder's claim (``beam_prep.claim``):
``create``, ``stat`` and ``delete`` under generation preconditions, which GCS
applies atomically (``GcsPreconditionFailed`` when one fails). Writes use
read-write credentials of their own, made at the first write; reads keep the
read-only scope. See README *Images in Google Cloud Storage* for the figures.
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

__all__ = ["GcsClient", "GcsError", "GcsPreconditionFailed", "ObjectInfo", "RetryPolicy", "split_gs_path"]

_LOG = logging.getLogger(__name__)

READ_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
WRITE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
DEFAULT_ENDPOINT = "https://storage.googleapis.com"
# Statuses GCS documents as retryable; 401 is retried once after a token refresh.
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_TIMEOUT = urllib3.Timeout(connect=20.0, read=120.0)
LIST_THREADS = 16
_LIST_FIELDS = "items(name,size),prefixes,nextPageToken"
PAGE_SIZE = 1000  # the most GCS returns a page
_STAT_FIELDS = "generation,updated,size"


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
class ObjectInfo:
    """What ``stat`` and ``create`` tell of an object.

    ``generation`` changes with every write of the object (GCS's version
    number, the value preconditions compare); ``updated`` is GCS's RFC 3339
    time of that write.
    """

    generation: int
    updated: str
    size: int


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
    """Reads whole objects, lists trees, and makes small conditional writes (a run's claim).

    Thread-safe, so one client serves a worker's read threads.

    Args:
      connections: connections kept open to GCS: as many as requests run at once.
      retry: the retry policy for transient failures.
      endpoint: the server; ``STORAGE_EMULATOR_HOST`` (as google-cloud-storage
        honours it) or GCS itself by default.
      timeout: how long to wait to connect, and between bytes of an answer;
        a request that times out is retried.
    """

    def __init__(self, connections: int = LIST_THREADS, retry: RetryPolicy = RetryPolicy(),
                 endpoint: str | None = None, timeout: urllib3.Timeout = _TIMEOUT) -> None:
        endpoint = endpoint or os.environ.get("STORAGE_EMULATOR_HOST") or DEFAULT_ENDPOINT
        if "://" not in endpoint:
            endpoint = "http://" + endpoint
        self._retry = retry
        # One host, so one pool, asked with paths: a PoolManager would parse each URL again.
        self._pool = urllib3.connection_from_url(endpoint, maxsize=max(1, connections), retries=False,
                                                 timeout=timeout)
        self._read_auth = _Auth(_default_credentials(READ_SCOPE, "reading"))
        self._write_auth: _Auth | None = None  # made at the first write
        self._write_auth_lock = threading.Lock()

    @staticmethod
    def request_path(path: str, generation: int | None = None) -> str:
        """The JSON API's media download of ``gs://bucket/name``: the object's bytes, no metadata."""
        pinned = f"&generation={generation}" if generation is not None else ""
        return f"/download{_object_url(path)}?alt=media{pinned}"

    def read(self, path: str, generation: int | None = None) -> bytes:
        """The object's bytes, in one request; with ``generation``, that version's or 404.

        Raises:
          GcsError: the object is missing or forbidden, or every attempt failed.
        """
        return self._call(f"read {path}", "GET", self.request_path(path, generation), checked=True)

    def stat(self, path: str) -> ObjectInfo | None:
        """The object's generation, update time and size; None if there is no such object.

        Raises:
          GcsError: the bucket is missing or forbidden, or every attempt failed.
        """
        url = f"{_object_url(path)}?fields={_STAT_FIELDS}"
        try:
            return _object_info(self._call(f"stat {path}", "GET", url))
        except GcsError as e:
            if e.code == 404 and not isinstance(e, GcsPreconditionFailed):
                return None
            raise

    def create(self, path: str, data: bytes, if_generation_match: int | None = 0,
               content_type: str = "application/octet-stream") -> ObjectInfo:
        """Writes ``data`` as the object, only if its generation is ``if_generation_match``.

        0, the default, means only if there is no such object; a generation
        means only if that version is the current one (a compare-and-swap);
        None writes whatever is there. GCS checks and writes atomically.

        A call retried after a failure that may have been applied (a dropped
        connection, a 5xx) can meet its own first write and get 412: then the
        object is read back, and if it holds exactly ``data`` that write is
        taken as this call's. Callers whose racing writers may write the same
        bytes should make the bytes unique (a run id in them).

        Raises:
          GcsPreconditionFailed: the object's generation was not the one asked for.
          GcsError: the bucket is missing or forbidden, or every attempt failed.
        """
        bucket, name = split_gs_path(path)
        query = {"uploadType": "media", "name": name, "fields": _STAT_FIELDS}
        if if_generation_match is not None:
            query["ifGenerationMatch"] = str(if_generation_match)
        url = f"/upload/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}"
        try:
            answer = self._call(f"write {path}", "POST", url, body=data,
                                headers={"Content-Type": content_type})
        except GcsPreconditionFailed as e:
            ours = self._written_by_us(path, data) if e.after_retry else None
            if ours is None:
                raise
            _LOG.debug("write %s: a retried attempt found its first one applied", path)
            return ours
        return _object_info(answer)

    def delete(self, path: str, if_generation_match: int | None = None) -> bool:
        """Deletes the object, only if its generation is ``if_generation_match`` (any, if None).

        Returns False if there was no such object (as a retried delete whose
        first attempt was applied also finds).

        Raises:
          GcsPreconditionFailed: the object's generation was not the one asked for.
          GcsError: the bucket is missing or forbidden, or every attempt failed.
        """
        url = _object_url(path)
        if if_generation_match is not None:
            url += f"?ifGenerationMatch={if_generation_match}"
        try:
            self._call(f"delete {path}", "DELETE", url)
        except GcsError as e:
            if e.code == 404 and not isinstance(e, GcsPreconditionFailed):
                return False
            raise
        return True

    def read_current(self, path: str) -> tuple[ObjectInfo, bytes] | None:
        """The object's info and the bytes of that very version; None if there is none.

        A version replaced or removed between the two requests counts as none.
        """
        info = self.stat(path)
        if info is None:
            return None
        try:
            return info, self.read(path, generation=info.generation)
        except GcsError as e:
            if e.code == 404:
                return None
            raise

    def _written_by_us(self, path: str, data: bytes) -> ObjectInfo | None:
        """The object's info if it now holds exactly ``data``, else None."""
        current = self.read_current(path)
        return current[0] if current is not None and current[1] == data else None

    def list(self, root: str, threads: int = LIST_THREADS) -> list[tuple[str, int]]:
        """Every object under the folder ``root`` as ``(gs:// path, size)``; see ``iter_list``."""
        return list(self.iter_list(root, threads))

    def iter_list(self, root: str, threads: int = LIST_THREADS) -> Iterator[tuple[str, int]]:
        """Every object under the folder ``root`` (``gs://bucket/prefix``) as ``(gs:// path, size)``,
        a folder at a time, so that a caller that streams them holds no whole listing.

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
            yield from ((f"gs://{bucket}/{name}", size) for name, size in found)
            for objects, _ in pool.map(lambda f: self._list_pages(bucket, f, None), folders):
                yield from ((f"gs://{bucket}/{name}", size) for name, size in objects)

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
            page = json.loads(self._call(f"list gs://{bucket}/{prefix}", "GET", url))
            objects += [(item["name"], int(item["size"])) for item in page.get("items", ())]
            folders += page.get("prefixes", ())
            if not page.get("nextPageToken"):
                return objects, folders
            query["pageToken"] = page["nextPageToken"]

    def _call(self, what: str, method: str, url: str, body: bytes | None = None,
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
            response = self._pool.urlopen(method, url, body=body, headers=headers, decode_content=False)
        except urllib3.exceptions.HTTPError as e:  # reset, refused, timed out, cut short
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


def _object_url(path: str) -> str:
    """The JSON API's metadata path of ``gs://bucket/name``."""
    bucket, name = split_gs_path(path)
    return f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}"


def _object_info(answer: bytes) -> ObjectInfo:
    resource = json.loads(answer)
    return ObjectInfo(int(resource["generation"]), resource["updated"], int(resource.get("size", 0)))


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
