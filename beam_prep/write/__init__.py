"""The writer: an image tree (or a pipeline's own elements) to sharded TFRecords and a manifest.

Its stages in order: listing, sharding, imaging, records, transforms (the Beam
wiring), manifest; pipeline plans, builds and runs them for ``prepare``, and
ptransform's ``WriteImageDataset`` serves a user's own Beam pipeline. Nothing
here imports TensorFlow or the rooms above it (tools, cli).
"""
