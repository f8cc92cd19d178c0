"""What ``verify`` reports: the kinds of problem, each problem, the report, and the
thread-safe list that collects them, capped per kind."""
from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Mapping

__all__ = ["KINDS", "MAX_PER_KIND", "Problem", "Problems", "VerifyReport"]

# Problem kinds, in the order a report lists them.
MANIFEST_PROBLEM = "manifest"
LABELS_FILE = "labels_file"
MISSING_SHARD = "missing_shard"
EXTRA_SHARD = "extra_shard"
DAMAGED_SHARD = "damaged_shard"
SHARD_COUNT = "shard_count"
SHARD_SHA256 = "shard_sha256"  # a shard read whole whose bytes are not the manifest's shard_sha256
SPLIT_COUNT = "split_count"
CLASS_COUNT = "class_count"
BAD_RECORD = "bad_record"
IMAGE_SHAPE = "image_shape"
LABEL_RANGE = "label_range"
LABEL_TEXT = "label_text"
RUN_COUNTS = "run_counts"
DALI_INDEX = "dali_index"  # a shard's DALI index (io.dali_index) missing, or not matching the shard
HASH_FILES = "hash_files"  # a kept hash file (write.finish.kept_hashes) missing, or not what the manifest says
KINDS = (MANIFEST_PROBLEM, RUN_COUNTS, LABELS_FILE, MISSING_SHARD, EXTRA_SHARD, DAMAGED_SHARD, SHARD_COUNT,
         SHARD_SHA256, SPLIT_COUNT, CLASS_COUNT, BAD_RECORD, IMAGE_SHAPE, LABEL_RANGE, LABEL_TEXT, DALI_INDEX,
         HASH_FILES)

MAX_PER_KIND = 20


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong: ``kind`` (one of ``KINDS``), ``where`` (a file, with a record's
    index and source file name; or a split, or a split's class) and what is wrong."""

    kind: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """What ``verify`` found. ``ok`` when there are no problems.

    ``problems`` holds up to ``max_per_kind`` of each kind, in ``KINDS`` order;
    ``more`` counts, by kind, those left out. ``records`` and ``shards`` are what
    was read (records of damaged shards up to the damage); ``expected_records``
    what the manifest lists.
    """

    root: str
    problems: tuple[Problem, ...]
    more: Mapping[str, int]
    records: int
    expected_records: int
    shards: int
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def num_problems(self) -> int:
        return len(self.problems) + sum(self.more.values())

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


class Problems:
    """Thread-safe, capped per kind."""

    def __init__(self, max_per_kind: int):
        self._max = max_per_kind
        self._kept: dict[str, list[Problem]] = collections.defaultdict(list)
        self._more: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def add(self, kind: str, where: str, message: str) -> None:
        with self._lock:
            if len(self._kept[kind]) < self._max:
                self._kept[kind].append(Problem(kind, where, message))
            else:
                self._more[kind] += 1

    def result(self) -> tuple[tuple[Problem, ...], dict[str, int]]:
        # Sorted within a kind: shards are read at once, in no fixed order.
        problems = tuple(p for kind in KINDS
                         for p in sorted(self._kept.get(kind, ()), key=lambda p: p.where))
        return problems, {kind: self._more[kind] for kind in KINDS if self._more[kind]}
