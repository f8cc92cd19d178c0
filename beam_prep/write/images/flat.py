"""Records that came out one flat colour: every one named in flat.jsonl, a few in the summary.

A source that decodes to nothing but black (or one colour) is no error a
decoder reports, yet it is worth a look: damage the decoder let through,
transparency on the wrong background, a blank scan. ``imaging`` flags each
image with its colour; the sinks gather them here, each file once, sorted by
path, so the manifest and flat.jsonl say the same whichever sink wrote the dataset.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

import apache_beam as beam

from beam_prep.write.images.imaging import Flat
from beam_prep.write.shared.entry import FileEntry, printable

__all__ = ["EXAMPLES", "GREY", "FlatImages", "FlatImagesFn", "advice", "file_row", "is_many", "lines"]

EXAMPLES = 5  # names the manifest and the summary keep: enough to look at, few enough to print
# The background that shows shapes drawn in black and in white alike (icons, logos, line art).
GREY = "#808080"


def file_row(entry: FileEntry, flat: Flat) -> dict[str, Any]:
    """flat.jsonl's line for one record: its file, label, colour, and whether that is its
    transparency on ``--background``."""
    label = entry.label if entry.labels is None else list(entry.labels)
    return {"path": printable(entry.path), "relpath": printable(entry.relpath), "label": label,
            "colour": flat.colour, "transparent": flat.transparent}


@dataclasses.dataclass(frozen=True)
class FlatImages:
    """``count`` records of one flat colour; ``files``: each one's ``file_row``, sorted by relative
    path (a record of a run from before flat.jsonl names only ``examples``)."""

    count: int = 0
    files: tuple[Mapping[str, Any], ...] = ()
    older_examples: tuple[str, ...] = ()

    @classmethod
    def of(cls, rows: Iterable[Mapping[str, Any]]) -> FlatImages:
        files = tuple(sorted(rows, key=lambda r: r["relpath"]))
        return cls(len(files), files)

    @classmethod
    def from_json(cls, value: Any) -> FlatImages:
        """A shard record's or a manifest's ``flat``; absent (older runs) is none."""
        if isinstance(value, FlatImages):
            return value
        value = value or {}
        files = tuple(value.get("files", ()))
        return cls(int(value.get("count", len(files))), files, () if files else tuple(value.get("examples", ())))

    @property
    def examples(self) -> tuple[str, ...]:
        """The first ``EXAMPLES`` relative paths."""
        paths = [f["relpath"] for f in self.files] or list(self.older_examples)
        return tuple(sorted(paths)[:EXAMPLES])

    @property
    def transparent(self) -> int:
        """Those whose colour is their transparency on the background."""
        return sum(1 for f in self.files if f.get("transparent"))

    def merge(self, *others: FlatImages) -> FlatImages:
        parts = (self, *others)
        files = tuple(sorted((f for p in parts for f in p.files), key=lambda r: r["relpath"]))
        older = tuple(sorted({e for p in parts for e in p.older_examples}))
        return FlatImages(sum(p.count for p in parts), files, older)

    def to_json(self) -> dict[str, Any]:
        """A shard record's: every file."""
        return {"count": self.count, "files": list(self.files)}

    def manifest(self) -> dict[str, Any]:
        """The manifest's ``flat_images``: the count, the first names, and how many are transparent."""
        return {"count": self.count, "examples": list(self.examples), "transparent": self.transparent}


def lines(flat: FlatImages) -> list[str]:
    """flat.jsonl: one JSON object a line, sorted by relative path."""
    return [json.dumps(dict(f), ensure_ascii=False, sort_keys=True) for f in flat.files]


def is_many(count: int, written: int) -> bool:
    """Whether flat records are too many to be a dataset's few blank images: over 1% of those
    written, and more than one."""
    return count > 1 and count * 100 > written


def advice(flat: Mapping[str, Any], background: str | None) -> str:
    """What to do about a manifest's ``flat_images``: where their colour is their transparency on
    ``--background`` (shapes drawn in that very colour: a black icon on black, a white logo on white,
    so black and white each leave some flat), a mid grey that shows both."""
    transparent = int(flat.get("transparent") or 0)
    if not transparent:
        return "look at a few (blank scans, or damage the decoder let through?)"
    if (background or "").lower() == GREY:
        return (f"{transparent:,} of them have transparency and show nothing even on a mid grey: wholly "
                "transparent, or shapes drawn in grey; look at a few")
    return (f"{transparent:,} of them have transparency drawn in the --background colour ({background or 'white'}), "
            f"so their shapes vanish (black and white both leave some): pass --background '{GREY}', a mid grey "
            "on which black and white shapes both show")


class FlatImagesFn(beam.CombineFn):
    """flat.jsonl rows of flat records -> one ``FlatImages``: the shuffle sink's gathering."""

    def create_accumulator(self) -> list[Mapping[str, Any]]:
        return []

    def add_input(self, acc: list[Mapping[str, Any]], row: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        acc.append(row)
        return acc

    def merge_accumulators(self, accs: Iterable[list[Mapping[str, Any]]]) -> list[Mapping[str, Any]]:
        return [row for acc in accs for row in acc]

    def extract_output(self, acc: list[Mapping[str, Any]]) -> FlatImages:
        return FlatImages.of(acc)
