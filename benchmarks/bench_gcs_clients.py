"""CPU per object of many small gs:// reads at once in one process, by client: is there a cheaper one than ours?

Loads ``--objects`` random objects of 10-200 KB into the test GCS server
(``tests/gcs_harness/server.py``) and reads them all, ``--concurrency`` at once
and in order, as a writer worker's read-ahead does, in a fresh process per
client:

  (a) beam-prep's ``GcsClient.read`` on a thread pool (the writer before
      ``gcs_batch``);
  (b) obstore's ``get`` (Rust, the XML API) on the same thread pool;
  (c) obstore's ``get_async`` on one asyncio loop in one thread, handed to the
      caller as futures (``run_coroutine_threadsafe``): no thread per request;
  (d) the same without the hand-off: ``asyncio.gather`` of them all, the
      floor of (c);
  (e) a sketch of a batched client of our own: plain HTTP/1.1 on asyncio
      streams, a pool of kept-alive connections, one loop thread, as (c); it
      checks the CRC32C as (a) does, but has no retries or token refresh (it
      only opens a new connection once where a kept-alive one was closed);
  (f) (e) made whole, ``beam_prep.io.gcs_batch`` through ``FileReader.submit``:
      how the writer reads gs:// now.

The clients run one after the other in ``--rounds`` rounds, in a new order
each round; each row's ratios are against (a) in the same round, so a busy
machine moves both sides. CPU is the client process's own (user and system, ``getrusage``,
over the reads, after a warm-up), not the server's, which runs on the same
cores; every object's SHA-256 is checked after the timed reads.

    python -m benchmarks.bench_gcs_clients [--objects 2000] [--concurrency 32] [--rounds 5]
        [--latencies 0 30] [--clients 0abcde] [--tls] [--json out.json]

With ``--tls``, (a) and (e) speak TLS to the server (through its tunnel for
www.googleapis.com, as to GCS itself), which asyncio does in Python.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import itertools
import logging
import pathlib
import random
import statistics
from collections.abc import Sequence

from benchmarks.gcs_server import UPLOAD_THREADS, run_child, scratch_server
from benchmarks.report import tables
from benchmarks.results import Recording

log = logging.getLogger(__name__)
MIN_BYTES, MAX_BYTES = 10_000, 200_000

# Each client's setup: defines read(url) -> bytes (threaded), or aread(url) (asyncio).
_OURS = """
import http.client, os, types, urllib.parse
from beam_prep.io import gcs_transport
from beam_prep.io.gcs import GcsClient
endpoint = None
if USE_TLS:  # to the gateway's TLS tunnel for www.googleapis.com, trusting the test CA
    proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
    def tunnelled(host, port=None, **kwargs):
        connection = http.client.HTTPSConnection(proxy.hostname, proxy.port, **kwargs)
        connection.set_tunnel(host, port or 443)
        return connection
    gcs_transport.http = types.SimpleNamespace(client=types.SimpleNamespace(
        HTTPSConnection=tunnelled, HTTPConnection=http.client.HTTPConnection,
        HTTPException=http.client.HTTPException))
    os.environ["SSL_CERT_FILE"] = os.environ["CURL_CA_BUNDLE"]
    endpoint = "https://www.googleapis.com"
read = GcsClient(connections=CONCURRENCY, endpoint=endpoint).read
"""
_OBSTORE = """
import datetime, os
import google.auth
import obstore
from obstore.store import GCSStore
credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/devstorage.read_only"])
def token():
    return {"token": credentials.token,
            "expires_at": credentials.expiry.replace(tzinfo=datetime.timezone.utc)}
stores = {}
def store(bucket):
    if bucket not in stores:
        stores[bucket] = GCSStore(bucket, config={"base_url": os.environ["STORAGE_EMULATOR_HOST"]},
                                  client_options={"allow_http": True}, credential_provider=token)
    return stores[bucket]
def read(url):
    bucket, name = url[5:].split("/", 1)
    return obstore.get(store(bucket), name).bytes().to_bytes()
async def aread(url):
    bucket, name = url[5:].split("/", 1)
    return (await (await obstore.get_async(store(bucket), name)).bytes_async()).to_bytes()
