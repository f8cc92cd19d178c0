"""``--max_failures``: how many files may fail before an automated job should see the run fail.

One bad image never fails a run: it is a line of errors.jsonl. A job that
prepares data unattended still needs to stop when a tenth of its input is
broken (a truncated download, a bucket without permission), so the run writes
everything it can, then the command exits 1 with one line when the failures
(``counts.failed``, errors.jsonl's lines) pass the budget. The budget is a count
(``10``) or a percent of the files listed (``2.5%``); checked before any work.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from beam_prep import wording
from beam_prep.errors import OptionsError

__all__ = ["allowed", "exceeded", "parse_max_failures"]

_COUNT = re.compile(r"\d+")
_PERCENT = re.compile(r"(\d+(?:\.\d*)?|\.\d+)%")


def parse_max_failures(text: str) -> str:
    """``--max_failures`` checked and spelled one way: a count (``"10"``) or a percent (``"2.5%"``).

    Raises:
      OptionsError: not a whole number of files at least 0, nor a percent from 0% to 100%.
    """
    value = str(text).strip().replace(" ", "")
    if _COUNT.fullmatch(value):
        return str(int(value))
    match = _PERCENT.fullmatch(value)
    if match and float(match.group(1)) <= 100:
        return f"{float(match.group(1)):g}%"
    raise OptionsError(f"--max_failures must be a number of files (0 or more, e.g. 10) or a percent of the "
                       f"files listed from 0% to 100% (e.g. 2.5%), not {text!r}")


def allowed(max_failures: str, listed: int) -> Fraction:
    """The failures ``max_failures`` allows among ``listed`` files: a percent's share exactly, not rounded."""
    if max_failures.endswith("%"):
        return Fraction(max_failures[:-1]) * listed / 100
    return Fraction(int(max_failures))


def exceeded(max_failures: str | None, counts: Mapping[str, Any], output: str) -> str | None:
    """The one line saying the run failed more files than ``max_failures`` allows; None where it did not.

    Args:
      max_failures: the checked ``--max_failures`` (``parse_max_failures``), or None for no budget.
      counts: the manifest's ``counts`` (``listed``, ``failed``).
      output: the dataset's folder, where errors.jsonl names the failed files.
    """
    if max_failures is None:
        return None
    failed, listed = counts["failed"], counts["listed"]
    if failed <= allowed(max_failures, listed):
        return None
    share = f"{100 * failed / listed:.3g}%" if listed else "0%"
    return (f"{wording.count(failed, 'file')} of {listed:,} failed ({share}), more than --max_failures "
            f"{max_failures} allows: the dataset was written all the same; see {output}/errors.jsonl")
