"""Shared fixtures: run the pipeline as a user does, and read its output back with plain tf.data."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
# A real GCS server on loopback for gs:// tests (tests/gcs_emulator.py).
pytest_plugins = ["gcs_emulator"]


def run_prepare(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m pipelines.prepare_images ARGS`` in a fresh process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "pipelines.prepare_images", *args],
        cwd=REPO, env=env or dict(os.environ), capture_output=True, text=True, timeout=timeout)


def read_split(output: str | pathlib.Path, split: str) -> list[dict[str, Any]]:
    """Every record of a split, in file order, parsed by TensorFlow itself (not our reader)."""
    import tensorflow as tf

    manifest = json.loads(tf.io.gfile.GFile(f"{output}/manifest.json").read())
    files = [f"{output}/{name}" for name in manifest["splits"][split]["shards"]]
    spec = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/format": tf.io.FixedLenFeature([], tf.string),
        "image/height": tf.io.FixedLenFeature([], tf.int64),
        "image/width": tf.io.FixedLenFeature([], tf.int64),
        "image/channels": tf.io.FixedLenFeature([], tf.int64),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
        "image/class/text": tf.io.FixedLenFeature([], tf.string),
        "image/filename": tf.io.FixedLenFeature([], tf.string),
        "image/key/sha256": tf.io.FixedLenFeature([], tf.string),
    }
    records = []
    for path in files:
        for serialized in tf.data.TFRecordDataset(path, compression_type="GZIP"):
            parsed = tf.io.parse_single_example(serialized, spec)
            row = {k: v.numpy() for k, v in parsed.items()}
            row["shard"] = path.rsplit("/", 1)[-1]
            records.append(row)
    return records


@pytest.fixture(scope="session")
def repo() -> pathlib.Path:
    return REPO
