"""Calls ``beam_prep.prepare`` and then the library's ``verify`` as a script would, logging left
unconfigured; writes nothing of its own.

    python -m tests.children.quiet_library INPUT OUTPUT RUNNING_MODE

A fresh process, so that no test has configured logging or imported Beam or TensorFlow before.
"""
import sys

import beam_prep
from beam_prep.tools.verification import verify

if __name__ == "__main__":
    source, target, mode = sys.argv[1:4]
    manifest = beam_prep.prepare(source, target, image_size=16, direct_running_mode=mode,
                                 **({"direct_num_workers": 2} if mode != "in_memory" else {}))
    assert manifest["counts"]["failed"] > 0, manifest["counts"]  # damaged images: in errors.jsonl, said nowhere else
    assert verify(target).ok
