"""GZIP benchmark: what each compression level costs a shard's records, and what it saves.

The records are those the default command writes (``make_example`` of the
cached corpus's images: 224x224 JPEG q90 in a ``tf.train.Example``, framed),
compressed as one shard into memory by ISA-L (``isal.igzip``, what beam-prep's
TFRecord shards use) at each of its levels and by zlib at its default level
(what TensorFlow's ``TFRecordWriter`` and Beam's ``WriteToTFRecord`` use), in
rounds that take turns. Per level: the median CPU per record and the output
over the framed records' size.

    python -m benchmarks.bench_gzip [--images 2000] [--repeat 5] [--json gzip.json]
"""
from __future__ import annotations

import argparse
import io
import logging
import os
import statistics
import time
import zlib
from collections.abc import Callable, Sequence

from isal import igzip

from beam_prep.io import tfrecord
from beam_prep.write.images.examples import make_example
from beam_prep.write.images.imaging import ImageSpec
from beam_prep.write.shared.entry import FileEntry
from benchmarks import CACHE_DIR, IMAGE_SIZE, JPEG_QUALITY, machine
from benchmarks.corpus import ensure_corpus
from benchmarks.report import tables
from benchmarks.results import Recording

Compress = Callable[[Sequence[bytes]], int]


def _isal(level: int) -> Compress:
    def compress(records: Sequence[bytes]) -> int:
        buf = io.BytesIO()
        with igzip.IGzipFile(filename="", fileobj=buf, mode="wb", compresslevel=level, mtime=0) as f:
            for record in records:
                f.write(record)
        return buf.tell()
    return compress


def _zlib(records: Sequence[bytes]) -> int:
    compressor = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # a gzip stream
    return sum(len(compressor.compress(record)) for record in records) + len(compressor.flush())


def records_of(corpus_root: str, images: int) -> list[bytes]:
    """The default command's framed records of the corpus's first ``images`` files."""
    spec = ImageSpec(height=IMAGE_SIZE, width=IMAGE_SIZE, jpeg_quality=JPEG_QUALITY)
    out = []
    for folder, _, names in sorted(os.walk(corpus_root)):
        for name in sorted(names):
            if len(out) == images or not name.lower().endswith((".jpg", ".jpeg")):
                continue
            path = os.path.join(folder, name)
            entry = FileEntry(path, os.path.relpath(path, corpus_root), "train", os.path.basename(folder), 0,
                              os.path.getsize(path))
            outcome = make_example(entry, spec)
            if outcome.example is not None:
                out.append(tfrecord.frame(outcome.example))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000, help="records compressed (default 2000)")
    parser.add_argument("--repeat", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--json", help="also write the results here as JSON")
    args = parser.parse_args(argv)
    if args.images < 1 or args.repeat < 1:
        parser.error("--images and --repeat must be positive")
    recording = Recording("gzip", argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    corpus = ensure_corpus(args.images, CACHE_DIR)
    records = records_of(str(corpus.root), args.images)
    compressors: dict[str, Compress] = {f"ISA-L level {level}": _isal(level) for level in range(4)}
    compressors["zlib level 6 (TensorFlow's, Beam's)"] = _zlib
    cpu: dict[str, list[float]] = {name: [] for name in compressors}
    sizes: dict[str, int] = {}
    for round_ in range(args.repeat):
        order = list(compressors.items()) if round_ % 2 == 0 else list(reversed(compressors.items()))
        for name, compress in order:
            start = time.process_time()
            sizes[name] = compress(records)
            cpu[name].append(time.process_time() - start)
    results = {"records": len(records), "bytes": sum(map(len, records)), "repeat": args.repeat,
               "level": tfrecord.GZIP_LEVEL, "cpu_seconds": cpu, "sizes": sizes}
    print(f"{machine.describe(machine.machine_info())}\n")
    print(tables.gzip_levels(results))
    print(f"(medians over rounds: {', '.join(f'{k} {statistics.median(v):.3f} s' for k, v in cpu.items())})")
    recording.write(args.json, results)


if __name__ == "__main__":
    main()
