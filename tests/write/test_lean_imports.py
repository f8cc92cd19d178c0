"""The command's launcher and warm workers import Beam without its unused connectors and pandas
(``lean_imports``), a run on local files without remote storage's filesystems and Dataflow's
client as well, and nothing is refused once that import is done."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import REPO, make_tree

from beam_prep.cli.early import local_only
from beam_prep.write.run.lean_imports import LOCAL_UNUSED, UNUSED

pytestmark = pytest.mark.slow  # a fresh interpreter: this one has imported them all already

# In a new process: what the worker's preparation and then the launcher's import leave out, whether
# Beam's own names are all there, and whether each left-out module still imports afterwards.
_PROBE = """
import json, sys
from beam_prep.write.run import warm_worker
from beam_prep.write.run.lean_imports import LOCAL_UNUSED, UNUSED, import_beam
LOCAL = sys.argv[1] == "local"
if LOCAL:
    UNUSED = UNUSED + LOCAL_UNUSED
warm_worker.prepare(local=LOCAL)
import_beam(local=LOCAL)
import apache_beam as beam
from apache_beam.runners.worker import sdk_worker_main
from beam_prep.write.sinks import shard_sinks
missing = [m for m in UNUSED if m not in sys.modules]
names = all(hasattr(beam.io, n) for n in ("ReadFromText", "WriteToTFRecord", "ReadFromAvro", "WriteToParquet", "ReadFromMongoDB"))
restored = not any(type(f).__module__.endswith('lean_imports') for f in sys.meta_path)
for module in UNUSED:
    __import__(module)
print(json.dumps({"missing": missing, "names": names, "restored": restored,
                  "later": [m for m in UNUSED if m in sys.modules]}))
"""


@pytest.mark.parametrize("run", ["any", "local"])
def test_beam_imports_without_the_unused_modules_and_they_import_later(run):
    done = subprocess.run([sys.executable, "-c", _PROBE, run], capture_output=True, text=True, cwd=REPO, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    unused = list(UNUSED + LOCAL_UNUSED) if run == "local" else list(UNUSED)
    assert seen["missing"] == unused  # left out of the worker's and the launcher's import
    assert seen["names"] and seen["restored"]
    assert seen["later"] == unused  # the refusal ends with the import
    assert done.stderr == ""  # the worker's preparation is silent


# A local run's import leaves gs://'s filesystem out (Beam refuses a gs:// path as it does where
# its GCP extra is missing), and it registers once imported: what anything asking for it later gets.
_LATER_GCS = """
import json
from beam_prep.write.run.lean_imports import import_beam
import_beam(local=True)
from apache_beam.io.filesystems import FileSystems
try:
    FileSystems.get_filesystem("gs://bucket/x")
    before = "found"
except ValueError as e:
    before = str(e)
import apache_beam.io.gcp.gcsfilesystem
after = type(FileSystems.get_filesystem("gs://bucket/x")).__name__
print(json.dumps({"before": before, "after": after}))
"""


def test_a_filesystem_left_out_registers_when_imported_later():
    done = subprocess.run([sys.executable, "-c", _LATER_GCS], capture_output=True, text=True, cwd=REPO, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert "gs://bucket/x" in seen["before"]  # Beam's refusal of a path no filesystem takes
    assert seen["after"] == "GCSFileSystem"


@pytest.mark.parametrize(("argv", "local"), [
    (["--input", "in", "--output", "out"], True),
    (["--input", "in", "--output", "out", "--runner", "DirectRunner"], True),
    (["--input", "gs://b/in", "--output", "out"], False),
    (["--input", "in", "--output=gs://b/out"], False),
    (["--input", "in", "--output", "out", "--labels_file", "s3://b/labels.txt"], False),
    (["--input", "in", "--output", "out", "--temp_location=gs://b/tmp"], False),
    (["--input", "file:///in", "--output", "out"], False),
    (["--input", "in", "--output", "out", "--runner", "DataflowRunner"], False),
    (["--input", "in", "--output", "out", "--runner=PortableRunner"], False),
])
def test_local_only_reads_the_command_line(argv, local):
    assert local_only(argv) is local


# In a new process: ``pipelines.cli.main`` given its arguments (a caller's own code), or nothing
# (``baseline``); then what the caller's process has of Beam: gs:// and s3://'s filesystems,
# Beam's connectors, and each module a lean import leaves out.
_AFTER_MAIN = """
import contextlib, importlib, io, json, sys
run = sys.argv[1:]
if run:
    from pipelines import cli
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(["prepare", *run])
    assert code == 0, code
import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from beam_prep.write.run.lean_imports import LOCAL_UNUSED, UNUSED

def imports(module):
    try:
        importlib.import_module(module)
        return True
    except ImportError:  # not installed here, in either process
        return False

print(json.dumps({
    "filesystems": {url: type(FileSystems.get_filesystem(url)).__name__ for url in ("gs://b/x", "s3://b/x")},
    "connectors": [n for n in ("ReadFromBigQuery", "ReadFromPubSub", "ReadFromMongoDB") if hasattr(beam.io, n)],
    "modules": {m: imports(m) for m in UNUSED + LOCAL_UNUSED},
}))
"""


def test_the_command_run_in_a_callers_process_leaves_its_beam_whole(tmp_path):
    """``pipelines.cli.main(["prepare", ...])`` called from a program: afterwards, that program's
    Beam has every filesystem and connector a plain ``import apache_beam`` gives it."""
    make_tree(tmp_path / "in", {"a": 2, "b": 2}, size=(20, 16))
    run = ["--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--image_size", "16",
           "--direct_running_mode", "in_memory"]  # a command line of local files: the leanest import
    after_main, baseline = (_after_main(argv) for argv in (run, []))
    assert (tmp_path / "out" / "manifest.json").exists()
    assert after_main["filesystems"] == {"gs://b/x": "GCSFileSystem", "s3://b/x": "S3FileSystem"}
    assert after_main == baseline


def _after_main(argv: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-c", _AFTER_MAIN, *argv], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])
