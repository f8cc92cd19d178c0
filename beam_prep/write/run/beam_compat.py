"""Every use of Apache Beam's private API, each with why, so that a Beam upgrade is checked here alone.

Beam keeps no promise about names with a leading underscore, nor about the
runner modules under ``apache_beam.runners.portability``: any release may move
or change them. The rest of beam_prep uses Beam's public API only, and imports
what it cannot do without from here. When upgrading Beam, check each function
below against the new release (tests/cli/test_cli.py and tests/write/test_run.py exercise
them all).

Not here, because beam_prep frames TFRecords itself (``beam_prep.io.tfrecord``):
Beam's ``tfrecordio._TFRecordUtil``.
"""
from __future__ import annotations

import argparse
import logging
import re
from typing import TYPE_CHECKING, Any, TypeVar

from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

if TYPE_CHECKING:
    from apache_beam.runners.runner import PipelineRunner

__all__ = ["WORKER_LOG_RELAY", "BeamArgumentParser", "WorkerNoise", "add_options_arguments", "batch_fn_api_runner",
           "views_once", "worker_log_location"]

_View = TypeVar("_View", bound=PipelineOptions)

# The logger through which the local runner relays its worker processes' log records.
WORKER_LOG_RELAY = "apache_beam.runners.portability.local_job_service"
# The relayed record's text holds the worker's LogEntry in protobuf text form, on one line.
_LOG_LOCATION = re.compile(r'\blog_location: "((?:[^"\\]|\\.)*)"')


class BeamArgumentParser(_BeamArgumentParser):
    """Beam's argument parser, which every options class expects to be given.

    Options classes call its ``add_value_provider_argument`` in their
    ``_add_argparse_args``, which a plain ``argparse.ArgumentParser`` lacks, so
    a parser that holds every class's flags (``beam_prep.cli.flags``) must be one.
    """


def add_options_arguments(cls: type[PipelineOptions], parser: argparse.ArgumentParser) -> None:
    """Adds the flags an options class defines to ``parser``.

    ``_add_argparse_args`` is the hook each options class overrides, and the one
    Beam itself calls to collect flags (``PipelineOptions.get_all_options``);
    Beam has no public way to ask a class for its flags.
    """
    cls._add_argparse_args(parser)


def batch_fn_api_runner(options: PipelineOptions, worker_command: str | None = None) -> PipelineRunner:
    """Beam's batch FnApiRunner, built as DirectRunner builds it when it picks that runner.

    DirectRunner offers no public way to skip its attempt at the Prism runner
    (see ``beam_prep.write.run.pipeline.local_runner`` for why that must be skipped), so
    the runner is built as ``DirectRunner.run_pipeline`` builds it: with the
    options encoded into the provision info that its worker processes read
    (``--direct_num_workers``, ``--direct_running_mode``, ...).

    Args:
      options: the job's options.
      worker_command: the shell command that starts a worker process in the
        ``multi_processing`` mode, instead of Beam's ``python -m
        apache_beam.runners.worker.sdk_worker_main`` (``warm_pool``'s relay). The
        runner sets its environment (``_default_environment``) from that mode in
        ``run_pipeline``, with no way to give it another command: a subclass
        swaps the command as the environment is set.
    """
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    provision = fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
    if worker_command is None:
        return fn_runner.FnApiRunner(provision_info=provision)
    return _runner_with_worker_command(fn_runner.FnApiRunner, worker_command)(provision_info=provision)


class _ViewsOnce(PipelineOptions):
    """Options whose ``view_as`` makes each class's view once (see ``views_once``)."""

    def view_as(self, cls: type[_View]) -> _View:
        views = self.__dict__.setdefault("_views", {})
        view = views.get(cls)
        if view is None:
            view = views[cls] = super().view_as(cls)
        return view

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state.pop("_views", None)  # made again where unpickled
        return state


def views_once(options: PipelineOptions) -> PipelineOptions:
    """``options`` (the same values, shared: a change through either shows in both) whose views
    are each made once a class.

    Beam asks a pipeline's options for a view (``view_as``) a few hundred times
    while it builds and runs a job (each transform applied, each type check), and
    every view parses the command line again with a new argparse parser of its
    class's flags: about a tenth of a second of a launcher's start-up per hundred
    views. A view holds no value of its own (it reads and writes the options'
    ``_all_options``, private to Beam, shared here), so one per class gives the
    same answers.
    """
    if isinstance(options, _ViewsOnce):
        return options
    once = object.__new__(_ViewsOnce)
    once.__dict__.update(options.__dict__)
    return once


def _runner_with_worker_command(base: type, command: str) -> type:
    """``base`` (FnApiRunner) whose subprocess environment runs ``command``."""
    from apache_beam.transforms import environments

    class WithWorkerCommand(base):  # type: ignore[misc, valid-type]
        @property
        def _default_environment(self):
            return self.__dict__["_environment"]

        @_default_environment.setter
        def _default_environment(self, environment) -> None:
            if isinstance(environment, environments.SubprocessSDKEnvironment):
                environment = environments.SubprocessSDKEnvironment.from_command_string(command_string=command)
            self.__dict__["_environment"] = environment

    return WithWorkerCommand


class WorkerNoise(logging.Filter):
    """Drops the two warnings every local worker process relays on every run, which ask
    nothing of anyone: it was started without a ``semi_persistent_directory``, and it
    cannot parse our options (it needs Beam's alone). Beam's texts, as of 2.77."""

    NOISE = ("No semi_persistent_directory found", "Discarding unparseable args")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in self.NOISE)


def worker_log_location(record: logging.LogRecord) -> str | None:
    """Where in a worker's code a relayed record was logged (``/.../PIL/TiffImagePlugin.py:1508``),
    or None for a record the runner did not relay.

    The local runner's ``BeamFnLoggingServicer`` logs each worker's record as
    ``"Worker: %s"`` of the Fn API ``LogEntry``, whose ``log_location`` is the
    ``pathname:lineno`` of the worker's record (``FnApiLogRecordHandler``): the
    logger's name is lost, and the location is all that says whose record it was.
    """
    if record.name != WORKER_LOG_RELAY:
        return None
    match = _LOG_LOCATION.search(record.getMessage())
    return match.group(1) if match else None
