"""Beam's import without the parts a beam-prep process never uses.

``import apache_beam`` imports every IO connector Beam ships and, where it is
installed, pandas (for Beam's DataFrame type hints): about a third of its
import's CPU, paid by the launcher and again by every worker, and none of it
used by a run. Beam imports each of those under ``try: ... except
ImportError``, so while ``import_beam`` runs they are reported missing and
Beam goes on without them. A run whose command line names local files only
(``beam_prep.cli.early.local_only``) leaves out ``LOCAL_UNUSED`` as well: the
filesystems of remote storage, Dataflow's client and Arrow, which Beam imports
only where installed, another fifth of a process's import. The refusal ends
with the import: whatever asks for one of them later (a user's own code, a
Dataflow submission) imports it as usual. Only processes beam-prep starts for
itself use it (the command's launcher, its warm workers), never a library
caller's, nor one that calls ``pipelines.cli.main`` with its arguments.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Sequence

__all__ = ["LOCAL_UNUSED", "UNUSED", "import_beam"]

# Each is imported by Beam under an ``except ImportError`` (apache_beam/io/__init__.py,
# apache_beam/typehints/__init__.py); tests/write/test_lean_imports.py checks that Beam still imports.
# MongoDB's client (pymongo, with its bson) too: apache_beam/io/mongodbio.py, which then logs a
# warning that ``_QUIET`` keeps off the console.
UNUSED = ("pandas", "apache_beam.io.gcp.bigquery", "apache_beam.io.gcp.pubsub", "pymongo", "bson")
# What a run on local files with a local runner never uses, each imported by Beam only where it
# is installed (apache_beam/io/filesystems.py, runners/dataflow/dataflow_runner.py,
# utils/retry.py, typehints/__init__.py): the filesystems of gs://, s3://, Azure and HDFS,
# Dataflow's API client, apitools (Dataflow's and GCS's HTTP errors), Arrow (Beam's batched DoFns).
LOCAL_UNUSED = ("apache_beam.io.gcp.gcsfilesystem", "apache_beam.io.aws", "apache_beam.io.azure",
                "apache_beam.io.hadoopfilesystem", "google.cloud.dataflow", "apitools", "pyarrow")


# Loggers of Beam modules that warn when a module ``UNUSED`` names is missing, silenced for the import.
_QUIET = ("apache_beam.io.mongodbio",)


class _Refuse(importlib.abc.MetaPathFinder):
    """Reports ``names`` (and their submodules) as not installed."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = frozenset(names)
        self._packages = tuple(f"{refused}." for refused in names)

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name in self._names or name.startswith(self._packages):  # asked of every import: kept cheap
            raise ModuleNotFoundError(f"{name} is left out of this process's import of Beam", name=name)
        return None


def import_beam(*modules: str, local: bool = False) -> None:
    """Imports ``apache_beam`` and ``modules`` with ``UNUSED`` left out, and ``LOCAL_UNUSED``
    too where ``local`` (a run on local files only); a no-op for what is already imported.
    An import that fails here raises as it would anywhere."""
    finder = _Refuse(UNUSED + LOCAL_UNUSED if local else UNUSED)
    quiet = [logging.getLogger(name) for name in _QUIET]
    was = [logger.disabled for logger in quiet]
    sys.meta_path.insert(0, finder)
    for logger in quiet:
        logger.disabled = True
    try:
        import apache_beam  # noqa: F401 - the package's own imports are the point

        for module in modules:
            importlib.import_module(module)
    finally:
        sys.meta_path.remove(finder)
        for logger, disabled in zip(quiet, was):
            logger.disabled = disabled
