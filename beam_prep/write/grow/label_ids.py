"""Label ids a dataset has given out: a model trained on it reads its outputs by them.

An ``--overwrite`` that would give a class another id than the dataset it replaces gave it
is said before any work, with how to keep the ids.
"""
from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import NamedTuple

from beam_prep import wording
from beam_prep.errors import BeamPrepWarning, DatasetError
from beam_prep.io.storage import join, read_bytes
from beam_prep.model.dataset import MANIFEST, DatasetInfo, parse_manifest

__all__ = ["Move", "moves", "warn_if_ids_move"]

_LOG = logging.getLogger(__name__)
_SHOWN = 5  # the moves a warning names; it counts the rest


class Move(NamedTuple):
    """A class whose stored id changes: ``old`` in the dataset, ``new`` in the run replacing it."""

    label: str
    old: int
    new: int


def moves(old: Sequence[str], old_offset: int, new: Sequence[str], new_offset: int) -> list[Move]:
    """The classes in both label lists whose stored ids differ (index plus offset), in the new order.

    Args:
      old, old_offset: the dataset's labels (its manifest's, labels.txt's order) and ``label_offset``.
      new, new_offset: the same for the run that replaces it.

    Returns:
      Each class that keeps its name but not its id; a class only in one list is not a move.
    """
    was = {label: i + old_offset for i, label in enumerate(old)}
    return [Move(label, was[label], i + new_offset) for i, label in enumerate(new)
            if label in was and was[label] != i + new_offset]


def warn_if_ids_move(output: str, labels: Sequence[str], label_offset: int) -> None:
    """Warns (``BeamPrepWarning``) when the dataset in ``output`` gave any of ``labels`` another id.

    Nothing is said where ``output`` holds no readable manifest: there are no ids to keep.

    Args:
      output: the dataset folder an ``--overwrite`` run replaces.
      labels, label_offset: the run's label order and ``--label_offset``.
    """
    where = join(output, MANIFEST)
    try:
        text = read_bytes(where)
    except Exception:  # noqa: BLE001 - no dataset, or none readable: no ids to keep
        return
    try:
        dataset = DatasetInfo.from_json(parse_manifest(text, where), output, where)
    except DatasetError as e:
        _LOG.info("not comparing label ids with %s: %s", where, e)
        return
    moved = moves(dataset.labels, dataset.label_offset, labels, label_offset)
    if not moved:
        return
    shown = ", ".join(f"{m.label!r} {m.old} -> {m.new}" for m in moved[:_SHOWN])
    more = f" and {len(moved) - _SHOWN} more" if len(moved) > _SHOWN else ""
    warnings.warn(BeamPrepWarning(
        f"--overwrite gives {wording.count(len(moved), 'class', 'classes')} of the dataset in {output} other ids "
        f"({shown}{more}), so a model trained on it would read the wrong labels: to keep their ids, add the "
        f"new images with --append instead, or pass --labels_file listing its classes in their order "
        f"({join(output, 'labels.txt')}'s names) and new ones after them"), stacklevel=3)
