"""Records that came out one flat colour: counted, and the first few named, for a user to look at.

A source that decodes to nothing but black (or one colour) is no error a
decoder reports, yet it is worth a look: damage the decoder let through,
transparency on the wrong background, a blank scan. ``imaging`` flags each
image; the sinks gather them here, as counts and the first names in path order,
so the manifest says the same whichever sink wrote the dataset.
"""
from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable
from typing import Any

import apache_beam as beam

__all__ = ["EXAMPLES", "FlatImages", "FlatImagesFn", "is_many"]

EXAMPLES = 5  # names kept: enough to look at, few enough to print


@dataclasses.dataclass(frozen=True)
class FlatImages:
    """``count`` records of one flat colour; ``examples``: the first ``EXAMPLES`` relative paths, sorted."""

    count: int = 0
    examples: tuple[str, ...] = ()

    @classmethod
    def of(cls, paths: Iterable[str]) -> FlatImages:
        paths = list(paths)
        return cls(len(paths), tuple(heapq.nsmallest(EXAMPLES, paths)))

    @classmethod
    def from_json(cls, value: Any) -> FlatImages:
        """A shard record's or a manifest's ``flat``; absent (older runs) is none."""
        if isinstance(value, FlatImages):
            return value
        value = value or {}
        return cls(int(value.get("count", 0)), tuple(value.get("examples", ())))

    def merge(self, *others: FlatImages) -> FlatImages:
        parts = (self, *others)
        return FlatImages(sum(p.count for p in parts),
                          tuple(heapq.nsmallest(EXAMPLES, {e for p in parts for e in p.examples})))

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "examples": list(self.examples)}


def is_many(flat: FlatImages, written: int) -> bool:
    """Whether flat records are too many to be a dataset's few blank images: over 1% of those
    written, and more than one."""
    return flat.count > 1 and flat.count * 100 > written


class FlatImagesFn(beam.CombineFn):
    """Relative paths of flat records -> one ``FlatImages``: the shuffle sink's gathering."""

    def create_accumulator(self) -> FlatImages:
        return FlatImages()

    def add_input(self, acc: FlatImages, path: str) -> FlatImages:
        return acc.merge(FlatImages(1, (path,)))

    def merge_accumulators(self, accs: Iterable[FlatImages]) -> FlatImages:
        return FlatImages().merge(*accs)

    def extract_output(self, acc: FlatImages) -> FlatImages:
        return acc
