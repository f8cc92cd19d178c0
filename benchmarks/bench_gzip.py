"""GZIP benchmark: what each compression level costs a shard's records, and what it saves.

The records are those the default command writes (``make_example`` of the
cached corpus's images: 224x224 JPEG q90 in a ``tf.train.Example``, framed),
compressed as one shard into memory by ISA-L (``isal.igzip``) at each of its
levels, by zlib at its default level (what TensorFlow's ``TFRecordWriter`` and
Beam's ``WriteToTFRecord`` use), and by what beam-prep's shards are written
with (``gzip_stream``: ISA-L where deflate saves enough, stored where not), in
rounds that take turns. Per compressor: the median CPU per record, the output
over the framed records' size, and what reading that output back costs
TensorFlow (``TFRecordDataset(compression_type="GZIP")``, CPU per record; the
uncompressed records' read beside it), which every training epoch pays.

    python -m benchmarks.bench_gzip [--images 2000] [--repeat 5] [--json gzip.json]
"""
from __future__ import annotations

import argparse
import io
import logging
import os
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence

from isal import igzip

from beam_prep.io import tfrecord
from beam_prep.io.gzip_stream import MIN_SAVING, GzipStream
from beam_prep.write.images.examples import make_example
from beam_prep.write.images.imaging import ImageSpec
from beam_prep.write.shared.entry import FileEntry
from benchmarks import CACHE_DIR, IMAGE_SIZE, JPEG_QUALITY, machine
from benchmarks.corpus import ensure_corpus
from benchmarks.report import tables
from benchmarks.results import Recording

Compress = Callable[[Sequence[bytes]], bytes]
OURS = f"gzip_stream: ISA-L level {tfrecord.GZIP_LEVEL}, stored where deflate saves < {MIN_SAVING:.0%}"
UNCOMPRESSED = "uncompressed (--compression none)"


def _isal(level: int) -> Compress:
    def compress(records: Sequence[bytes]) -> bytes:
        buf = io.BytesIO()
        with igzip.IGzipFile(filename="", fileobj=buf, mode="wb", compresslevel=level, mtime=0) as f:
            for record in records:
                f.write(record)
        return buf.getvalue()
    return compress


def _zlib(records: Sequence[bytes]) -> bytes:
    compressor = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # a gzip stream
    return b"".join([*(compressor.compress(record) for record in records), compressor.flush()])


def _ours(records: Sequence[bytes]) -> bytes:
    buf = io.BytesIO()
    with GzipStream(buf, tfrecord.GZIP_LEVEL) as f:
        for record in records:
            f.write(record)
    return buf.getvalue()


def read_cpu(path: str, compression: str) -> float:
    """CPU seconds TensorFlow takes to read every record of ``path`` (in batches, as a reader does)."""
    import tensorflow as tf

    start = time.process_time()
    for _ in tf.data.TFRecordDataset(path, compression_type=compression).batch(256):
        pass
    return time.process_time() - start


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
    compressors[OURS] = _ours
    cpu: dict[str, list[float]] = {name: [] for name in compressors}
    read: dict[str, list[float]] = {name: [] for name in (*compressors, UNCOMPRESSED)}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as folder:
        shards = {UNCOMPRESSED: os.path.join(folder, "none")}
        with open(shards[UNCOMPRESSED], "wb") as f:
            f.write(b"".join(records))
        read_cpu(shards[UNCOMPRESSED], "")  # TensorFlow's import and first dataset: not a read's cost
        for round_ in range(args.repeat):
            order = list(compressors.items()) if round_ % 2 == 0 else list(reversed(compressors.items()))
            for name, compress in order:
                start = time.process_time()
                data = compress(records)
                cpu[name].append(time.process_time() - start)
                sizes[name] = len(data)
                shards[name] = os.path.join(folder, str(len(shards)))
                with open(shards[name], "wb") as f:
                    f.write(data)
            for name, path in (shards.items() if round_ % 2 == 0 else reversed(shards.items())):
                read[name].append(read_cpu(path, "" if name == UNCOMPRESSED else "GZIP"))
    results = {"records": len(records), "bytes": sum(map(len, records)), "repeat": args.repeat,
               "level": tfrecord.GZIP_LEVEL, "ours": OURS, "cpu_seconds": cpu, "sizes": sizes,
               "read_cpu_seconds": read}
    print(f"{machine.describe(machine.machine_info())}\n")
    print(tables.gzip_levels(results))
    print(f"(medians over rounds: {', '.join(f'{k} {statistics.median(v):.3f} s' for k, v in cpu.items())})")
    recording.write(args.json, results)


if __name__ == "__main__":
    main()
