"""The order of splits for copies across them: which split keeps its copy with
``--cross_split_duplicates drop``, and how a pair of splits is named in the leakage counts.

Train first: it is what a model learns from, and a copy held out of it is one example fewer;
then the validation split (``validation``, then ``val``: a tree's split folders may use
either); then any other split, by name; ``test`` last, the split looked at last, left clean of
all the others. See docs/design/duplicates.md.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from beam_prep.write.shared.entry import DEFAULT_SPLIT, VALIDATION_SPLIT

__all__ = ["TEST_SPLIT", "kept_split", "ordered", "pair_name", "rank", "sorted_pairs"]

TEST_SPLIT = "test"
_FIRST = (DEFAULT_SPLIT, VALIDATION_SPLIT, "val")


def rank(split: str) -> tuple[int, str]:
    """A split's sort key: train, validation, val, the others by name, test."""
    if split in _FIRST:
        return _FIRST.index(split), ""
    return (len(_FIRST) + 1, "") if split == TEST_SPLIT else (len(_FIRST), split)


def ordered(splits: Iterable[str]) -> list[str]:
    """``splits`` in their order (``rank``), each once."""
    return sorted(set(splits), key=rank)


def kept_split(splits: Iterable[str]) -> str:
    """The split of a group of copies whose files are all kept: the first of its splits."""
    return min(splits, key=rank)


def pair_name(a: str, b: str) -> str:
    """How the leakage counts name a pair of splits: ``train/validation``, the first by ``rank`` first."""
    first, second = sorted((a, b), key=rank)
    return f"{first}/{second}"


def sorted_pairs(counts: Mapping[str, int]) -> dict[str, int]:
    """Counts per pair of splits (named by ``pair_name``: a split name holds no ``/``), in the
    splits' order: ``train/validation`` before ``train/test`` before ``validation/test``."""
    return dict(sorted(counts.items(), key=lambda item: [rank(s) for s in item[0].split("/", 1)]))
