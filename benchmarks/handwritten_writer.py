"""The writer a competent engineer writes by hand: a process pool, Pillow, TensorFlow's TFRecordWriter.

A peer for ``bench_writer``: what beam-prep must beat to be worth a dependency.
Each worker decodes with Pillow's DCT-scaled draft, centre-crops and resizes with
the same bicubic box resize, encodes JPEG, builds a ``tf.train.Example`` and
writes its own GZIP shard; the labels come from the folder names.

    python -m benchmarks.handwritten_writer --input ROOT --output OUT [--image_size 224] [--jpeg_quality 90]

Prints one JSON line: images written and seconds in the write loop.
"""
import argparse
import json
import multiprocessing
import os
import time

from benchmarks.peer_image import centre_crop_jpeg


def convert(task):
    path, label, size, quality = task
    with open(path, "rb") as f:  # the image work every peer shares (draft, centre crop, bicubic, JPEG)
        return centre_crop_jpeg(f.read(), size, quality), label, os.path.basename(path)


def write_shard(args):
    shard, tasks, output = args
    import tensorflow as tf

    def feature(value):
        if isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    path = os.path.join(output, f"train-{shard:05d}.tfrecord.gz")
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for task in tasks:
            data, label, name = convert(task)
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "image/encoded": feature(data), "image/class/label": feature(label),
                "image/filename": feature(name.encode()),
            })).SerializeToString())
    return len(tasks)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--jpeg_quality", type=int, default=90)
    parser.add_argument("--shards", type=int, default=16)
    args = parser.parse_args()
    start = time.perf_counter()
    labels = sorted(d for d in os.listdir(args.input) if os.path.isdir(os.path.join(args.input, d)))
    tasks = [(os.path.join(args.input, label, name), i, args.image_size, args.jpeg_quality)
             for i, label in enumerate(labels) for name in sorted(os.listdir(os.path.join(args.input, label)))]
    os.makedirs(args.output, exist_ok=True)
    with multiprocessing.Pool(os.cpu_count()) as pool:
        written = sum(pool.imap_unordered(
            write_shard, [(s, tasks[s::args.shards], args.output) for s in range(args.shards)]))
    print(json.dumps({"written": written, "write_seconds": time.perf_counter() - start}))


if __name__ == "__main__":
    main()
