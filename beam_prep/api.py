"""The Python API beside the command: ``beam_prep.prepare`` runs the job the command runs.

Both go through ``parse_command_line``, so a notebook gets the same up-front
checks (unknown options with the nearest known one, bad values, an output
inside the input, a busy or occupied output folder) and the same local
defaults (every core busy) as ``python -m pipelines.prepare_images``.

``prepare`` behaves as a library: with logging left unconfigured it prints
nothing (Beam's ``PipelineOptions`` would configure the root logger, and its
local workers relay two warnings on every run; Pillow warns about odd images,
libtiff and the workers write to fd 2, which ``native_stderr`` points at a file
for the call); what the caller should see comes as a ``BeamPrepWarning``;
messages name keywords (``image_size``, ``overwrite=True``), not flags.
"""
from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import PIL
from apache_beam.options.pipeline_options import PipelineOptions

from beam_prep.cli.flags import bare_flags, check_flags, check_positionals, spelled_as_known
from beam_prep.cli.options import config_from_options
from beam_prep.cli.spelling import as_keywords, flag_value
from beam_prep.errors import BeamPrepError, BeamPrepWarning, RunInterrupted
from beam_prep.native_stderr import native_stderr_to_file
from beam_prep.write.grow.append import appending_config
from beam_prep.write.journal.progress import Progress
from beam_prep.write.plan.config import PrepareConfig
from beam_prep.write.plan.planned import PlannedRun
from beam_prep.write.run.beam_compat import WORKER_LOG_RELAY, WorkerNoise
from beam_prep.write.run.pipeline import run

__all__ = ["parse_command_line", "prepare", "with_local_defaults"]

_PILLOW_FOLDER = os.path.dirname(os.path.abspath(PIL.__file__))


def with_local_defaults(argv: Sequence[str]) -> list[str]:
    """Every core busy by default: multi-process DirectRunner unless the user chose otherwise.

    The worker count is Beam's 0, one a core, which the run lowers for a small job
    (``warm_pool.IMAGES_PER_WORKER``); a count the user gives is kept. The in-memory
    mode runs one worker and gets no count: Beam warns about any other.
    """
    argv = list(argv)
    runner = flag_value(argv, "--runner")
    if runner is None:
        argv.append("--runner=DirectRunner")
        runner = "DirectRunner"
    if runner == "DirectRunner":
        mode = flag_value(argv, "--direct_running_mode")
        if mode is None:
            argv.append("--direct_running_mode=multi_processing")
        if flag_value(argv, "--direct_num_workers") is None and mode != "in_memory":
            argv.append("--direct_num_workers=0")
    return argv


def parse_command_line(argv: Sequence[str]) -> tuple[PipelineOptions, PrepareConfig]:
    """Beam's options and ours from command-line arguments, every check done.

    Raises:
      OptionsError: an unknown flag, an argument without a flag (``prepare tree out``:
        did you mean ``--input tree --output out``?), a bad value or a bad input, before any work.
    """
    argv = _dry_run_as_bool(spelled_as_known(argv))
    check_flags(argv)
    check_positionals(argv)
    options = PipelineOptions(with_local_defaults(argv))
    config = config_from_options(options)
    if config.append:
        config = appending_config(config, {token[2:].split("=", 1)[0] for token in argv if token.startswith("--")})
    return options, config


_FALSE = ("false", "0", "no")
_TRUE = ("true", "1", "yes")


