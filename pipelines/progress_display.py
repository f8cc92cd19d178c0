"""What a user sees while a local run works: a progress bar on a terminal, a plain line elsewhere.

The counts come from the workers (``beam_prep.write.journal.progress``): images finished,
written or failed, not shards started. A terminal gets a tqdm bar (done of
listed, rate, ETA, failures so far) from when the first worker starts, so its
rate is the processing rate, not diluted by start-up. A log file or a pipe gets
one plain line every ``interval`` seconds, which a log keeps readably, and, if
it printed any, a last one with the final counts; a run shorter than ``interval``
prints none (its summary says it all).
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TextIO

from tqdm import tqdm

from beam_prep.write.journal.progress import Progress

__all__ = ["ProgressDisplay", "bar", "format_duration", "progress_line"]
# The size of a bar's terminal where it reports none: some pseudo-terminals say 0x0,
# where tqdm's own sizing draws an empty bar (0 columns) or none at all (0 rows).
FALLBACK_SIZE = os.terminal_size((100, 24))


def bar(stream: TextIO, **options) -> tqdm:
    """A tqdm bar on ``stream``, sized to its terminal, or to ``FALLBACK_SIZE`` where it reports none."""
    columns, lines = _size(stream)
    return tqdm(file=stream, dynamic_ncols=columns > 0, ncols=None if columns > 0 else FALLBACK_SIZE.columns,
                nrows=lines or FALLBACK_SIZE.lines, **options)


def _size(stream: TextIO) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return 0, 0
    return size.columns, size.lines


def format_duration(seconds: float) -> str:
    """``75`` -> ``1:15``, ``3725`` -> ``1:02:05``: short enough for a progress line."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def progress_line(progress: Progress, now: float) -> str:
    """One line for a log: ``beam-prep: 57 of 121 images (47%), 120 images/s, ETA 0:01, 1 failed``.

    The rate is since the first worker began, so start-up does not dilute it.
    """
    share = progress.done / progress.total if progress.total else 1.0
    parts = [f"beam-prep: {progress.done:,} of {progress.total:,} images ({share:.0%})"]
    rate, eta = progress.rate(now), progress.eta(now)
    if rate is not None:
        parts.append(f"{rate:,.0f} images/s")
    if eta is not None and not progress.finished:
        parts.append(f"ETA {format_duration(eta)}")
    parts.append(f"{progress.failed:,} failed")
    return ", ".join(parts)


class ProgressDisplay:
    """Called with the job's counts (``pipeline.run``'s ``on_progress``); ``close`` when the job ends."""

    def __init__(self, stream: TextIO, interval: float, clock: Callable[[], float] = time.time) -> None:
        """
        Args:
          stream: the console (stderr); a bar if it is a terminal, lines otherwise.
          interval: seconds between lines when ``stream`` is not a terminal.
          clock: wall time, the clock the workers' reports are in.
        """
        self._stream = stream
        self._interval = interval
        self._clock = clock
        self._terminal = _isatty(stream)
        self._bar: tqdm | None = None
        self._bar_done = False
        self._last_line_at = clock()
        self._last: Progress | None = None
        self._shown: Progress | None = None  # the counts of the last line printed
        self._lock = threading.Lock()  # called from the watcher's thread, closed from the launcher's

    @property
    def poll_interval(self) -> float:
        """How often the counts should be read: often enough for a smooth bar and for ``interval``."""
        return min(0.5, self._interval)

    def __call__(self, progress: Progress) -> None:
        with self._lock:
            self._last = progress
            if progress.started is None:
                return  # start-up: no worker has begun, nothing to show yet
            if self._terminal:
                self._draw(progress)
            elif self._clock() - self._last_line_at >= self._interval and not self._repeats(progress):
                self._print_line(progress)

    def close(self) -> None:
        """Ends the bar, or prints the last counts if they moved since the last line."""
        with self._lock:
            if self._bar is not None:
                self._draw(self._last)  # a bar is drawn from counts, so there are some
            if self._bar is not None:  # the job ended before its last image: the bar stops where it got
                self._bar.close()
                self._bar = None
            elif self._shown is not None and self._last != self._shown:
                self._print_line(self._last)

    def _repeats(self, progress: Progress) -> bool:
        """A finished count already shown: once the workers are done, the summary comes next."""
        return progress.finished and progress == self._shown

    def _draw(self, progress: Progress) -> None:
        if self._bar_done:
            return
        if self._bar is None:
            # Starting at the carried images, so that its rate is of the images processed.
            self._bar = bar(self._stream, total=progress.total, initial=progress.carried, unit="img",
                            desc="beam-prep", mininterval=0.5, smoothing=0.1)
        self._bar.set_postfix_str(f"{progress.failed:,} failed", refresh=False)
        self._bar.update(progress.done - self._bar.n)
        if progress.finished:
            # Closed with the last image, so its time and rate are the processing's, not the finishing's.
            self._bar.close()
            self._bar, self._bar_done = None, True

    def _print_line(self, progress: Progress) -> None:
        now = self._clock()
        print(progress_line(progress, now), file=self._stream, flush=True)
        self._last_line_at = now
        self._shown = progress


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
