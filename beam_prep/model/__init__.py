"""The dataset model the writer writes and the reader reads: the record spec, manifest.json, TFDS metadata."""
