"""What one small gs:// read costs the client, by client: the figures behind ``beam_prep/io/gcs.py``.

Loads ``--objects`` random 55 KB objects (the benchmark corpus's mean JPEG size)
into the test GCS server (``tests/gcs_harness/server.py``) and reads each once, one
thread, in a fresh process per client:

  (a) Beam's ``FileSystems.open(path).read()``, what beam-prep used before;
  (b) google-cloud-storage's ``Blob.download_as_bytes()``;
  (c) beam-prep's ``GcsClient.read``.

It reports, per object, the wall time, the client's CPU, the requests the
gateway saw, and the emulator's CPU.

    python -m benchmarks.bench_gcs_read [--objects 500] [--json out.json]
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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=500)
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    recording = Recording("gcs-read", argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    rows = []
    with scratch_server("gcs-read-") as (server, _):
        bucket = server.new_bucket()
        urls = [bucket.write_bytes(f"images/{i}.jpg", os.urandom(OBJECT_BYTES)) for i in range(args.objects)]
        for name, code in _READS.items():
            run = run_child(server, code + _TIMER.format(size=OBJECT_BYTES), urls)
            row = {"client": name, **run.report, "requests": run.requests / args.objects,
                   "emulator_cpu_ms": run.emulator_cpu_s / args.objects * 1e3}
            log.info("%s", row)
            rows.append(row)
    print()
    print(f"One thread reading {args.objects} objects of {OBJECT_BYTES // 1000} KB from the test GCS server, "
          "per object:")
    print()
    results = {"objects": args.objects, "object_bytes": OBJECT_BYTES, "rows": rows}
    print(tables.gcs_read(results))
    recording.write(args.json, results)


if __name__ == "__main__":
    main()