def _dry_run_as_bool(argv: list[str]) -> list[str]:
    """``--dry_run`` alone means True, and ``--dry_run=false`` False.

    Beam's flag takes any string, and reads "false" as true.
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return out + argv[i:]
        if token == "--dry_run":
            # Only a yes or no is its value: ``--dry_run tree out`` is a flag, then two paths.
            value = argv[i + 1] if i + 1 < len(argv) and argv[i + 1].lower() in _FALSE + _TRUE else None
            i += 1 if value is None else 2
            if value is None or value.lower() not in _FALSE:
                out.append("--dry_run=True")
            continue
        if token.startswith("--dry_run="):
            if token.split("=", 1)[1].lower() not in _FALSE:
                out.append("--dry_run=True")
            i += 1
            continue
        out.append(token)
        i += 1
    return out


def options_to_argv(input: str, output: str, options: Mapping[str, Any]) -> list[str]:
    """``prepare``'s keyword arguments as command-line flags: ``image_size=64`` is ``--image_size 64``.

    True gives a bare flag (``overwrite=True``), False and None leave it out, and a
    list repeats it (``experiments=["a", "b"]``).
    """
    argv = ["--input", input, "--output", output]
    for name, value in options.items():
        flag = f"--{name}"
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return argv


def prepare(input: str, output: str, *, on_progress: Callable[[Progress], None] | None = None,
            **options: Any) -> dict[str, Any] | PlannedRun | None:
    """Prepares ``input`` (``ROOT/<label>/<image>``) into ``output``, as ``beam-prep prepare`` does.

    The same checks, defaults and job as the command, for a notebook or a
    script: ``prepare("imgs", "out", image_size=160, validation_percent=10,
    overwrite=True)``. It behaves as a library: with logging left unconfigured
    it prints nothing, what needs the caller's attention comes as a
    ``BeamPrepWarning``, and messages name keywords (``image_size``), not flags.

    Args:
      input: the image tree's root, a local path or ``gs://bucket/prefix`` (``--input``).
      output: the dataset folder to write, local or ``gs://`` (``--output``).
      on_progress: on a local runner, called about twice a second from another
        thread with the workers' counts so far (``beam_prep.write.journal.progress.Progress``:
        ``done``, ``failed``, ``total``), last with the final ones: what the
        command's progress bar shows, for a notebook's or a service's own display.
        None: no progress is reported.
      **options: the command's flags and Beam's, by name without the dashes
        (``image_size=224``, ``runner="DataflowRunner"``): True gives a bare flag
        (``overwrite=True``), False or None leaves it out, a list repeats it.
        docs/reference/cli.md lists them all.

    Returns:
      The manifest that was written (a dict, as in manifest.json); with ``dry_run=True``,
      the plan (``PlannedRun``: ``labels``, ``splits`` with each one's images and
      shards, ``listed``, ``skipped_by_reason``; ``print`` shows what the command
      prints), or None for an append that would add nothing (it warns).

    Raises:
      OptionsError: bad options or input (an unknown keyword, with the nearest
        known one), found before any work.
      StorageError: a path that cannot be listed, read or written.
      DatasetError: the job's counts do not add up, so no manifest was published.
      TooManyFailures: more files failed than ``max_failures`` allows; the dataset was
        written all the same (its manifest is the error's ``result.manifest``).
      CrossSplitLeakage: ``cross_split_duplicates="fail"`` and copies lie in two splits;
        the dataset was written all the same (its manifest is the error's ``result.manifest``).
      RunInterrupted: a local run stopped by Ctrl-C or SIGTERM (its finished shards kept).
    """
    with _as_a_library(), native_stderr_to_file():
        pipeline_options, config = parse_command_line(options_to_argv(input, output, options))
        result = run(config, pipeline_options, on_progress)
        return result.manifest if result.manifest is not None else result.planned


@contextlib.contextmanager
def _as_a_library() -> Iterator[None]:
    """For one ``prepare`` call: nothing printed where logging is unconfigured.

    Beam's workers' routine warnings are dropped, and messages and warnings name keywords.
    """
    root = logging.getLogger()
    # A root logger without handlers: Beam would give it one (logging.basicConfig()),
    # and Python's last resort would print warnings. A handler that drops them stops both.
    stand_in = logging.NullHandler() if not root.handlers else None
    if stand_in is not None:
        root.addHandler(stand_in)
    relay, noise = logging.getLogger(WORKER_LOG_RELAY), WorkerNoise()
    relay.addFilter(noise)
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as recorded:
            caught = recorded
            try:
                yield
            except (BeamPrepError, RunInterrupted) as e:
                e.args = (as_keywords(str(e), bare_flags()), *e.args[1:])
                raise
    finally:
        relay.removeFilter(noise)
        if stand_in is not None:
            root.removeHandler(stand_in)
        for w in caught:
            if issubclass(w.category, BeamPrepWarning):
                warnings.warn(as_keywords(str(w.message), bare_flags()), w.category, stacklevel=4)
            elif not _from_pillow(w):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


def _from_pillow(caught: warnings.WarningMessage) -> bool:
    """Whether ``caught`` is Pillow's, about one image ("Corrupt EXIF data", "Invalid APNG").

    As in the command's log, such a warning counts for nothing: an image Pillow cannot
    read whole is in errors.jsonl.
    """
    return os.path.dirname(os.path.abspath(caught.filename)) == _PILLOW_FOLDER
