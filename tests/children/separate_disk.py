"""A runner whose workers never see the launcher's disk, as Dataflow's do not: for tests of the remote path.

``--runner tests.children.separate_disk.SeparateDiskRunner`` (a dotted path: beam-prep takes it for a
remote runner, so input and output must be gs://) sends the job, as its portable proto, to a child
process run in a mount namespace of its own with an empty tmpfs over the launcher's temporary folder
(where its listings, spills and the test's files are): the child runs it on Beam's FnApiRunner, and
what the launcher left on its disk cannot be read there. The GCS test server is another process, out
of reach of the mount; its credentials and CA files are put back in the tmpfs, as a Dataflow worker
has its own. Needs root (``unshare``); the tests skip naming why without it.

    python -m tests.children.separate_disk HIDDEN...   (the job's proto and options on stdin, as JSON)
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.runner import PipelineResult, PipelineRunner, PipelineState
from apache_beam.transforms import environments

RUNNER = "tests.children.separate_disk.SeparateDiskRunner"
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TIMEOUT_S = 300


class _Done(PipelineResult):
    """A finished job: its state; no metrics come back from the other side."""

    def wait_until_finish(self, duration=None):
        return self.state

    def metrics(self):
        return _NoMetrics()


class _NoMetrics:
    def query(self, _filter=None):
        return {"counters": [], "distributions": [], "gauges": []}


class SeparateDiskRunner(PipelineRunner):
    """Runs the job in a child that sees an empty tmpfs where the launcher's temporary folder is."""

    def run_pipeline(self, pipeline, options):
        proto = pipeline.to_runner_api(default_environment=environments.EmbeddedPythonEnvironment.default())
        flags = {k: v for k, v in options.get_all_options(drop_default=True).items() if k != "runner"}
        job = json.dumps({"proto": base64.b64encode(proto.SerializeToString()).decode(), "options": flags})
        done = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-m",
                               "tests.children.separate_disk", *_hidden()], input=job, text=True, cwd=_REPO,
                              capture_output=True, timeout=_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the job failed on the separate workers: {done.stderr[-4000:]}")
        return _Done(PipelineState.DONE)


# The GCS test server's files a worker needs (gcs_harness.server.GcsServer.env), by their variables.
_KEPT = ("GOOGLE_APPLICATION_CREDENTIALS", "CURL_CA_BUNDLE")


def _hidden() -> list[str]:
    """The launcher's temporary folders: the system's, and ``$TMPDIR`` (tests give each its own) if elsewhere."""
    folders = sorted({os.path.realpath(path) for path in ("/tmp", tempfile.gettempdir(), os.environ.get("TMPDIR"))
                      if path and os.path.isdir(path)})
    return [f for f in folders if not any(f.startswith(other + "/") for other in folders)]


def _main(hidden: list[str]) -> None:
    job = json.loads(sys.stdin.read())
    kept = {}
    for name in _KEPT:
        path = os.environ.get(name)
        if path and os.path.isfile(path):
            with open(path, "rb") as f:
                kept[path] = f.read()
    for folder in hidden:
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", folder], check=True)
        assert not os.listdir(folder), "the launcher's folder is still seen"
    os.makedirs(tempfile.gettempdir(), exist_ok=True)  # where the workers' own temporary files go
    for path, data in kept.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    from apache_beam.portability.api import beam_runner_api_pb2

    proto = beam_runner_api_pb2.Pipeline.FromString(base64.b64decode(job["proto"]))
    options = PipelineOptions.from_dictionary(job["options"])
    options.view_as(StandardOptions).runner = None
    p = beam.Pipeline.from_runner_api(proto, FnApiRunner(), options)
    p.run().wait_until_finish()


if __name__ == "__main__":
    _main(sys.argv[1:])
