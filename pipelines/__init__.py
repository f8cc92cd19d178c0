"""Runnable Beam pipelines (``python -m pipelines.<name>``)."""
