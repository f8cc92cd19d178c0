"""Storage: local and gs:// paths, the GCS client, TFRecord framing. Imports no other room."""
