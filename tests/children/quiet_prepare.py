"""Calls ``beam_prep.prepare`` as a script would, logging left unconfigured, on a local
runner with two worker processes; writes nothing of its own.

    python -m tests.children.quiet_prepare INPUT OUTPUT

A fresh process, so that no test has configured logging or imported Beam before.
"""
import logging
import sys

import beam_prep

if __name__ == "__main__":
    source, target = sys.argv[1:3]
    manifest = beam_prep.prepare(source, target, image_size=16, direct_num_workers=2)
    # The call left the process's logging as it found it: a script's warning still shows.
    assert not logging.getLogger().handlers, logging.getLogger().handlers
    assert manifest["counts"]["written"] == manifest["counts"]["listed"]