"""
_OWN_ASYNC = """
import asyncio, base64, os, ssl, urllib.parse
import google.auth, google_crc32c
credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/devstorage.read_only"])
endpoint = urllib.parse.urlsplit(os.environ["STORAGE_EMULATOR_HOST"])
host = "www.googleapis.com" if USE_TLS else endpoint.netloc
idle = []
async def connect():
    if not USE_TLS:
        return await asyncio.open_connection(endpoint.hostname, endpoint.port)
    proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])  # the gateway's TLS tunnel, as (a)'s
    reader, writer = await asyncio.open_connection(proxy.hostname, proxy.port)
    writer.write(f"CONNECT {host}:443 HTTP/1.1\\r\\nHost: {host}:443\\r\\n\\r\\n".encode())
    await reader.readuntil(b"\\r\\n\\r\\n")
    await writer.start_tls(ssl.create_default_context(cafile=os.environ["CURL_CA_BUNDLE"]), server_hostname=host)
    return reader, writer
async def aread(url, fresh=False):
    bucket, name = url[5:].split("/", 1)
    target = f"/download/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media"
    if idle and not fresh:
        reader, writer = idle.pop()
    else:
        reader, writer = await connect()
    try:
        return await exchange(reader, writer, target)
    except (ConnectionError, asyncio.IncompleteReadError):  # a kept-alive connection the server closed
        writer.close()
        if fresh:
            raise
        return await aread(url, fresh=True)
async def exchange(reader, writer, target):
    writer.write(f"GET {target} HTTP/1.1\\r\\nHost: {host}\\r\\n"
                 f"Authorization: Bearer {credentials.token}\\r\\n\\r\\n".encode())
    head = await reader.readuntil(b"\\r\\n\\r\\n")
    status = int(head.split(b" ", 2)[1])
    headers = dict(line.split(b":", 1) for line in head.split(b"\\r\\n")[1:-2])
    headers = {k.strip().lower(): v.strip() for k, v in headers.items()}
    data = await reader.readexactly(int(headers[b"content-length"]))
    assert status == 200, status
    crc32c = next(v[7:] for v in headers[b"x-goog-hash"].split(b",") if v.strip().startswith(b"crc32c="))
    assert google_crc32c.value(data) == int.from_bytes(base64.b64decode(crc32c), "big")  # as ours checks
    idle.append((reader, writer))
    return data
"""

# beam-prep's reads as the writer starts them now: FileReader.submit, gs:// on one loop thread (gcs_batch).
_BATCHED = """
import collections, concurrent.futures, hashlib, json, os, sys, time
from beam_prep.write.images.examples import FileReader
urls = sys.argv[1:]
reader = FileReader(connections=CONCURRENCY)
pool = concurrent.futures.ThreadPoolExecutor(CONCURRENCY)  # for reads the loop hands back: none here
def fetch(url):
    return reader.submit(url, pool)
[f.result() for f in [fetch(u) for u in urls[:CONCURRENCY]]]  # warm
"""

# How a client's reads start: fetch(url) -> a future of its bytes. Then _WINDOW times them,
# CONCURRENCY in flight, results taken in order.
_THREADED = """
import collections, concurrent.futures, hashlib, json, os, sys, time
urls = sys.argv[1:]
pool = concurrent.futures.ThreadPoolExecutor(CONCURRENCY)
list(pool.map(read, urls[:CONCURRENCY]))  # warm: imports, credentials, connections
def fetch(url):
    return pool.submit(read, url)
"""
_BRIDGED = """
import asyncio, collections, hashlib, json, os, sys, threading, time
urls = sys.argv[1:]
loop = asyncio.new_event_loop()
threading.Thread(target=loop.run_forever, daemon=True).start()
async def warm():
    return await asyncio.gather(*(aread(u) for u in urls[:CONCURRENCY]))
asyncio.run_coroutine_threadsafe(warm(), loop).result()
def fetch(url):
    return asyncio.run_coroutine_threadsafe(aread(url), loop)
"""
_LOCAL = """
import collections, concurrent.futures, hashlib, json, os, sys, time
urls = sys.argv[1:]
def fetch(path):
    done = concurrent.futures.Future()
    with open(path, "rb", buffering=0) as f:
        done.set_result(f.read())
    return done
