"""``beam-prep report OUT``: one self-contained HTML page of what a run made, to open without the tool.

``gather`` reads what the page shows (counts exact, pictures and names capped by ``Limits``),
``render`` writes the page; :func:`make_report` does both and writes it, by default to
``OUT/report.html``. The guide's *Inspect, verify, bench* page shows one.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile

from beam_prep.io.storage import is_local, join, storage_error, write_bytes
from beam_prep.tools.report.gather import Limits, ReportData, gather
from beam_prep.tools.report.render import render

__all__ = ["REPORT", "Limits", "Report", "make_report"]

REPORT = "report.html"  # its name in the output folder, by default


@dataclasses.dataclass(frozen=True)
class Report:
    """A written report: where, its size in bytes, and what it shows."""

    path: str
    size: int
    data: ReportData


def make_report(output: str, to: str | None = None, limits: Limits | None = None) -> Report:
    """Writes the HTML report of the dataset at ``output`` (local or ``gs://``).

    Args:
      output: the output folder of a beam-prep run.
      to: where to write the page (local or ``gs://``); by default ``report.html`` in ``output``.
      limits: what the page shows at most (``Limits``); counts are exact whatever they say.

    Returns:
      The report written: its path, size and the data it shows (``data.notes``: the sections left
      incomplete, and why).

    Raises:
      DatasetError: ``output`` is not a dataset, or a side file is damaged (named).
      StorageError: something cannot be read, or the page cannot be written (named).
    """
    data = gather(output, limits or Limits())
    page = render(data).encode("utf-8")
    path = to or join(data.summary.root, REPORT)
    if is_local(path):
        _write_local(path, page)
    else:
        write_bytes(path, page, mime_type="text/html")
    return Report(path, len(page), data)


def _write_local(path: str, page: bytes) -> None:
    """Written whole or not at all: a reader never opens half a page, two runs never mix theirs."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, temporary = tempfile.mkstemp(prefix=".report-", suffix=".partial", dir=folder)
    except OSError as e:
        raise storage_error("write", path, e) from e
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(page)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except OSError as e:
        os.unlink(temporary)
        raise storage_error("write", path, e) from e
