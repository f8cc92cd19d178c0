"""The reader benchmark's gs:// mode: the same shards from local disk and from gs:// at added latencies.

``python -m benchmarks.bench_reader --gcs`` copies the benchmark's JPEG dataset
(written by the pipeline, 8 GZIP shards) into the test GCS server
(``tests/gcs_harness/server.py``) and times reader (a), ``make_dataset(path,
"train", batch_size=256, training=True, repeat=True)``, from local disk and
from gs:// with 0 and 30 ms added to every request. gs:// goes through
TensorFlow's own GCS filesystem, as training does, and the gateway's TLS. Each
source runs in a fresh process (TensorFlow fixes its GCS settings once per
process) while this one serves GCS; the table gives the median images/s, the
ratios to gs:// at 0 ms and to local disk, and how many cores the storage
server (emulator, and the gateway that terminates TLS in Python) kept busy
meanwhile, on the same machine as the reader.
"""
from __future__ import annotations

import argparse
import logging
import pathlib
from collections.abc import Sequence

from benchmarks import CACHE_DIR
from benchmarks.corpus import ensure_corpus
from benchmarks.gcs_server import UPLOAD_THREADS, run_child, scratch_server
from benchmarks.reading import DEFAULT_IMAGES, ensure_dataset
from benchmarks.report import tables
from benchmarks.results import Recording

log = logging.getLogger(__name__)

_CHILD = """
import json, sys
from beam_prep.reader import make_dataset
from benchmarks.reading import BATCH_SIZE, Reader, time_reader
path, seconds, rounds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
reader = Reader("a", "", lambda: make_dataset(path, "train", batch_size=BATCH_SIZE, training=True, repeat=True))
print(json.dumps({"rates": [time_reader(reader, seconds)[0] for _ in range(rounds)]}))
"""


def main(argv: Sequence[str] | None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gcs", action="store_true")
    parser.add_argument("--images", type=int, default=DEFAULT_IMAGES)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latencies", type=int, nargs="+", default=[0, 30], metavar="MS")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args(argv)
    recording = Recording("reader-gcs", argv, module="benchmarks.bench_reader")
    images = args.images
    dataset = ensure_dataset(ensure_corpus(images, CACHE_DIR).root, images, "jpeg")
    rates: dict[str, list[float]] = {}
    server_cores: dict[str, float] = {}
    with scratch_server("reader-gcs-") as (server, _):
        bucket = server.new_bucket()
        bucket.upload_tree(dataset, "dataset", threads=UPLOAD_THREADS)
        sources = [("local disk", str(dataset), None)] + [
            (f"gs:// {ms} ms", bucket.url("dataset"), ms) for ms in args.latencies]
        for name, path, ms in sources:
            run = run_child(server, _CHILD, [path, str(args.seconds), str(args.rounds)], ms or 0)
            rates[name] = run.report["rates"]
            server_cores[name] = run.server_cpu_s / run.seconds
            log.info("%s: %s images/s", name, [round(r) for r in rates[name]])
    results = {"images": images, "seconds": args.seconds, "rounds": args.rounds, "rates": rates,
               "server_cores": server_cores}
    recording.write(args.json, results)
    print()
    print(tables.reader_gcs(results))