"""
# User and system CPU of the process so far, to the microsecond.
_CPU = """
import resource
def _cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime
"""
# The caller's own work on each object, as the writer's decode, resize and encode: some with the GIL
# held (a Python loop), some without (SHA-256 of a buffer, which releases it).
_WORK = _CPU + """
_blob = bytes(RELEASED_BYTES)
def work(data):
    for _ in range(PYTHON_LOOPS):
        pass
    hashlib.sha256(_blob)
"""
_WINDOW = _WORK + """
wall, cpu = time.perf_counter(), _cpu()
window, datas = collections.deque(), []
for url in urls:
    if len(window) >= CONCURRENCY:
        datas.append(window.popleft().result())
        work(datas[-1])
    window.append(fetch(url))
for f in window:
    datas.append(f.result())
    work(datas[-1])
wall, cpu = time.perf_counter() - wall, [b - a for a, b in zip(cpu, _cpu())]
print(json.dumps({"seconds": wall, "user_s": cpu[0], "system_s": cpu[1], "sha256": [hashlib.sha256(d).hexdigest() for d in datas]}))
"""
_GATHERED = """
import asyncio, hashlib, json, os, sys, time
urls = sys.argv[1:]
""" + _WORK + """
async def main():
    await asyncio.gather(*(aread(u) for u in urls[:CONCURRENCY]))  # warm
    gate = asyncio.Semaphore(CONCURRENCY)
    async def one(url):
        async with gate:
            data = await aread(url)
        work(data)  # in the loop's thread: it holds up the other reads, as it would in a writer
        return data
    wall, cpu = time.perf_counter(), _cpu()
    datas = await asyncio.gather(*(one(u) for u in urls))
    return datas, time.perf_counter() - wall, [b - a for a, b in zip(cpu, _cpu())]
