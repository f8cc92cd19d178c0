"""Benchmarks that put beam-prep beside the seed notebook's tf.data code.

Run them as modules from the repository root, e.g.
``python -m benchmarks.bench_writer --images 20000``. They need the ``bench``
extra (scikit-image for the sample photographs, psutil for memory).
"""
