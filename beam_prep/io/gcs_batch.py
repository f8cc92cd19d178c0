"""gs:// reads without a thread per request: one asyncio loop thread drives a worker's reads in flight.

A writer worker keeps 32 reads in flight; on a thread each, their wake-ups and
GIL hand-offs cost the worker more CPU than one thread that sends every request
and parses every answer (``benchmarks/bench_gcs_clients.py``, the writer's
performance page). ``BatchedReads`` is that thread: each read is one GET of the
JSON API's media download, as ``GcsClient.read`` sends it, over connections kept
open, with the same credentials, its answer checked against GCS's CRC32C.

Only the plain answer is taken here: a 200 with a Content-Length whose CRC32C
matches. Anything else (an error status, a dropped or timed-out connection, a
checksum mismatch, a chunked answer) is handed whole to the caller's fallback,
``GcsClient.read`` on a thread, which retries and reports exactly as a read
without this loop does: the loop's attempt is one request more before it.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable

from beam_prep.io.gcs import GcsClient
from beam_prep.io.gcs_transport import crc32c_matches

__all__ = ["BatchedReads"]

_LOG = logging.getLogger(__name__)


class _NotPlain(Exception):
    """An answer the loop does not take: the fallback reads the object."""


class BatchedReads:
    """Reads gs:// objects on one event-loop thread; ``submit`` returns a future of the bytes.

    Args:
      client: the client whose endpoint, credentials and timeouts the reads use.
      fallback: path -> bytes, run on ``executor`` for a read the loop does not
        take; what it raises is what the future raises.
      connections: the most requests in flight, each on a connection kept open.
    """

    def __init__(self, client: GcsClient, fallback: Callable[[str], bytes], connections: int) -> None:
        self._client = client
        self._endpoint = client.endpoint()
        self._fallback = fallback
        self._most = max(1, connections)
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._slots = asyncio.Semaphore(self._most)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="beam-prep-gcs-reads", daemon=True)
        self._thread.start()

    def submit(self, path: str, executor: concurrent.futures.Executor) -> concurrent.futures.Future[bytes]:
        """Starts reading ``path``; a read the loop does not take runs ``fallback`` on ``executor``."""
        return asyncio.run_coroutine_threadsafe(self._read(path, executor), self._loop)

    def close(self) -> None:
        """Closes the connections and ends the loop's thread; reads still in flight are cancelled."""
        if self._loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _read(self, path: str, executor: concurrent.futures.Executor) -> bytes:
        try:
            async with self._slots:
                return await self._plain_read(path)
        except Exception as e:  # noqa: BLE001 - an error status, a dropped connection, a token: the fallback reads it
            _LOG.debug("read %s: %s; reading it again on a thread", path, e)
        return await self._loop.run_in_executor(executor, self._fallback, path)

    async def _plain_read(self, path: str) -> bytes:
        endpoint = self._endpoint
        reader, writer = await self._connection()
        kept = False
        try:
            headers = "".join(f"{k}: {v}\r\n" for k, v in self._client.read_headers().items())
            writer.write(f"GET {endpoint.prefix}{self._client.request_path(path)} HTTP/1.1\r\n"
                         f"Host: {endpoint.host_header}\r\n{headers}\r\n".encode("latin-1"))
            # The whole answer within the read timeout (a slower one is read again on a thread, whose
            # timeout is between bytes); ``asyncio.timeout`` starts no task, as ``wait_for`` does.
            async with asyncio.timeout(endpoint.timeout.read):
                head = await reader.readuntil(b"\r\n\r\n")
                status, answer = _parse_head(head)
                if status != 200 or "content-length" not in answer or "transfer-encoding" in answer:
                    raise _NotPlain(f"HTTP {status}")
                data = await reader.readexactly(int(answer["content-length"]))
            if not crc32c_matches(answer, data):
                raise _NotPlain(f"CRC32C mismatch ({len(data)} bytes received)")
            kept = answer.get("connection", "").lower() != "close"
            return data
        finally:
            if kept:
                self._idle.append((reader, writer))
            else:
                writer.close()

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """An idle connection the server has not closed, or a new one."""
        while self._idle:
            reader, writer = self._idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        endpoint = self._endpoint
        async with asyncio.timeout(endpoint.timeout.connect):
            return await asyncio.open_connection(endpoint.host, endpoint.port, ssl=endpoint.ssl_context,
                                                 server_hostname=endpoint.host if endpoint.ssl_context else None)

    async def _shutdown(self) -> None:
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """The status and the headers (by lower-case name, repeated ones joined with commas) of an answer."""
    lines = head.decode("latin-1").split("\r\n")
    version, status, _ = (lines[0].split(" ", 2) + [""])[:3]
    if not version.startswith("HTTP/1.1"):
        raise _NotPlain(f"not HTTP/1.1: {lines[0]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise _NotPlain(f"a header line without a colon: {line!r}")
        name, value = name.strip().lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return int(status), headers
