"""A running job's log file, and the one line a failed job comes down to.

A failed Beam job prints hundreds of lines: Beam relays each worker's traceback
as a log record, the multi-process DirectRunner's workers write theirs straight
to the stderr they inherit, and the launcher's own exception carries them all
again as text. The cause, e.g. a shard that cannot be written, is one line among
them. While a job runs, ``JobLog`` sends all of that to a file and lets only
beam-prep's own records through to the console; ``root_cause`` finds the line
worth showing. A run that succeeds leaves no log behind, unless Beam warned of
something: Pillow's records about the images it was given (a TIFF's bad tags)
are in the file but count for nothing, as each such image is in errors.jsonl.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import time
import traceback
from types import TracebackType
from typing import TextIO

from beam_prep.errors import BeamPrepError
from beam_prep.write.run.beam_compat import worker_log_location
from beam_prep.write.run.worker_errors import STEP_SUFFIX, raised_in_worker

# A module of Pillow's, by its file: a worker's relayed record names no logger, only its place.
_PILLOW_MODULE = re.compile(r"[/\\]PIL[/\\][^/\\]+\.py:\d+$")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JobFailed(BeamPrepError):
    """A job that failed while running; the message is its cause and where the full log is."""


def new_log_path(directory: str | None = None) -> str:
    """A fresh log file name: ``beam-prep-<UTC time>-<pid>.log`` in the temp directory.

    Not in --output: that may be gs:// or the very disk that just failed, and a
    dataset folder should hold only the dataset. Not the working directory: it
    may be read-only or a source checkout. The temp directory is local, writable,
    follows ``TMPDIR``, and is where files nobody means to keep belong; the time
    and process id keep concurrent runs apart and sort runs by start.
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return os.path.join(directory or tempfile.gettempdir(), f"beam-prep-{stamp}-{os.getpid()}.log")


def is_job_failure(error: BaseException) -> bool:
    """Whether ``error`` came out of the running job rather than the checks before it.

    beam-prep's own errors raised before the job (a bad --output, an empty tree)
    already say what to fix. Anything else escaping the runner is a job failure,
    and so is one of ours that Beam re-raised from a step (it names the step), or
    that a worker raised (``worker_errors.typed_errors``: Beam's error its cause).
    """
    return (not isinstance(error, BeamPrepError) or STEP_SUFFIX.search(str(error)) is not None
            or raised_in_worker(error) is not None)


def root_cause(error: BaseException) -> str:
    """The one line that says what went wrong, without Beam's ``[while running ...]``.

    Beam reports a worker's exception as a RuntimeError whose text is the remote
    traceback: the innermost exception in the chain that carries such a text
    gives its last ``<ExceptionType>: <message>`` line (``worker_errors``). An
    exception raised in this process (the in-memory runner re-raises the step's
    own) gives itself.
    """
    found = raised_in_worker(error)
    if found:
        return _describe(*found)
    if isinstance(error, BeamPrepError):
        return _describe("", str(error))
    return _describe(type(error).__qualname__, str(error))


def _describe(type_name: str, message: str) -> str:
    """Our own errors are written for users: their message alone; others keep the type."""
    message = STEP_SUFFIX.sub("", message).strip()
    if type_name.startswith("beam_prep.") or not type_name:
        return message
    return f"{type_name.rsplit('.', 1)[-1]}: {message}" if message else type_name.rsplit(".", 1)[-1]


def _from_beam_prep(record: logging.LogRecord) -> bool:
    return record.name == "beam_prep" or record.name.startswith("beam_prep.")


def _from_pillow(record: logging.LogRecord) -> bool:
    """Pillow's own record, logged in this process or relayed from a worker: about one image
    (``More samples per pixel than can be decoded``), whose failure errors.jsonl reports."""
    if record.name == "PIL" or record.name.startswith("PIL."):
        return True
    location = worker_log_location(record)
    return location is not None and _PILLOW_MODULE.search(location) is not None


