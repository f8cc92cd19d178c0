"""The test GCS server: test infrastructure, not the product.

beam-prep's gs:// tests (and the benchmarks' gs:// modes) run against a real
GCS endpoint on loopback: gcp-storage-emulator in a child process behind a
gateway that adds what the emulator lacks (TLS for TensorFlow, the ADC token,
403s, injected errors and latency, generation preconditions).

* ``server.py``: ``GcsServer`` (both servers, their environment for clients)
  and ``GcsBucket``, and the pytest fixtures (a plugin: ``tests/conftest.py``
  loads it with ``pytest_plugins``). Its docstring explains the design.
* ``emulator.py``: the emulator as a child process; ``emulator_main.py``: its
  entry point, patched for speed.
* ``gateway.py``: the gateway in front of it.
* ``test_harness.py``: tests that the harness serves what Beam, google-cloud-
  storage and TensorFlow really do; a failure here is a harness problem.
* ``children/``: programs those tests run in a child process.
"""
