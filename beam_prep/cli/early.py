"""``beam-prep prepare``'s first workers, started from its arguments once it has imported Beam.

A local run's worker processes need Beam, Pillow, numpy and the kernel, about a
second of a core to import. Forked from the launcher once it has imported Beam
(``warm_pool``), they have them at the cost of a fork, and wait while the
launcher lists the tree. Only the command line is known this early, so it is
read as Beam will read it, for the few flags that decide whether a local
multi-process run follows.
"""
from __future__ import annotations

import gc
import os
from collections.abc import Sequence

from beam_prep.cli.spelling import flag_value
from beam_prep.write.run import warm_pool
from beam_prep.write.run.lean_imports import import_beam

__all__ = ["early_workers", "import_beam_then_start_workers", "local_only", "start_workers_early"]

# Flags after which no run follows (help, the version) or none with workers (a dry run).
_NO_RUN = frozenset({"-h", "--help", "--help_beam", "--version", "--dry_run"})


def early_workers(argv: Sequence[str]) -> int | None:
    """The workers a ``prepare`` command line asks for, as far as it can be told before Beam
    parses it: ``--direct_num_workers``, or where it is 0 or absent, as many as the run is
    likely to fit to (``warm_pool.expected_workers``: one a core for a large tree, one for
    the sample); None for another runner or mode, a dry run or help."""
    if any(arg.partition("=")[0] in _NO_RUN for arg in argv):
        return None
    if flag_value(argv, "--runner") not in (None, "DirectRunner") \
            or flag_value(argv, "--direct_running_mode") not in (None, "multi_processing"):
        return None
    workers = flag_value(argv, "--direct_num_workers")
    if workers is not None and workers.isdigit() and int(workers) > 0:
        return int(workers)
    return warm_pool.expected_workers(flag_value(argv, "--input") or "", os.cpu_count() or 1)


def local_only(argv: Sequence[str]) -> bool:
    """Whether a ``prepare`` command line runs locally on local files only: no argument holds a
    URL (``gs://``, ``s3://``, ``file://``: any path of Beam's filesystems but a plain one), and
    the runner is Beam's local one. Then its launcher and workers import Beam without
    ``lean_imports.LOCAL_UNUSED``. Any argument counts, whatever its flag."""
    return flag_value(argv, "--runner") in (None, "DirectRunner") and not any("://" in arg for arg in argv)


def start_workers_early(argv: Sequence[str], fork: bool = False) -> None:
    """Starts the workers ``argv`` (``prepare``'s arguments) asks for (``warm_pool.start_early``;
    ``fork``: forked from this process); the command closes them when it ends
    (``warm_pool.close_early``) if no run took them."""
    count = early_workers(argv)
    if count is not None:
        warm_pool.start_early(count, local=local_only(argv), fork=fork)


def import_beam_then_start_workers(argv: Sequence[str]) -> None:
    """A ``prepare`` command's first step: Beam imported, as lean as ``argv`` allows
    (``local_only``), then its workers forked from this process (``start_workers_early``).

    What the imports made is moved out of the garbage collector's sight (``gc.freeze``) before the
    fork: it lives as long as the process, so no collection need walk it again, in the launcher
    (whose listing and append make objects by the million) or in a forked worker (whose collections
    then leave those objects, shared with the launcher since the fork, untouched)."""
    import_beam(local=local_only(argv))
    gc.freeze()
    start_workers_early(argv, fork=True)