class _LogFileHandler(logging.StreamHandler):
    """Writes records to the log; a write that fails (disk full) is noted, never printed."""

    def __init__(self, stream: TextIO):
        super().__init__(stream)
        self.failed = False
        self.hidden_warnings = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING and not (_from_beam_prep(record) or _from_pillow(record)):
            self.hidden_warnings += 1
        super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # logging's name.
        self.failed = True


class JobLog:
    """For the life of a ``with`` block, the process's stderr and log records go to ``path``.

    File descriptor 2 itself is redirected, not just ``sys.stderr``: the
    multi-process DirectRunner starts each worker with ``subprocess.Popen(...,
    shell=True)`` and no redirection (``local_job_service.SubprocessSdkWorker``),
    so workers inherit the launcher's stderr and write to it directly:
    Beam's ``sdk_worker`` prints a failed bundle's traceback there besides
    logging it. Workers start during the run, so they get the log file, and what
    they write after the launcher gives up still lands there. Warnings and
    errors from beam-prep's own loggers also go to the real stderr, formatted by
    ``console_format``; its INFO records stay in the file.

    The file is removed on leaving unless a failure was recorded or something
    other than beam-prep or Pillow logged a warning (``kept`` says whether).
    """

    def __init__(self, path: str, console_format: logging.Formatter):
        """Creates the file (only its owner may read it: it holds paths and options).

        Raises:
          OSError: if it cannot be created; nothing else has changed then.
        """
        self.path = path
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        self._file = os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace", buffering=1)
        self._console_format = console_format
        self._failure_recorded = False
        self.kept = False

    def __enter__(self) -> JobLog:
        fd = self._file.fileno()
        _flush(sys.stderr)
        self._real_stderr = os.dup(2)
        self._console = os.fdopen(os.dup(self._real_stderr), "w", encoding="utf-8",
                                  errors="backslashreplace", buffering=1)
        os.dup2(fd, 2)
        self._file_handler = _LogFileHandler(self._file)
        self._file_handler.setFormatter(logging.Formatter(LOG_FORMAT))
        console = logging.StreamHandler(self._console)
        console.addFilter(_from_beam_prep)
        console.setLevel(logging.WARNING)
        console.setFormatter(self._console_format)
        root = logging.getLogger()
        self._saved_handlers = list(root.handlers)
        for handler in self._saved_handlers:
            root.removeHandler(handler)
        root.addHandler(self._file_handler)
        root.addHandler(console)
        self._console_handler = console
        return self

    @property
    def console(self) -> TextIO:
        """The real stderr, while fd 2 goes to the log: for what the user must see as the job runs."""
        return self._console

    @property
    def hidden_warnings(self) -> int:
        """Warnings and errors logged by others than beam-prep and Pillow: in the file only."""
        return self._file_handler.hidden_warnings

    @property
    def failure_recorded(self) -> bool:
        return self._failure_recorded

    @property
    def complete(self) -> bool:
        """False when a write to the log failed (e.g. its disk is full)."""
        return not self._file_handler.failed

    def record_failure(self, error: BaseException) -> None:
        """Writes the failure's full traceback to the log, and keeps the file."""
        self._failure_recorded = True
        try:
            self._file.write("The job failed:\n" + "".join(traceback.format_exception(error)))
            self._file.flush()
        except OSError:
            self._file_handler.failed = True

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        root = logging.getLogger()
        root.removeHandler(self._file_handler)
        root.removeHandler(self._console_handler)
        for handler in self._saved_handlers:
            root.addHandler(handler)
        _flush(sys.stderr)
        os.dup2(self._real_stderr, 2)
        os.close(self._real_stderr)
        for stream in (self._console, self._file):
            with contextlib.suppress(OSError):
                stream.close()
        self.kept = self._failure_recorded or self.hidden_warnings > 0
        if not self.kept:
            with contextlib.suppress(OSError):
                os.remove(self.path)


def _flush(stream: TextIO) -> None:
    """Buffered text must reach the file descriptor it was meant for before that changes."""
    with contextlib.suppress(OSError, ValueError):
        stream.flush()
