"""What one small gs:// read costs the client, by client: the figures behind ``beam_prep/io/gcs.py``.

Loads ``--objects`` random 55 KB objects (the benchmark corpus's mean JPEG size)
into the test GCS server (``tests/gcs_harness/server.py``) and reads each once, one
thread, in a fresh process per client:

  (a) Beam's ``FileSystems.open(path).read()``, what beam-prep used before;
  (b) google-cloud-storage's ``Blob.download_as_bytes()``;
  (c) beam-prep's ``GcsClient.read``.

It reports, per object, the wall time, the client's CPU, the requests the
gateway saw, and the emulator's CPU.

With ``--shards N``, two more rows read the same objects as a worker of the
streaming sink does, through ``readahead.ReadAhead`` with ``--read_concurrency``
reads ahead and ``--latency_ms`` added to every request, the objects dealt into
N shards read one after the other: (d) with a window drained at each shard's
end (the sink before its window crossed shard ends), (e) with one window
across the shards (the sink now).

    python -m benchmarks.bench_gcs_read [--objects 500] [--shards 16 [--read_concurrency 32] [--latency_ms 30]]
        [--json out.json]
"""
from __future__ import annotations

import argparse
import logging
import os
import pathlib
from collections.abc import Sequence

from benchmarks.gcs_server import run_child, scratch_server
from benchmarks.report import tables
from benchmarks.results import Recording

log = logging.getLogger(__name__)
OBJECT_BYTES = 55_000

_READS = {
    "(a) Beam FileSystems.open": (
        "from apache_beam.io.filesystems import FileSystems\n"
        "def read(url):\n"
        "    with FileSystems.open(url) as f:\n"
        "        return f.read()\n"),
    "(b) google-cloud-storage download_as_bytes": (
        "import google.auth\n"
        "from google.cloud import storage\n"
        "credentials, project = google.auth.default()  # as Beam builds its client\n"
        "client = storage.Client(project=project, credentials=credentials)\n"
        "def read(url):\n"
        "    bucket, name = url[5:].split('/', 1)\n"
        "    return client.bucket(bucket).blob(name).download_as_bytes()\n"),
    "(c) beam-prep GcsClient.read": (
        "from beam_prep.io.gcs import GcsClient\n"
        "read = GcsClient(connections=1).read\n"),
}
_TIMER = """
import json, sys, time
urls = sys.argv[1:]
assert len(read(urls[0])) == {size}  # warm: imports, credentials, connection
wall, cpu = time.perf_counter(), time.process_time()
for url in urls[1:]:
    assert len(read(url)) == {size}
print(json.dumps({{"wall_ms": (time.perf_counter() - wall) / (len(urls) - 1) * 1e3,
                  "cpu_ms": (time.process_time() - cpu) / (len(urls) - 1) * 1e3}}))
"""

# A worker's reads through the read-ahead window, shard after shard: {drained} says whether the
# window drains at each shard's end.
_WINDOWED = """
import json, sys, time
from beam_prep.write.images.examples import FileReader
from beam_prep.write.images.readahead import ReadAhead, ReadAheadConfig, thread_pool
config = ReadAheadConfig(concurrency={concurrency})
read = FileReader(connections={concurrency})
pool = thread_pool(config)
urls = sys.argv[1:]
assert len(read(urls[0])) == {size}  # warm: imports, credentials, connection
shards = [urls[1:][i::{shards}] for i in range({shards})]
wall, cpu = time.perf_counter(), time.process_time()
window = ReadAhead(read, config, pool)
def taken(fetched):
    for f in fetched:
        assert len(f.data) == {size}
for shard in shards:
    for url in shard:
        taken(window.push(url, url, {size}))
    if {drained}:
        taken(window.drain())
taken(window.drain())
print(json.dumps({{"wall_ms": (time.perf_counter() - wall) / (len(urls) - 1) * 1e3,
                  "cpu_ms": (time.process_time() - cpu) / (len(urls) - 1) * 1e3}}))
"""


def _windowed_clients(args: argparse.Namespace) -> dict[str, tuple[str, float]]:
    """The ``--shards`` rows: name -> (child code, added latency in ms)."""
    if not args.shards:
        return {}
    ahead = f"{args.read_concurrency} ahead, {args.shards} shards, {args.latency_ms:g} ms"
    return {f"(d) ReadAhead, drained at each shard's end ({ahead})": (
                _WINDOWED.format(concurrency=args.read_concurrency, size=OBJECT_BYTES, shards=args.shards,
                                 drained=True), args.latency_ms),
            f"(e) ReadAhead, one window across shards ({ahead})": (
                _WINDOWED.format(concurrency=args.read_concurrency, size=OBJECT_BYTES, shards=args.shards,
                                 drained=False), args.latency_ms)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=500)
    parser.add_argument("--shards", type=int, default=0,
                        help="also read through the read-ahead window over this many shards (rows d, e)")
    parser.add_argument("--read_concurrency", type=int, default=32, help="reads ahead in rows d and e")
    parser.add_argument("--latency_ms", type=float, default=30.0, help="added to every request in rows d and e")
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    recording = Recording("gcs-read", argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    rows = []
    with scratch_server("gcs-read-") as (server, _):
        bucket = server.new_bucket()
        urls = [bucket.write_bytes(f"images/{i}.jpg", os.urandom(OBJECT_BYTES)) for i in range(args.objects)]
        clients = {name: (code + _TIMER.format(size=OBJECT_BYTES), 0.0) for name, code in _READS.items()}
        for name, (code, latency_ms) in {**clients, **_windowed_clients(args)}.items():
            run = run_child(server, code, urls, latency_ms)
            row = {"client": name, **run.report, "requests": run.requests / args.objects,
                   "emulator_cpu_ms": run.emulator_cpu_s / args.objects * 1e3}
            log.info("%s", row)
            rows.append(row)
    print()
    print(f"One thread reading {args.objects} objects of {OBJECT_BYTES // 1000} KB from the test GCS server, "
          "per object:")
    print()
    results = {"objects": args.objects, "object_bytes": OBJECT_BYTES, "rows": rows}
    if args.shards:
        results.update(shards=args.shards, read_concurrency=args.read_concurrency, latency_ms=args.latency_ms)
    print(tables.gcs_read(results))
    recording.write(args.json, results)


if __name__ == "__main__":
    main()
