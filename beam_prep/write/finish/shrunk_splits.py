"""Splits that ``--cross_split_duplicates drop`` left far smaller than planned: said at the end.

The drop keeps a copy in the earlier split (train) and leaves out the later one (validation,
test), so a tree with many copies loses them from its evaluation splits: a stratified 10% can
come out at 5%, some classes with almost none. The split order stays (it is what the option
says, and a kept training copy is never the one evaluated); the run says how far each split
and class fell, why, and what to do, from the manifest alone (``duplicates.dropped_by_split`` and
``dropped_by_class``).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from beam_prep import wording
from beam_prep.write.shared import layout, split_order

__all__ = ["SHOWN", "messages"]

SHOWN = 5  # classes named a split
# A split that lost more than this share of its planned files to the drop is said to have shrunk;
# a class that lost more than half of its own is named.
_SPLIT_LOSS = 0.25
_CLASS_LOSS = 0.5


def messages(manifest: Mapping[str, Any], validation_percent: float = 0.0) -> list[str]:
    """One message per split (after the first) that the drop left far below its plan, naming the
    classes that lost most of theirs; none where nothing was dropped.

    Args:
      manifest: the written dataset's manifest.
      validation_percent: the share asked for validation (``--validation_percent``; 0: a tree
        already split), said beside the share it came out at.

    Returns:
      The messages, in the splits' order.
    """
    found = manifest.get("duplicates") or {}
    dropped, by_class = found.get("dropped_by_split") or {}, found.get("dropped_by_class") or {}
    splits = manifest.get("splits") or {}
    total = sum(s.get("num_examples", 0) for s in splits.values())
    out = []
    for split in split_order.ordered(dropped):
        if split not in splits:
            continue
        left_out = int(dropped[split])
        written = splits[split].get("num_examples", 0)
        planned = written + left_out
        counts = splits[split].get("class_counts") or {}
        classes = sorted(((n, label) for label, n in (by_class.get(split) or {}).items()
                          if n > _CLASS_LOSS * (n + counts.get(label, 0))), reverse=True)
        if not left_out or (left_out <= _SPLIT_LOSS * planned and not classes):
            continue
        share = f"{100 * written / total:.1f}% of the records" if total else "no records"
        asked = f", not the {validation_percent:g}% asked" if split == "validation" and validation_percent else ""
        named = ", ".join(f"{label} {n:,} of {n + counts.get(label, 0):,}" for n, label in classes[:SHOWN])
        more = f" and {len(classes) - SHOWN:,} more" if len(classes) > SHOWN else ""
        most = f"; classes that lost most of theirs: {named}{more}" if classes else ""
        more_asked = " or raise --validation_percent," if asked else ""
        out.append(
            f"{split} came out at {wording.count(written, 'record')} of the {planned:,} planned ({share}{asked}): "
            f"{left_out:,} copied an image of an earlier split and were left out (--cross_split_duplicates drop, "
            f"each in {layout.SKIPPED}){most}. To keep its share, remove the earlier split's copies "
            f"({layout.DUPLICATES} names both),{more_asked} and run again")
    return out
