"""``beam-prep report OUT``: one self-contained HTML page of what a run made, to open without the tool.

``gather`` reads what the page shows (counts exact, pictures and names capped by ``Limits``),
``render`` writes the page; :func:`make_report` does both and writes it, by default to
``OUT/report.html``. The guide's *Inspect, verify, bench* page shows one.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile

from beam_prep.errors import DatasetError
from beam_prep.io.storage import is_local, join, open_to_read, storage_error, write_bytes
from beam_prep.tools.report.gather import Limits, ReportData, gather
from beam_prep.tools.report.render import render
from beam_prep.write.shared.layout import REPORT, REPORT_HEAD, is_report

__all__ = ["REPORT", "Limits", "Report", "make_report"]


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
      DatasetError: ``output`` is not a dataset, or a side file is damaged (named); or ``to`` is a folder, or
        (without ``to``) ``output`` holds a ``report.html`` that beam-prep did not write (a file, a link or
        a folder): that stays.
      StorageError: something cannot be read, or the page cannot be written (named).
    """
    path = to or join(output.rstrip("/") or output, REPORT)
    _check_target(path, mine=to is None)  # before the work, not after
    data = gather(output, limits or Limits())
    page = render(data).encode("utf-8")
    if is_local(path):
        _write_local(path, page)
    else:
        write_bytes(path, page, mime_type="text/html")
    return Report(path, len(page), data)


def _check_target(path: str, mine: bool) -> None:
    """Refuses to write over a folder, or (``mine``: the page's place in the dataset's folder) over anything
    but a page beam-prep wrote: a file of that name the user made stays, and so does a link, which is
    never followed.

    Raises:
      DatasetError: what stands there, and what to do.
      StorageError: it cannot be looked at.
    """
    try:
        if is_local(path):
            if not os.path.lexists(path):
                return
            if os.path.isdir(path) and not os.path.islink(path):
                raise DatasetError(f"cannot write the report to {path}: it is a folder; name a file (--to PAGE.html)")
            if not mine:
                return
            ours = os.path.isfile(path) and not os.path.islink(path)
        else:
            from apache_beam.io.filesystems import FileSystems

            if not mine or not FileSystems.exists(path):
                return
            ours = True
        if ours:
            with open_to_read(path) as f:
                ours = is_report(f.read(REPORT_HEAD))
    except DatasetError:
        raise
    except Exception as e:  # each filesystem raises its own types
        raise storage_error("read", path, e) from e
    if not ours:
        raise DatasetError(f"{path} is not a report beam-prep wrote: left as it is; move it away, or write the "
                           "report elsewhere with --to PAGE.html")


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
