"""The command's launcher and warm workers import Beam without its unused connectors and pandas
(``lean_imports``), and nothing is refused once that import is done."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import REPO

from beam_prep.write.run.lean_imports import UNUSED

pytestmark = pytest.mark.slow  # a fresh interpreter: this one has imported them all already

# In a new process: what the worker's preparation and then the launcher's import leave out, whether
# Beam's own names are all there, and whether each left-out module still imports afterwards.
_PROBE = """
import json, sys
from beam_prep.write.run import warm_worker
from beam_prep.write.run.lean_imports import UNUSED, import_beam
warm_worker._prepare()
import_beam()
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


def test_beam_imports_without_the_unused_modules_and_they_import_later():
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, cwd=REPO, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["missing"] == list(UNUSED)  # left out of the worker's and the launcher's import
    assert seen["names"] and seen["restored"]
    assert seen["later"] == list(UNUSED)  # the refusal ends with the import
    assert done.stderr == ""  # the worker's preparation is silent
