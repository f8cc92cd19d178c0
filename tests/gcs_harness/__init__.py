"""The test GCS server: test infrastructure, not the product.

beam-prep's gs:// tests (and the benchmarks' gs:// modes) run against a real
GCS endpoint on loopback: gcp-storage-emulator in a child process behind a
gateway that adds what the emulator lacks (TLS for TensorFlow, the ADC token,
403s, injected errors and latency, generation preconditions).

* ``server.py``: the emulator process, the gateway, ``GcsServer`` and
  ``GcsBucket``, and the pytest fixtures (a plugin: ``tests/conftest.py``
  loads it with ``pytest_plugins``). Its docstring explains the design.
* ``emulator_main.py``: the emulator's entry point, patched for speed.
* ``test_harness.py``: tests that the harness serves what Beam, google-cloud-
  storage and TensorFlow really do; a failure here is a harness problem.
* ``children/``: programs those tests run in a child process.
"""
