"""``--runner``, checked before any work: Beam itself only refuses a bad one once the job starts.

Beam takes a runner by its class name in any case, with or without ``Runner`` (``direct``,
``DataflowRunner``), or by a class's dotted path (``my_package.runners.MyRunner``).
"""
from __future__ import annotations

import difflib
import importlib

from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.runners.runner import PipelineRunner

from beam_prep.errors import OptionsError

# Beam's own runners, by the names its docs give them.
KNOWN_RUNNERS = tuple(StandardOptions.KNOWN_RUNNER_NAMES)
_BY_LOWER = {name.lower(): name for name in KNOWN_RUNNERS}
# The runners whose workers run on this machine and see its files; None is Beam's default, DirectRunner.
LOCAL_RUNNERS = frozenset({None, "DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner",
                           "PrismRunner", "FnApiRunner"})

# Dataflow's worker counts, which a local run accepts and ignores, and the flag that sets a local run's.
REMOTE_WORKER_FLAGS = frozenset({"--num_workers", "--max_num_workers"})
LOCAL_WORKERS_FLAG = "--direct_num_workers"


def is_local_runner(runner: str | None) -> bool:
    """Whether ``runner`` (as ``check_runner`` names it) runs its workers on this machine.

    A class given by its dotted path counts by its class name: Beam's local runners by
    their path are local, any other class is taken to run its workers elsewhere.
    """
    return runner in LOCAL_RUNNERS or (runner is not None and runner.rpartition(".")[2] in LOCAL_RUNNERS)


def check_runner(runner: str | None) -> str | None:
    """The runner's name as Beam spells it (``direct`` is ``DirectRunner``); None stays None.

    Args:
      runner: the ``--runner`` value, as given.

    Raises:
      OptionsError: a name that is no Beam runner (the message lists the valid ones), or a dotted
        path that does not import or is not a ``PipelineRunner``.
    """
    if runner is None:
        return None
    known = _BY_LOWER.get(runner.lower()) or _BY_LOWER.get(runner.lower() + "runner")
    if known is not None:
        return known
    if "." in runner:
        return _check_dotted(runner)
    # Compared without the "Runner" they all end in, which would make any name look near.
    stems = {name.lower().removesuffix("runner"): name for name in KNOWN_RUNNERS}
    near = difflib.get_close_matches(runner.lower().removesuffix("runner"), list(stems), n=1)
    hint = f" (did you mean {stems[near[0]]}?)" if near else ""
    raise OptionsError(f"--runner {runner} is not a Beam runner{hint}: use one of {', '.join(KNOWN_RUNNERS)}, "
                       f"or a runner class's dotted path (package.module.Class)")


def _check_dotted(runner: str) -> str:
    module, _, name = runner.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError as e:
        raise OptionsError(f"--runner {runner}: cannot import {module} ({e})") from e
    if not (isinstance(found, type) and issubclass(found, PipelineRunner)):
        raise OptionsError(f"--runner {runner}: {module} has no PipelineRunner class {name}")
    return runner
