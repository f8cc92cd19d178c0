"""The writer: an image tree (or a pipeline's own elements) to sharded TFRecords and a manifest.

Its modules live in sub-rooms, each importing only those before it: ``shared`` < ``images``
< ``plan`` < ``journal`` < ``finish`` < ``sinks`` < ``run`` (tests/test_layout.py keeps it so).
What each room holds, and why this order: docs/design/writer-rooms.md.
"""
