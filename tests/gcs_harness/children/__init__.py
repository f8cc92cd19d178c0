"""Programs the harness's own tests run in a child process (``python -m tests.gcs_harness.children.<name>``
from the repository root): TensorFlow fixes its GCS settings once per process, and Beam's
multi-processing workers need the server's environment from the start.
"""
