"""Times one ``FileSystems.match(PATTERN)`` in a fresh process; prints ``seconds matched``.

    python -m tests.gcs_harness.children.beam_match_timing gs://BUCKET/PATTERN

A fresh process, so the time includes Beam's credential lookup.
"""
import sys
import time

from apache_beam.io.filesystems import FileSystems

if __name__ == "__main__":
    start = time.monotonic()
    result = FileSystems.match([sys.argv[1]])
    print(time.monotonic() - start, len(result[0].metadata_list))
