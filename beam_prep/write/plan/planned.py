"""A dry run's result: what a run would write, as an object a notebook keeps and prints.

``prepare(..., dry_run=True)`` returns it, and the command prints it (``str``).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from beam_prep.wording import count
from beam_prep.write.plan.run_plan import RunPlan

__all__ = ["PlannedRun", "SplitPlan"]

_LABELS_SHOWN = 8


@dataclasses.dataclass(frozen=True)
class SplitPlan:
    """One split as planned.

    Args:
      images: the images listed for it.
      shards: the shards they would go to (0: the runner's choice).
    """

    images: int
    shards: int


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """What a run of ``input`` into ``output`` would do; nothing was written.

    ``str()`` gives the lines ``beam-prep prepare --dry_run`` prints.

    Args:
      input: the image tree's root, as the run names it.
      output: the dataset folder the run would write.
      labels: the label names, in id order.
      splits: each split's images and shards (0 shards: the runner's choice), in split order.
      listed: images listed, every split.
      skipped: files passed over; ``skipped_by_reason`` says why.
      skipped_by_reason: reason -> files.
      unknown_labels: images under a folder missing from ``labels_file``: each would be an error.
      seconds: the time listing and planning took.
      job_built: a remote runner's dry run: the whole job was built, and not submitted.
    """

    input: str
    output: str
    labels: tuple[str, ...]
    splits: dict[str, SplitPlan]
    listed: int
    skipped: int
    skipped_by_reason: dict[str, int]
    unknown_labels: int
    seconds: float
    job_built: bool = False

    @classmethod
    def of(cls, plan: RunPlan, input: str, output: str, seconds: float, job_built: bool = False) -> PlannedRun:
        splits = {name: SplitPlan(plan.split_counts.get(name, 0), shards) for name, shards in plan.num_shards.items()}
        return cls(input, output, tuple(plan.labels), splits, plan.listed, plan.skipped,
                   dict(plan.skipped_by_reason), plan.unknown_labels, seconds, job_built)

    def to_json(self) -> dict[str, Any]:
        """As plain values (``splits``: name -> ``{"images", "shards"}``), for a log or a file."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        shown = ", ".join(self.labels[:_LABELS_SHOWN])
        if len(self.labels) > _LABELS_SHOWN:
            shown += f" and {len(self.labels) - _LABELS_SHOWN:,} more"
        lines = [f"dry run: {self.input} lists {count(self.listed, 'image')} in {count(len(self.labels), 'label')} "
                 f"({shown}); planned in {self.seconds:.1f} s, nothing written"]
        for name, split in self.splits.items():
            lines.append(f"  {name}: {count(split.images, 'image')} in {count(split.shards, 'shard')}")
        if self.unknown_labels:
            lines.append(f"  not written, label not in --labels_file: {count(self.unknown_labels, 'image')} "
                         "(each would be reported in errors.jsonl)")
        for reason, n in self.skipped_by_reason.items():
            lines.append(f"  skipped, {reason}: {n:,}")
        if self.job_built:
            lines.append("dry run: the job was built and not submitted")
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's display: a notebook cell ending in ``prepare(..., dry_run=True)`` shows the plan's lines."""
        printer.text(str(self))
