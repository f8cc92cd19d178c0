"""What a benchmark ran on, so numbers pasted into the README can be judged."""
from __future__ import annotations

import importlib.metadata
import os
import pathlib
import platform

import psutil

PACKAGES = ("apache-beam", "tensorflow", "pillow")


def machine_info() -> dict[str, object]:
    """CPU, cores, RAM, Python and the versions that decide the numbers.

    Package versions come from installed metadata, so TensorFlow and Beam need
    not be imported into the measuring process.
    """
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": versions,
    }


def busy_percent(seconds: float = 2.0) -> float:
    """How busy the CPUs are before we start: other work on a small machine skews every number."""
    return psutil.cpu_percent(interval=seconds)


def describe(info: dict[str, object]) -> str:
    """One line: ``AMD EPYC, 2 cores, 23.4 GiB RAM; Python 3.11.7; apache-beam 2.77.0, ...``."""
    packages = ", ".join(f"{name} {version}" for name, version in info["packages"].items())
    return (
        f"{info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB RAM; "
        f"Python {info['python']}; {packages}"
    )


def _cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"
