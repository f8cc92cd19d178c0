"""The test GCS server for the benchmarks' gs:// modes, and timing a child process against it.

The server (gcp-storage-emulator behind the gateway every client goes through)
is the tests' fixture, ``tests/gcs_harness/server.py``; the benchmarks start the same
one, so what they measure is what the tests check.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence

import psutil

from benchmarks import CACHE_DIR, REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tests"))
from gcs_harness.server import GcsServer, running_gcs_server

__all__ = ["UPLOAD_THREADS", "ChildRun", "GcsServer", "run_child", "scratch_server"]

# The emulator serves one request at a time with a listen backlog of five:
# more uploaders than that time out connecting.
UPLOAD_THREADS = 3


@dataclasses.dataclass(frozen=True)
class ChildRun:
    report: dict  # the JSON object the child printed last
    requests: int  # requests the gateway saw meanwhile
    emulator_cpu_s: float
    server_cpu_s: float  # the emulator's and the gateway's (threads of this process)
    seconds: float


@contextlib.contextmanager
def scratch_server(prefix: str) -> Iterator[tuple[GcsServer, pathlib.Path]]:
    """The server, and a scratch folder under the benchmarks' cache that it and the caller
    may write to; both go at the end of the block."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir=CACHE_DIR))
    try:
        with running_gcs_server(workdir) as server:
            yield server, workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def emulator_cpu_s(server: GcsServer) -> float:
    return sum(psutil.Process(server.emulator.pid).cpu_times()[:2])


def run_child(server: GcsServer, code: str, args: Sequence[str], latency_ms: float = 0) -> ChildRun:
    """Runs ``python -c code ARGS`` against the server with ``latency_ms`` added to every request."""
    server.gateway.set_latency(latency_ms / 1e3)
    here = psutil.Process()
    seen, cpu, start = len(server.gateway.seen()), emulator_cpu_s(server), time.perf_counter()
    gateway_cpu = sum(here.cpu_times()[:2])
    try:
        done = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO_ROOT,
                              env=server.subprocess_env({"TF_CPP_MIN_LOG_LEVEL": "2"}),
                              capture_output=True, text=True)
    finally:
        server.gateway.set_latency(0.0)
    if done.returncode != 0:
        raise RuntimeError(f"child exited with {done.returncode}:\n{done.stderr[-3000:]}")
    emulator = emulator_cpu_s(server) - cpu
    return ChildRun(json.loads(done.stdout.strip().splitlines()[-1]), len(server.gateway.seen()) - seen,
                    emulator, emulator + sum(here.cpu_times()[:2]) - gateway_cpu, time.perf_counter() - start)
