"""Datasets that grow: the label ids a dataset has given out, and what an append adds to it
(docs/design/writer-rooms.md)."""
