"""Third-party native output kept off a library caller's console: file descriptor 2 to a file.

Native code writes straight to fd 2, where neither Python's ``warnings`` nor
logging reach: TensorFlow's C++ log (CPU feature notes, "Type inference failed"
dumps), libtiff's messages about an image ("WEBP compression support is not
configured"), and a local run's worker processes, which inherit fd 2 (their
Pillow warnings and Beam's notes). The commands point fd 2 at a file for their
whole run (``pipelines.native_log``, and ``prepare``'s job log); the library's
``prepare`` and ``verify`` do the same for the length of the call, so that a
notebook or a script sees what beam-prep says and nothing else.

Only fd 2 moves: a ``sys.stderr`` that writes to it is pointed at the real
stderr meanwhile, so Python-level messages still show (a notebook's
``sys.stderr`` is no file descriptor at all and is left alone). Calls in several
threads at once share one file: the first moves fd 2, the last puts it back.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Iterator

__all__ = ["native_stderr_to_file"]

_LOG = logging.getLogger(__name__)
PREFIX = "beam-prep-native-"

_LOCK = threading.Lock()


class _Redirect:
    """fd 2 pointed at ``path`` while ``users`` > 0."""

    def __init__(self) -> None:
        self.users = 0
        self.path: str | None = None
        self.kept = False
        self._real: int | None = None
        self._stream: io.TextIOBase | None = None
        self._saved_stderr = None

    def enter(self, prefix: str) -> str | None:
        if self.users == 0:
            self._begin(prefix)
        self.users += 1
        return self.path

    def leave(self, keep: bool) -> str | None:
        self.kept = self.kept or keep
        self.users -= 1
        if self.users:
            return None
        path, kept = self.path, self.kept
        self._end()
        return path if kept else None

    def _begin(self, prefix: str) -> None:
        self.path, self.kept = None, False
        try:
            os.fstat(2)
            fd, path = tempfile.mkstemp(prefix=prefix, suffix=".log")
        except OSError:  # no fd 2 (a daemon), or no temp directory: nothing to keep off, or nowhere to put it
            return
        _flush(sys.stderr)
        self._real = os.dup(2)
        if _writes_to_fd2(sys.stderr):
            self._saved_stderr = sys.stderr
            sys.stderr = self._stream = os.fdopen(os.dup(self._real), "w", encoding="utf-8",
                                                  errors="backslashreplace", buffering=1)
        os.dup2(fd, 2)
        os.close(fd)
        self.path = path

    def _end(self) -> None:
        if self.path is None:
            return
        _flush(sys.stderr)
        os.dup2(self._real, 2)
        os.close(self._real)
        if self._saved_stderr is not None:
            if sys.stderr is self._stream:  # unless the caller replaced it meanwhile
                sys.stderr = self._saved_stderr
            with contextlib.suppress(OSError):
                self._stream.close()
        self._real = self._stream = self._saved_stderr = None
        if not self.kept:
            with contextlib.suppress(OSError):
                os.remove(self.path)


_REDIRECT = _Redirect()


@contextlib.contextmanager
def native_stderr_to_file(prefix: str = PREFIX) -> Iterator[str | None]:
    """For the ``with`` block, fd 2 goes to a new file in the temp directory (its path is yielded;
    None where fd 2 is closed or no file can be made, and nothing moves).

    The file is removed afterwards, unless the block raised an exception other than
    ``KeyboardInterrupt``: then it may hold the reason, and its path is logged.
    """
    with _LOCK:
        path = _REDIRECT.enter(prefix)
    failed = False
    try:
        yield path
    except KeyboardInterrupt:
        raise
    except BaseException:
        failed = True
        raise
    finally:
        with _LOCK:
            kept = _REDIRECT.leave(keep=failed)
        if kept is not None and os.path.getsize(kept):
            _LOG.warning("the native output of the call that failed (TensorFlow's, libtiff's, the workers'): %s", kept)
        elif kept is not None:
            with contextlib.suppress(OSError):
                os.remove(kept)


def _writes_to_fd2(stream: object) -> bool:
    """Whether ``stream`` writes to fd 2 (not when a test captures it, it is closed, or a notebook's)."""
    try:
        return stream is not None and stream.fileno() == 2
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False


def _flush(stream: object) -> None:
    with contextlib.suppress(AttributeError, OSError, ValueError):
        stream.flush()
