"""TensorFlow's own GCS filesystem against the harness, one independent step at a time.

    python -m tests.gcs_harness.children.tf_steps BUCKET RECORDS_GLOB MISSING FORBIDDEN REPORT.json

Each step's result or error goes into the JSON report, so that one test per
behaviour can assert on it; one child runs them all, so TF is imported once.
"""
import json
import sys

import tensorflow as tf


def main(bucket: str, records_glob: str, missing: str, forbidden: str, report: str) -> None:
    root = f"gs://{bucket}"

    def glob():
        return sorted(tf.io.gfile.glob(f"{root}/tree/*/*.txt"))

    def exists():
        return [tf.io.gfile.exists(f"{root}/tree/cats/a.txt"),
                tf.io.gfile.exists(f"{root}/tree/cats/none.txt")]

    def write_read():
        with tf.io.gfile.GFile(f"{root}/tf/written.bin", "wb") as f:
            f.write(bytes(range(256)) * 1024)
        with tf.io.gfile.GFile(f"{root}/tf/written.bin", "rb") as f:
            return f.read() == bytes(range(256)) * 1024

    def rename():
        with tf.io.gfile.GFile(f"{root}/tf/old.txt", "wb") as f:
            f.write(b"moved")
        tf.io.gfile.rename(f"{root}/tf/old.txt", f"{root}/tf/new.txt")
        with tf.io.gfile.GFile(f"{root}/tf/new.txt", "rb") as f:
            return [tf.io.gfile.exists(f"{root}/tf/old.txt"), f.read().decode()]

    def tfrecords():
        files = sorted(tf.io.gfile.glob(records_glob))
        ds = tf.data.TFRecordDataset(files, compression_type="GZIP")
        return {"files": files,
                "records": sorted(r.decode() for r in ds.as_numpy_iterator())}

    def error_of(pattern):
        # glob, not listdir: TF's listdir turns every failure into NotFound.
        try:
            tf.io.gfile.glob(pattern)
        except tf.errors.OpError as err:
            return type(err).__name__
        return "no error"

    steps = {"glob": glob, "exists": exists, "write_read": write_read,
             "rename": rename, "tfrecords": tfrecords,
             "missing_bucket": lambda: error_of(f"gs://{missing}/*"),
             "forbidden_bucket": lambda: error_of(f"gs://{forbidden}/*")}
    results = {}
    for name, step in steps.items():
        try:
            results[name] = {"ok": step()}
        except Exception as err:
            results[name] = {"error": f"{type(err).__name__}: {err}"}
    with open(report, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:6])
