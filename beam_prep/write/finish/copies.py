"""An append's new records whose bytes the dataset holds already, set apart once they are written.

``prepare --append`` hashes each new file before any work and writes no copy of a record
(``append.narrow``); ``WriteImageDataset`` learns an element's sha256 only once a worker has read
it, so its copies reach the shards. Its manifest step sets them apart here, before the duplicate
search (which then sees the records the command's would), and ``drop`` leaves them out of the
shards: a record at the path of a record of the dataset with its bytes is that record, unchanged;
any other is a copy (skipped.jsonl, ``append.COPY_REASON``), each counted as the command counts it.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from beam_prep.write.finish import duplicates, near_earlier
from beam_prep.write.shared import hash_lines
from beam_prep.write.shared.spill import SpillFolder

__all__ = ["Copy", "split_off"]


@dataclasses.dataclass(frozen=True)
class Copy:
    """A new record whose bytes an earlier version's record has.

    Attributes:
      path: its source, as its hash line names it (``printable``).
      split: the split it was written to.
      sha256: its source's sha256 (hex).
      labels: its label, or a multi-label record's labels.
      of: the earlier record's source (the first version's with those bytes, then the first by path).
      of_split: that record's split.
      unchanged: the earlier record is at ``path``: the same file, not a copy of it.
    """

    path: str
    split: str
    sha256: str
    labels: tuple[str, ...]
    of: str
    of_split: str
    unchanged: bool

    def appended_row(self) -> dict[str, Any]:
        """The row ``append.Additions.copies`` holds for it, as ``append.narrow`` makes one."""
        return {"path": self.path, "sha256": self.sha256, "split": self.split, "of": self.of,
                "of_split": self.of_split}


def split_off(kept: list[tuple[str, str | None, int]], run_files: list[str],
              folder: SpillFolder) -> tuple[list[str], list[Copy]]:
    """The run's hash files without the lines of records whose bytes an earlier version's record has,
    and those records.

    Args:
      kept: each earlier version's kept hash file, its version's input, and the version
        (``near_earlier.matching``'s).
      run_files: the run's hash files, sorted.
      folder: where a hash file that loses lines is written again (local); the others are returned as
        they are.

    Returns:
      The hash files to search for duplicates, in the order of ``run_files``, and the records set apart,
      in the order their lines were read.

    Raises:
      DatasetError: a line is not a hash line. StorageError: a file cannot be read.
    """
    earlier = _earlier_records(kept, run_files)
    if not earlier:
        return run_files, []
    files: list[str] = []
    found: list[Copy] = []
    for i, path in enumerate(run_files):
        target, before = folder.file(f"without-copies-{i:05d}.txt"), len(found)
        with open(target, "wb") as out:
            for _, lines in duplicates.read_chunks([path]):
                for line in lines:
                    if not line:
                        continue
                    parsed = hash_lines.parse(path, line)
                    records = earlier.get(parsed.sha256)
                    if records is None:
                        out.write(line + b"\n")
                        continue
                    _, of, of_split = min(records)
                    found.append(Copy(json.loads(parsed.path), parsed.split.decode(), parsed.sha256.decode(),
                                      _labels(parsed.label), json.loads(of), of_split.decode(),
                                      any(quoted == parsed.path for _, quoted, _ in records)))
        if len(found) == before:
            os.remove(target)
            files.append(path)
        else:
            files.append(target)
    return files, found


def _earlier_records(kept: list[tuple[str, str | None, int]],
                     run_files: list[str]) -> dict[bytes, list[tuple[int, bytes, bytes]]]:
    """The sha256 of each earlier version's record whose sha256 begins as a new one's (``near_earlier.matching``:
    a copy, but for the rare prefix two contents share) -> its records' ``(version, path as JSON, split)``."""
    folder = SpillFolder(prefix="beam-prep-copies-")
    try:
        earlier: dict[bytes, list[tuple[int, bytes, bytes]]] = {}
        for file, version, _ in near_earlier.matching(kept, duplicates.read_chunks(run_files), None, folder):
            for _, lines in duplicates.read_chunks([file]):
                for line in lines:
                    if line:
                        parsed = hash_lines.parse(file, line)
                        earlier.setdefault(parsed.sha256, []).append((version, parsed.path, parsed.split))
        return earlier
    finally:
        folder.close()


def _labels(label: bytes) -> tuple[str, ...]:
    """A hash line's label as a tuple of names (none where it is unknown)."""
    named = json.loads(label)
    return tuple(named) if isinstance(named, list) else (named,) if named is not None else ()
