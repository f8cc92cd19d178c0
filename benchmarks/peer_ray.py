"""Ray Data, as its docs chain it: a peer for ``bench_writer``, row (l).

``ray.data.read_binary_files(root, include_paths=True)`` -> ``Dataset.map`` with the
same Pillow work as the other peers -> ``Dataset.write_tfrecords``: TFRecord, the
format nearest ours, each row a ``tf.train.Example`` of the image bytes, the label
and the file name. ``read_images`` is not used: its ``size`` stretches to the
output size, where every other row centre-crops. Compression: none,
as Ray's TFRecord writer writes by default (it has no option of its own; JPEG
payloads hardly shrink, and beam-prep's GZIP shards store them). Ray starts on every core by default;
the labels are the sorted folder names, found before the pipeline as the other
peers do.

Its CPU is not all in its parent's ``RUSAGE_CHILDREN``: the raylet ignores
``SIGCHLD``, so that the kernel reaps its workers and adds their time to no one's,
and workers and daemons may outlive the processes that start them. The benchmark
runs it with ``measure.run_measured(..., escaping=True)``, which samples every
process of the tree for its own CPU time, adopting orphans as their subreaper.

Runs in the project's own environment: ``ray[data]`` is in its ``test`` extra, and
``write_tfrecords`` needs TensorFlow, which the project requires.

    python -m benchmarks.peer_ray --input ROOT --output OUT [--image_size 224] [--jpeg_quality 90]

Prints one JSON line: seconds in the recipe and the files written (Ray's writer
does not count its rows; the benchmark counts the records).
"""
from __future__ import annotations

import argparse
import json
import os
import time

from benchmarks.peer_image import centre_crop_jpeg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--jpeg_quality", type=int, default=90)
    args = parser.parse_args()

    import ray

    start = time.perf_counter()
    labels = sorted(d for d in os.listdir(args.input) if os.path.isdir(os.path.join(args.input, d)))
    index = {label: i for i, label in enumerate(labels)}
    size, quality = args.image_size, args.jpeg_quality

    def convert(row: dict) -> dict:
        path = row["path"]
        return {"image": centre_crop_jpeg(row["bytes"], size, quality),
                "label": index[os.path.basename(os.path.dirname(path))],
                "filename": os.path.basename(path)}

    ray.init()
    dataset = ray.data.read_binary_files(args.input, include_paths=True, file_extensions=["jpg", "jpeg"])
    dataset.map(convert).write_tfrecords(args.output)
    seconds = time.perf_counter() - start
    ray.shutdown()
    files = len(os.listdir(args.output))
    print(json.dumps({"write_seconds": seconds, "files": files, "compression": None}))


if __name__ == "__main__":
    main()
