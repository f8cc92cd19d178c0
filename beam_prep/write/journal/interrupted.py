"""An interrupted run seen from outside: what ``inspect`` says of a folder with a run and no manifest.

A local run stopped midway (Ctrl-C, a kill, a crash) leaves its run folder under
``OUT/.beam-prep``: its record (``run.json``, with the command that resumes it) and
a ``<shard>.done.json`` per finished shard. Read here with the standard library
alone, so that ``inspect`` pays for no Beam import; ``resume`` is what resumes it.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shlex

from beam_prep.write.shared.layout import WORK_DIR

__all__ = ["DONE_SUFFIX", "RUN_FORMAT", "RUN_RECORD", "InterruptedRun", "find_interrupted"]

RUN_RECORD = "run.json"
# Bumped whenever a run folder's files change meaning (2: a shard's originals counts and hash file;
# 3: its records of one flat colour, skipped.jsonl, and --background).
RUN_FORMAT = 3
DONE_SUFFIX = ".done.json"


@dataclasses.dataclass(frozen=True)
class InterruptedRun:
    """A resumable run's folder: how far it got, and the command that resumes it."""

    run_id: str
    finished: int  # shards finished (their records written)
    shards: int  # shards planned
    images: int  # images planned
    command: list[str] | None  # the command that resumes it; None where the record holds none to show

    def describe(self, output: str) -> str:
        """One line: what the folder holds and what to do."""
        how = (f"run the same command again: {shlex.join(self.command)}" if self.command
               else "run the command that started it again, with the same options")
        return (f"{output} holds an interrupted run ({self.run_id}), not a dataset yet: {self.finished} of "
                f"{self.shards} shards done ({self.images:,} images planned), no manifest.json; to resume it, {how}")


def find_interrupted(output: str) -> InterruptedRun | None:
    """The one resumable run in the local folder ``output``, or None (none, several, unreadable, gs://)."""
    work = os.path.join(output, WORK_DIR)
    try:
        runs = [name for name in sorted(os.listdir(work)) if os.path.isdir(os.path.join(work, name))
                and not os.path.islink(os.path.join(work, name))]
    except OSError:  # no run folder, or not local
        return None
    if len(runs) != 1:
        return None
    folder = os.path.join(work, runs[0])
    try:
        with open(os.path.join(folder, RUN_RECORD), encoding="utf-8") as f:
            record = json.load(f)
        if record["run_format"] != RUN_FORMAT or record["run_id"] != runs[0]:
            return None
        plan = record["plan"]
        shards = sum(int(n) for n in plan["num_shards"].values())
        images = sum(int(n) for n in plan.get("split_counts", {}).values())
        finished = sum(name.endswith(DONE_SUFFIX) for name in os.listdir(folder))
        command = record.get("command")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # stopped while listing, or damaged
        return None
    return InterruptedRun(runs[0], finished, shards, images, command if _resumes(command, output) else None)


def _resumes(command: object, output: str) -> bool:
    """Whether ``command``, read from the folder, is one to show: ``beam-prep prepare`` into ``output``
    itself, without --overwrite (which would start over), in printable words. A run record is data:
    one written by someone else must not put another command, or another folder, before the user."""
    if not (isinstance(command, list) and all(isinstance(part, str) for part in command)):
        return False
    return (command[:2] == ["beam-prep", "prepare"] and "--overwrite" not in command
            and any(flag == "--output" and value == output for flag, value in itertools.pairwise(command))
            and all(part.isprintable() for part in command))
