"""The seed notebook's tf.data code, as the baseline our benchmarks run beside ours.

The writer follows the notebook's cells (``get_bytes_label_tfrecord``,
``process_image_tfrecord``, ``tf_serialize_example``, ``create_tfrecord``) so
the benchmark measures what the notebook's readers would run: one tf.data
pipeline per shard (``ds.shard(n, i)``) mapping read_file and
decode/resize/encode with AUTOTUNE, then ``tf.train.Example`` built and
serialised in Python and written by one GZIP ``TFRecordWriter`` per shard, one
shard after another. Kept from the notebook: one-hot labels, nearest-neighbour
stretch to the output size, ``encode_jpeg(optimize_size=True)``. Changed: JPEG
quality is a parameter (the notebook used the default, 95) so the output is
comparable with ours, the image list comes from a local folder instead of a GCS
glob, and the shards go to a given folder.

Run it as a command (``python -m benchmarks.seed_notebook write ...``) so that,
like a user's notebook, its TensorFlow import and memory are its own.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE
# The notebook calls create_tfrecord(dataset, 4).
NOTEBOOK_SHARDS = 4


def list_images(root: str) -> tuple[list[str], list[int], int]:
    """Files, class indices and class count, found as the notebook does (folder per label)."""
    folders = sorted(tf.io.gfile.glob(os.path.join(root, "*")))
    label_map = {folder.rstrip("/").split("/")[-1]: i for i, folder in enumerate(folders)}
    files = sorted(tf.io.gfile.glob(os.path.join(root, "*", "*.jpg")))
    labels = [label_map[path.split("/")[-2]] for path in files]
    return files, labels, len(label_map)


def seed_write(
    files: Sequence[str],
    labels: Sequence[int],
    num_classes: int,
    out_dir: str,
    n_shards: int = NOTEBOOK_SHARDS,
    image_size: int = 224,
    jpeg_quality: int = 90,
) -> int:
    """Writes ``out_dir/output_file-part-{i}.tfrecord`` (GZIP) as the notebook does; returns records written."""
    one_hot = np.zeros((len(labels), num_classes), dtype=np.uint8)
    one_hot[np.arange(len(labels)), labels] = 1
    dataset = tf.data.Dataset.from_tensor_slices((list(files), one_hot))

    def get_bytes_label_tfrecord(filepath, label):
        return tf.io.read_file(filepath), label

    def process_image_tfrecord(raw_bytes, label):
        image = tf.io.decode_jpeg(raw_bytes, channels=3)
        image = tf.image.resize(image, (image_size, image_size), method="nearest")
        image = tf.io.encode_jpeg(image, quality=jpeg_quality, optimize_size=True)
        return image, label

    def build_dataset_tfrecord(ds):
        ds = ds.map(get_bytes_label_tfrecord, num_parallel_calls=AUTOTUNE)
        return ds.map(process_image_tfrecord, num_parallel_calls=AUTOTUNE)

    written = 0
    tf.io.gfile.makedirs(out_dir)
    for i in range(n_shards):
        batch = map(
            lambda x: _tf_serialize_example(x[0], x[1]),
            dataset.shard(n_shards, i).apply(build_dataset_tfrecord).as_numpy_iterator(),
        )
        path = os.path.join(out_dir, f"output_file-part-{i}.tfrecord")
        with tf.io.TFRecordWriter(path, "GZIP") as writer:
            for record in batch:
                writer.write(record)
                written += 1
    return written


def _tf_serialize_example(image: bytes, label: np.ndarray) -> bytes:
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=label)),
    }
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    return example.SerializeToString()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("write", help="write TFRecords from root/<label>/<image>.jpg")
    write.add_argument("--input", required=True, help="image tree root")
    write.add_argument("--output", required=True, help="folder for the shards")
    write.add_argument("--shards", type=int, default=NOTEBOOK_SHARDS)
    write.add_argument("--image_size", type=int, default=224)
    write.add_argument("--jpeg_quality", type=int, default=90)
    args = parser.parse_args(argv)

    start = time.perf_counter()
    files, labels, num_classes = list_images(args.input)
    listed = time.perf_counter()
    written = seed_write(
        files, labels, num_classes, args.output, args.shards, args.image_size, args.jpeg_quality
    )
    done = time.perf_counter()
    # One JSON line on stdout: the benchmark reads it.
    print(json.dumps({
        "written": written,
        "list_seconds": round(listed - start, 3),
        "write_seconds": round(done - listed, 3),
    }))


def seed_read(
    files: Sequence[str],
    batch_size: int = 1,
    image_key: str = "image",
    label_key: str = "label",
) -> tf.data.Dataset:
    """The notebook's TFRecord reader (``build_dataset_test`` and the cells it calls), for the reader benchmark.

    Kept from the notebook: interleave of ``get_tfrecord`` (a GZIP
    ``TFRecordDataset`` with ``num_parallel_reads=AUTOTUNE``, in a
    ``tf.function``), ``parse_single_example`` per record, ``decode_jpeg`` and
    ``convert_image_dtype`` to float32 per record, ``repeat()``, ``batch`` (the
    notebook's ``BATCH_SIZE`` is 1) and ``prefetch(AUTOTUNE)``. Changed: the
    feature keys are parameters (the notebook's are ``image`` and ``label``) so
    it reads beam-prep's records, and the file list is given rather than globbed.
    """
    feature_description = {
        image_key: tf.io.FixedLenFeature([], tf.string),
        label_key: tf.io.FixedLenSequenceFeature([], tf.int64, allow_missing=True),
    }

    @tf.function
    def _parse_function(example_proto):
        return tf.io.parse_single_example(example_proto, feature_description)

    @tf.function
    def process_image_tfrecord(record):
        image = tf.io.decode_jpeg(record[image_key], channels=3)
        image = tf.image.convert_image_dtype(image, dtype=tf.float32)
        return image, record[label_key]

    @tf.function
    def get_tfrecord(filename):
        return tf.data.TFRecordDataset(filename, compression_type="GZIP", num_parallel_reads=AUTOTUNE)

    dataset = tf.data.Dataset.from_tensor_slices(list(files))
    dataset = dataset.interleave(get_tfrecord, num_parallel_calls=AUTOTUNE)
    dataset = dataset.map(_parse_function, num_parallel_calls=AUTOTUNE)
    dataset = dataset.map(process_image_tfrecord, num_parallel_calls=AUTOTUNE)
    dataset = dataset.repeat()
    dataset = dataset.batch(batch_size=batch_size)
    return dataset.prefetch(buffer_size=AUTOTUNE)


if __name__ == "__main__":
    main()
