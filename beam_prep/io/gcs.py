"""GCS for the pipeline's own hot paths: listing a tree, and reading whole objects.

A worker reads every image once, whole, and most are small, so what costs is the
round trips and the client's CPU per request, not bandwidth. So reads are one
plain GET each (the JSON API's media download, with the Application Default
Credentials Beam uses, over a pooled connection), checked against the CRC32C GCS
sends and retried with back-off and jitter; the last failure raises ``GcsError``
naming the object. ``GcsClient.list`` asks only for names, sizes and generations, and lists a
tree's folders concurrently, where Beam's ``match`` pages through the prefix.

A few small writes serve the output folder's claim (``beam_prep.write.run.claim``); every request goes through ``gcs_transport``:
``create``, ``stat`` and ``delete`` under generation preconditions, which GCS
applies atomically (``GcsPreconditionFailed`` when one fails). Writes use
read-write credentials of their own, made at the first write; reads keep the
read-only scope. See docs/guides/gcs-dataflow.md for the figures.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import urllib.parse
from collections.abc import Iterator

from beam_prep.io.gcs_transport import (
    DEFAULT_TIMEOUT,
    Endpoint,
    GcsError,
    GcsPreconditionFailed,
    RetryPolicy,
    Timeout,
    Transport,
)

__all__ = ["GcsClient", "GcsError", "GcsPreconditionFailed", "ObjectInfo", "RetryPolicy", "split_gs_path"]

_LOG = logging.getLogger(__name__)

LIST_THREADS = 16
_LIST_FIELDS = "items(name,size,generation),prefixes,nextPageToken"
PAGE_SIZE = 1000  # the most GCS returns a page
_STAT_FIELDS = "generation,updated,size"


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


def split_gs_path(path: str, object_optional: bool = False) -> tuple[str, str]:
    """``gs://bucket/name`` -> ``("bucket", "name")``."""
    if not path.startswith("gs://"):
        raise ValueError(f"not a gs:// path: {path}")
    bucket, _, name = path[len("gs://"):].partition("/")
    if not bucket or not (name or object_optional):
        raise ValueError(f"not a gs:// object path: {path}")
    return bucket, name


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
                 endpoint: str | None = None, timeout: Timeout = DEFAULT_TIMEOUT) -> None:
        self._transport = Transport(connections, retry, endpoint, timeout)

    def endpoint(self) -> Endpoint:
        """Where the requests go (for ``gcs_batch``, which reads over connections of its own)."""
        return self._transport.endpoint()

    def read_headers(self) -> dict[str, str]:
        """The headers that authorise a read, as ``read`` sends them."""
        return self._transport.read_headers()

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
        return self._transport.call(f"read {path}", "GET", self.request_path(path, generation), checked=True)

    def stat(self, path: str) -> ObjectInfo | None:
        """The object's generation, update time and size; None if there is no such object.

        Raises:
          GcsError: the bucket is missing or forbidden, or every attempt failed.
        """
        url = f"{_object_url(path)}?fields={_STAT_FIELDS}"
        try:
            return _object_info(self._transport.call(f"stat {path}", "GET", url))
        except GcsError as e:
            if e.code == 404 and not isinstance(e, GcsPreconditionFailed):
                return None
            raise

    def bucket_exists(self, bucket: str) -> bool:
        """Whether ``gs://bucket`` exists (what a 404 for an object in it cannot tell).

        Raises:
          GcsError: the bucket is forbidden, or every attempt failed.
        """
        name = bucket.removeprefix("gs://")
        try:
            self._transport.call(f"stat gs://{name}", "GET", f"/storage/v1/b/{urllib.parse.quote(name, safe='')}"
                                 "?fields=name")
        except GcsError as e:
            if e.code == 404 and not isinstance(e, GcsPreconditionFailed):
                return False
            raise
        return True

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
            answer = self._transport.call(f"write {path}", "POST", url, body=data,
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
            self._transport.call(f"delete {path}", "DELETE", url)
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
        """Every object under the folder ``root`` as ``(gs:// path, size)``; see ``iter_objects``."""
        return ((path, size) for path, size, _ in self.iter_objects(root, threads))

    def iter_objects(self, root: str, threads: int = LIST_THREADS) -> Iterator[tuple[str, int, int]]:
        """Every object under the folder ``root`` (``gs://bucket/prefix``) as ``(gs:// path, size,
        generation)``, a folder at a time, so that a caller that streams them holds no whole listing.

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
            yield from ((f"gs://{bucket}/{name}", size, generation) for name, size, generation in found)
            for objects, _ in pool.map(lambda f: self._list_pages(bucket, f, None), folders):
                yield from ((f"gs://{bucket}/{name}", size, generation) for name, size, generation in objects)

    def _list_pages(self, bucket: str, prefix: str,
                    delimiter: str | None) -> tuple[list[tuple[str, int, int]], list[str]]:
        """Objects (name, size, generation) and (with a delimiter) sub-folders directly under ``prefix``, every page."""
        objects: list[tuple[str, int, int]] = []
        folders: list[str] = []
        query = {"prefix": prefix, "fields": _LIST_FIELDS, "maxResults": str(PAGE_SIZE)}
        if delimiter:
            query["delimiter"] = delimiter
        while True:
            url = f"/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}"
            page = json.loads(self._transport.call(f"list gs://{bucket}/{prefix}", "GET", url))
            objects += [(item["name"], int(item["size"]), int(item.get("generation", 0)))
                        for item in page.get("items", ())]
            folders += page.get("prefixes", ())
            if not page.get("nextPageToken"):
                return objects, folders
            query["pageToken"] = page["nextPageToken"]

def _object_url(path: str) -> str:
    """The JSON API's metadata path of ``gs://bucket/name``."""
    bucket, name = split_gs_path(path)
    return f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}"


def _object_info(answer: bytes) -> ObjectInfo:
    resource = json.loads(answer)
    return ObjectInfo(int(resource["generation"]), resource["updated"], int(resource.get("size", 0)))