datas, wall, cpu = asyncio.run(main())
print(json.dumps({"seconds": wall, "user_s": cpu[0], "system_s": cpu[1], "sha256": [hashlib.sha256(d).hexdigest() for d in datas]}))
"""

LOCAL = "(0) local files, read inline (the floor)"
BASELINE = "(a) GcsClient.read, thread pool"
CLIENTS = {
    LOCAL: _LOCAL + _WINDOW,
    BASELINE: _OURS + _THREADED + _WINDOW,
    "(b) obstore get, thread pool": _OBSTORE + _THREADED + _WINDOW,
    "(c) obstore get_async, one loop thread, futures": _OBSTORE + _BRIDGED + _WINDOW,
    "(d) obstore get_async, asyncio.gather (no hand-off)": _OBSTORE + _GATHERED,
    "(e) own HTTP/1.1 on asyncio streams, one loop thread, futures": _OWN_ASYNC + _BRIDGED + _WINDOW,
    "(f) FileReader.submit: (e) made whole (beam_prep.io.gcs_batch), the writer now": _BATCHED + _WINDOW,
}


def corpus(objects: int, seed: int = 0) -> list[bytes]:
    """``objects`` random byte strings of 10-200 KB, the same for a seed."""
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(MIN_BYTES, MAX_BYTES)) for _ in range(objects)]


def summarise(runs: list[dict], clients: Sequence[str]) -> list[dict]:
    """Per client: median CPU and throughput, the CPU over the floor's (local files, same work), and
    the median and worst ratios against the baseline over the rounds, each taken within its round."""
    rows = []
    by_round = {(r["client"], r["round"]): r for r in runs}
    for client in clients:
        mine = [r for r in runs if r["client"] == client]
        floor = [by_round[LOCAL, r["round"]]["cpu_us_per_object"] for r in mine]
        base = [by_round[BASELINE, r["round"]] for r in mine]
        over = [r["cpu_us_per_object"] - f for r, f in zip(mine, floor)]
        base_over = [b["cpu_us_per_object"] - f for b, f in zip(base, floor)]
        over_ratio = [o / b for o, b in zip(over, base_over)]
        cpu_ratio = [r["cpu_us_per_object"] / b["cpu_us_per_object"] for r, b in zip(mine, base)]
        rate_ratio = [r["objects_per_s"] / b["objects_per_s"] for r, b in zip(mine, base)]
        rows.append({"client": client, "latency_ms": mine[0]["latency_ms"],
                     "cpu_us_per_object": statistics.median(r["cpu_us_per_object"] for r in mine),
                     "over_floor_us": statistics.median(over),
                     "system_us_per_object": statistics.median(r["system_us_per_object"] for r in mine),
                     "objects_per_s": statistics.median(r["objects_per_s"] for r in mine),
                     "cpu_vs_baseline_median": statistics.median(cpu_ratio),
                     "cpu_vs_baseline_worst": max(cpu_ratio),
                     "over_floor_vs_baseline_median": statistics.median(over_ratio),
                     "over_floor_vs_baseline_worst": max(over_ratio),
                     "rate_vs_baseline_median": statistics.median(rate_ratio),
                     "rate_vs_baseline_worst": min(rate_ratio)})
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32, help="reads in flight, as --read_concurrency")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latencies", type=float, nargs="+", default=[0.0, 30.0],
                        help="ms added to every request by the server; each round runs every client at each")
    parser.add_argument("--python_loops", type=int, default=20_000,
                        help="the caller's work per object with the GIL held: iterations of an empty loop")
    parser.add_argument("--released_kb", type=int, default=1024,
                        help="the caller's work per object without the GIL: KB through SHA-256")
    parser.add_argument("--tls", action="store_true",
                        help="(a) and (e) speak TLS, through the server's tunnel for www.googleapis.com, "
                             "as to GCS itself; the other rows do not run")
    parser.add_argument("--clients", default="".join(name[1] for name in CLIENTS),
                        help="the rows to run, by letter (0 and a always run)")
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    letters = (set(args.clients) - (set("bcdf") if args.tls else set())) | {"0", "a"}
    if importlib.util.find_spec("obstore") is None:
        log.warning("obstore is not installed (pip install obstore): rows (b) to (d) do not run")
        letters -= set("bcd")
    chosen = [name for name in CLIENTS if name[1] in letters]
    recording = Recording("gcs-clients-tls" if args.tls else "gcs-clients", argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    datas = corpus(args.objects)
    expected = [hashlib.sha256(d).hexdigest() for d in datas]
    runs = []
    with scratch_server("gcs-clients-") as (server, workdir):
        bucket = server.new_bucket()
        for i, data in enumerate(datas):
            (workdir / "in" / f"{i % 10}").mkdir(parents=True, exist_ok=True)
            (workdir / "in" / f"{i % 10}" / f"{i}.jpg").write_bytes(data)
        bucket.upload_tree(workdir / "in", "images", threads=UPLOAD_THREADS)
        urls = [bucket.url(f"images/{i % 10}/{i}.jpg") for i in range(args.objects)]
        local = [str(workdir / "in" / f"{i % 10}" / f"{i}.jpg") for i in range(args.objects)]
        order = list(chosen)
        for round_ in range(args.rounds):
            random.Random(round_).shuffle(order)
            for latency_ms, client in itertools.product(args.latencies, order):
                code = (CLIENTS[client].replace("CONCURRENCY", str(args.concurrency))
                        .replace("USE_TLS", str(args.tls))
                        .replace("PYTHON_LOOPS", str(args.python_loops))
                        .replace("RELEASED_BYTES", str(args.released_kb * 1024)))
                run = run_child(server, code, local if client == LOCAL else urls, latency_ms)
                if run.report.pop("sha256") != expected:
                    raise RuntimeError(f"{client}: bytes differ from the objects written")
                row = {"client": client, "round": round_, "latency_ms": latency_ms,
                       "cpu_us_per_object": (run.report["user_s"] + run.report["system_s"]) / args.objects * 1e6,
                       "system_us_per_object": run.report["system_s"] / args.objects * 1e6,
                       "objects_per_s": args.objects / run.report["seconds"]}
                log.info("%s", row)
                runs.append(row)
    results = {"objects": args.objects, "min_bytes": MIN_BYTES, "max_bytes": MAX_BYTES,
               "concurrency": args.concurrency, "rounds": args.rounds,
               "tls": args.tls, "python_loops": args.python_loops, "released_kb": args.released_kb,
               "baseline": BASELINE, "runs": runs,
               "rows": [row for latency_ms in args.latencies
                        for row in summarise([r for r in runs if r["latency_ms"] == latency_ms], chosen)]}
    print()
    print(tables.gcs_clients(results))
    recording.write(args.json, results)


if __name__ == "__main__":
    main()
