"""Run beam-prep on a tree of files and hold every file's outcome against the reference.

A differential test: the command, run as a user runs it, against an independent
decode of the same files (``reference_image``). Each file must end as a record
that matches the reference, or as a line of errors.jsonl at the stage the strict
decoder names; what goes wrong is collected for all files at once, with the
measured figures, so one run tells a fixer every file that fails and why.
"""
from __future__ import annotations

import collections
import dataclasses
import io
import json
import os
import pathlib
import statistics
from collections.abc import Iterable
from typing import Any

import numpy as np
from helpers import read_split, run_prepare
from PIL import Image
from reference_image import Rejected, Target, mismatch, psnr, reference

from beam_prep.write.images import resample


@dataclasses.dataclass(frozen=True)
class Run:
    """What one run wrote, by the file's path relative to the tree."""

    manifest: dict[str, Any]
    errors: dict[str, dict[str, Any]]
    records: dict[str, dict[str, Any]]


def prepare(tree: pathlib.Path, out: pathlib.Path, *flags: str) -> Run:
    """``beam-prep prepare --input tree --output out FLAGS`` in a fresh process, read back.

    The resize kernel resizes from the first image (``BEAM_PREP_RESIZE_KERNEL=kernel``), as it
    does a large run's: a run this small would otherwise end before a worker loads it.
    """
    result = run_prepare("--input", str(tree), "--output", str(out), *flags,
                         env={**os.environ, resample.KERNEL_VARIABLE: resample.KERNEL})
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    lines = (out / "errors.jsonl").read_text().splitlines()
    errors = {e["relpath"]: e for e in map(json.loads, lines)}
    assert len(errors) == len(lines), "a file reported twice"
    records: dict[str, dict[str, Any]] = {}
    for split in manifest["splits"]:
        for record in read_split(out, split):
            name = record["image/filename"].decode()
            assert name not in records, f"{name} written twice"
            records[name] = record
    return Run(manifest, errors, records)


def assert_counts_add_up(run: Run, names: Iterable[str]) -> None:
    """The manifest's counts against what the run wrote, for a tree of ``names``, all images.

    ``listed`` counts the files that became a record or a report; ``skipped`` the
    files never read (hidden, not an image): none here, every name is a visible image.
    """
    names = sorted(names)
    counts = run.manifest["counts"]
    assert counts == {"listed": len(names), "written": len(run.records), "failed": len(run.errors),
                      "skipped": 0}, counts
    assert counts["listed"] == counts["written"] + counts["failed"]
    assert sorted([*run.records, *run.errors]) == names
    assert run.manifest["failed_by_stage"] == dict(collections.Counter(e["stage"] for e in run.errors.values()))
    splits = run.manifest["splits"].values()
    assert sum(info["num_examples"] for info in splits) == counts["written"]
    assert all(sum(info["class_counts"].values()) == sum(info["shard_num_examples"]) == info["num_examples"]
               for info in splits)


def stored_pixels(record: dict[str, Any]) -> np.ndarray:
    """A record's image, decoded by Pillow: HxWx3, or HxW for one channel."""
    return np.asarray(Image.open(io.BytesIO(record["image/encoded"])))


def features_disagree(record: dict[str, Any], pixels: np.ndarray) -> str | None:
    """Whether the record's height, width and channels features describe its image."""
    said = (int(record["image/height"]), int(record["image/width"]), int(record["image/channels"]))
    found = (*pixels.shape[:2], pixels.shape[2] if pixels.ndim == 3 else 1)
    return None if said == found else f"the features say {said}, the image is {found}"


@dataclasses.dataclass
class Verdicts:
    """Each file's outcome: ``psnr`` of the written ones that match, ``rejected`` (the strict
    decoder's reasons), and ``problems``: file -> what is wrong, the figures included."""

    psnr: dict[str, float] = dataclasses.field(default_factory=dict)
    rejected: dict[str, Rejected] = dataclasses.field(default_factory=dict)
    problems: dict[str, str] = dataclasses.field(default_factory=dict)

    def report(self, refused: bool | None = None) -> str:
        """The problems, one a line; of the files the strict decoder refused (``refused``), or
        of the others (not ``refused``), or of all (None). Empty when there are none."""
        shown = {name: why for name, why in self.problems.items()
                 if refused is None or (name in self.rejected) == refused}
        if not shown:
            return ""
        return f"{len(shown)} files:\n" + "\n".join(f"  {name}: {why}" for name, why in sorted(shown.items()))

    def figures(self, run: Run) -> str:
        """One line for the README: the run's counts and the PSNR of what it wrote."""
        counts = run.manifest["counts"]
        values = sorted(self.psnr.values())
        spread = (f"PSNR against the reference min {values[0]:.1f} dB, median {statistics.median(values):.1f} dB"
                  if values else "nothing compared")
        return (f"{counts['listed']} listed: {counts['written']} written, {counts['failed']} reported, "
                f"{counts['skipped']} skipped; {len(self.rejected)} refused by the strict decoder; {spread}; "
                f"{len(self.problems)} problems")


def judge(run: Run, tree: pathlib.Path, names: Iterable[str], target: Target) -> Verdicts:
    """Holds each of ``names`` (paths relative to ``tree``) in ``run`` against ``reference``.

    A file the strict decoder refuses must be reported at its stage, never written; any
    other must be written, and its pixels must pass ``mismatch``.
    """
    verdicts = Verdicts()
    for name in names:
        error, record = run.errors.get(name), run.records.get(name)
        try:
            want = reference(tree / name, target)
        except Rejected as e:
            verdicts.rejected[name] = e
            if record is not None:
                verdicts.problems[name] = f"written, but the strict decoder refuses it ({e})"
            elif error is None:
                verdicts.problems[name] = f"neither written nor reported (the strict decoder: {e})"
            elif error["stage"] != e.stage:
                verdicts.problems[name] = f"reported at stage {error['stage']}, not {e.stage} ({e})"
            continue
        if error is not None:
            verdicts.problems[name] = (f"reported at stage {error['stage']} ({error['message']}), "
                                       f"but the strict decoder reads it")
        elif record is None:
            verdicts.problems[name] = "neither written nor reported"
        else:
            got = stored_pixels(record)
            wrong = features_disagree(record, got) or mismatch(got, want)
            if wrong:
                verdicts.problems[name] = wrong
            else:
                verdicts.psnr[name] = psnr(got, want)
    return verdicts
