"""TensorFlow's own C++ log, kept off the terminal of the commands that read a dataset.

TensorFlow's native code writes straight to file descriptor 2: CPU feature
notes, "could not find cuda drivers", tf.data buffer notes, type-inference
dumps from graph optimisation. Most come before its logging is initialised,
where ``TF_CPP_MIN_LOG_LEVEL`` does not reach them. In a command whose output is
a table, a verdict or one line of figures, they bury it.

``native_log_to_file`` runs a command's ``main`` with fd 2 pointed at a file in
the temp directory and Python's ``sys.stderr`` (our messages, the progress bar)
on the real stderr. The file is removed when the command succeeds or stops
on a usage error (exit code 2: a bad flag, no dataset at OUT, no such split),
whose message says it all; after a real failure its path is printed, as it may
hold the reason.
"""
from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
import tempfile
from collections.abc import Callable

PREFIX = "beam-prep-tensorflow-"
USAGE_ERROR = 2


def _real_stderr_fd() -> bool:
    """Whether ``sys.stderr`` writes to fd 2 (not when a test captures it, or it is closed)."""
    try:
        return sys.stderr is not None and sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False


def native_log_to_file(main: Callable[..., int]) -> Callable[..., int]:
    """Wraps a command's ``main``: see the module's docstring."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs) -> int:
        if not _real_stderr_fd():
            return main(*args, **kwargs)
        try:
            fd, path = tempfile.mkstemp(prefix=PREFIX, suffix=".log")
        except OSError:
            return main(*args, **kwargs)
        saved = sys.stderr
        saved.flush()
        real = os.dup(2)
        sys.stderr = os.fdopen(os.dup(real), "w", encoding="utf-8", errors="backslashreplace",
                               buffering=1)
        os.dup2(fd, 2)
        os.close(fd)
        code: object = 1
        try:
            code = main(*args, **kwargs)
            return code
        except SystemExit as e:  # argparse's exit: --help, --version, a usage error
            code = e.code
            raise
        finally:
            sys.stderr.flush()
            os.dup2(real, 2)
            os.close(real)
            with contextlib.suppress(OSError):
                sys.stderr.close()
            sys.stderr = saved
            if code not in (0, None, USAGE_ERROR) and os.path.getsize(path):
                print(f"(TensorFlow's own log for this run: {path})", file=sys.stderr)
            else:
                with contextlib.suppress(OSError):
                    os.remove(path)

    return wrapped
