"""The one shape every benchmark's ``--json`` file has, so the performance pages can be rendered from it.

A benchmark makes a :class:`Recording` when it starts (the command line, the
date, the load average before) and calls :meth:`Recording.write` at the end
with its own results; the file then reads::

    {"benchmark": "writer", "command": "python -m benchmarks.bench_writer --images 20000 ...",
     "date": "2026-11-26T00:40:12+00:00",
     "machine": {"cpu": ..., "cores": 2, "ram_gib": ..., "platform": ...,
                 "load_average_before": [0.4, 0.6, 0.9], "load_average_after": [...]},
     "versions": {"python": "3.11.7", "beam-prep": "<commit>", "pillow": ..., ...},
     "results": {...}}

``python -m benchmarks.report`` renders ``docs/performance/`` from such files.
"""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence

from benchmarks import REPO_ROOT, machine

# What decides the numbers, by distribution name; a package not installed is recorded as None.
PACKAGES = ("apache-beam", "tensorflow", "pillow", "pillow-simd", "numpy", "numba", "isal", "protobuf",
            "array-record", "img2dataset", "pyvips", "opencv-python-headless", "simplejpeg", "torch", "torchvision",
            "grain", "jax", "webdataset", "py-spy")


def versions() -> dict[str, str | None]:
    """Python, beam-prep's commit (``+changes`` when the work tree differs from it) and :data:`PACKAGES`.

    Returns:
        The versions by name, read from installed metadata: nothing is imported.
    """
    found: dict[str, str | None] = {"python": platform.python_version(), "beam-prep": _commit()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def _commit() -> str | None:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{commit[:12]}+changes" if changed else commit[:12]


class Recording:
    """One benchmark run's record: made at its start, written at its end.

    Args:
        benchmark: the page key the results belong to (``writer``, ``writer-formats``, ``reader``...).
        argv: the arguments the benchmark was given (``sys.argv[1:]`` by default).
        module: the module run with ``python -m`` (the caller's, by default).
    """

    def __init__(self, benchmark: str, argv: Sequence[str] | None = None, module: str | None = None) -> None:
        self.benchmark = benchmark
        argv = sys.argv[1:] if argv is None else list(argv)
        module = module or _main_module()
        self.command = shlex.join(["python", "-m", module, *argv])
        self.date = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
        self.load_before = [round(x, 2) for x in os.getloadavg()]

    def document(self, results: object, other_versions: Mapping[str, str] | None = None) -> dict[str, object]:
        """The whole record, ``results`` under ``"results"``; the load average is read now.

        Args:
            results: the benchmark's own numbers, JSON-serialisable.
            other_versions: packages the benchmark ran in other environments (the writer's peers),
                by distribution name: added to this environment's.

        Returns:
            The record as a dict.
        """
        info = machine.machine_info()
        info.pop("packages", None)
        info.pop("python", None)
        info["load_average_before"] = self.load_before
        info["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        return {"benchmark": self.benchmark, "command": self.command, "date": self.date, "machine": info,
                "versions": {**versions(), **(other_versions or {})}, "results": results}

    def write(self, path: pathlib.Path | str | None, results: object,
              other_versions: Mapping[str, str] | None = None) -> dict[str, object]:
        """Writes :meth:`document` to ``path`` (nothing when it is None) and returns it.

        Args:
            path: the ``--json`` file, or None.
            results: the benchmark's own numbers, JSON-serialisable.
            other_versions: as :meth:`document`'s.

        Returns:
            The record as a dict.
        """
        record = self.document(results, other_versions)
        if path is not None:
            path = pathlib.Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
        return record


def _main_module() -> str:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec.name if spec is not None else "benchmarks"
