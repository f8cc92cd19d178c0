"""A run's plan: everything decided before the pipeline starts that the manifest records."""
from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["RunPlan"]


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """Everything decided before the pipeline starts, that the manifest records."""

    labels: list[str]
    num_shards: dict[str, int]  # split -> shard count (0: the runner's choice), in split order
    listed: int
    skipped: int
    sink: str
    skipped_by_reason: dict[str, int] = dataclasses.field(default_factory=dict)
    run_id: str = ""  # the run's folder under OUTPUT/.beam-prep until it publishes
    split_counts: dict[str, int] = dataclasses.field(default_factory=dict)  # images listed per split
    unknown_labels: int = 0  # images listed under a folder missing from --labels_file
    multi_label: bool = False  # records hold a list of label ids (--metadata's labels column)
    extra_features: dict[str, str] = dataclasses.field(default_factory=dict)  # --metadata's columns: key -> kind
    appended: dict[str, Any] | None = None  # an append's word on what it left out (append.Additions.to_json())
    # An append whose copies of the dataset's records reach the shards, set apart once written (WriteImageDataset's).
    copies_written: bool = False
