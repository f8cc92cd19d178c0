"""beam-prep: labelled image folder trees to sharded TFRecords, and back."""

__version__ = "0.1.0"
