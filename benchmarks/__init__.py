"""Benchmarks that put beam-prep beside the seed notebook's tf.data code.

Run them as modules from the repository root, e.g.
``python -m benchmarks.bench_writer --images 20000``. They need the ``bench``
extra (scikit-image for the sample photographs, psutil for memory).
"""

import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
CACHE_DIR = pathlib.Path(__file__).resolve().parent / ".cache"  # corpora and datasets, git-ignored
# The settings both benchmarks write and read with, so their numbers describe the same records.
IMAGE_SIZE = 224
JPEG_QUALITY = 90
# The writer benchmark's peers that pin their own numpy, pandas, OpenCV...: their own virtualenv, made so.
PEERS_INSTALL = "python3.11 -m venv .venv-peers && .venv-peers/bin/pip install -r benchmarks/peers-requirements.txt"
