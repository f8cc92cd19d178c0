"""The command's ``--help`` and ``--help_beam``, built from the options' own declarations.

Beam parses the command line with a parser of its own, which knows none of our
options, so its ``--help`` lists none of them. Ours is built here from
``PrepareImagesOptions._add_argparse_args`` itself, its sections and all: an
option added there is in the help with its default, and no second list can drift.
"""
from __future__ import annotations

import argparse

from apache_beam.options.pipeline_options import PipelineOptions

from beam_prep.cli.flags import option_classes
from beam_prep.cli.options import DRY_RUN, DRY_RUN_HELP, RUN, PrepareImagesOptions, add_dry_run_argument
from beam_prep.write.run.beam_compat import BeamArgumentParser, add_options_arguments

__all__ = ["HELP_BEAM", "beam_option_parsers", "beam_options_help", "prepare_help", "prepare_parser"]

HELP_BEAM = "--help_beam"
_WIDTH = 100

USAGE = """\
beam-prep prepare --input ROOT --output OUT [options] [Beam options]
       python -m pipelines.prepare_images ...   (the same, without the installed script)"""

DESCRIPTION = """\
Turn a folder tree of labelled images, ROOT/<label>/<image> (or ROOT/<split>/<label>/<image>),
on local disk or gs://, into sharded TFRecords of tf.train.Example with a manifest.
With no --runner it runs here on Beam's DirectRunner, one worker process per core."""

EPILOG = f"""\
examples:
  # here, every core busy:
  beam-prep prepare --input photos --output photos-tfrecords \\
      --image_size 224 --validation_percent 10

  # on Google Cloud Dataflow:
  beam-prep prepare --input gs://BUCKET/images --output gs://BUCKET/records \\
      --runner DataflowRunner --project PROJECT --region us-central1 \\
      --temp_location gs://BUCKET/tmp --setup_file ./setup.py

Beam's options (--runner, --direct_num_workers, --project, --region, --temp_location,
--machine_type, --max_num_workers, ...) are passed to Beam; {HELP_BEAM} lists them all.
Every flag may be spelled with - or _ (--image-size, --image_size). --version prints the version.

progress: a local run draws a progress bar on a terminal (images done of listed, rate,
ETA, failures so far), or prints a line every --progress_interval seconds elsewhere.
On Dataflow the job's counters carry the same numbers: namespace beam_prep, listed,
written and failed_<stage>, on the job page's Job metrics tab or with
gcloud dataflow metrics list JOB_ID --region REGION --source=user.

first, on a big tree: --dry_run lists and plans (images per split, shards, labels, skipped
files) and writes nothing. A local run stopped by Ctrl-C, SIGTERM, a kill or a crash keeps
its finished shards: the same command again resumes it; --overwrite starts over.

exit codes: 0 done, 2 bad options or input (nothing was started), 1 the job failed,
130 / 143 stopped by Ctrl-C / SIGTERM (finished shards kept)."""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's and examples' lines, and adds each option's default.

    A flag's default is "off"; a default of None stands for a choice made later
    (a size, a count by input), which the option's help names itself.
    """

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_WIDTH, max_help_position=32)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or "(required" in text or action.default in (None, argparse.SUPPRESS):
            return text
        if action.nargs == 0:
            return f"{text} (default: {'on' if action.default else 'off'})"
        return f"{text} (default: %(default)s)"


def _parser(**kwargs: object) -> argparse.ArgumentParser:
    return BeamArgumentParser(add_help=False, allow_abbrev=False, formatter_class=_Formatter, **kwargs)


def prepare_parser() -> argparse.ArgumentParser:
    """The parser whose help is ``--help`` of ``beam-prep prepare``: our options, by section.

    It only prints: the command line is parsed by Beam's options classes
    (``beam_prep.cli.flags``). ``python -m pipelines.reference_docs`` writes the
    site's command-line reference from it too.
    """
    parser = _parser(prog="beam-prep prepare", usage=USAGE, description=DESCRIPTION, epilog=EPILOG)
    add_options_arguments(PrepareImagesOptions, parser)
    add_dry_run_argument(next(group for group in parser._action_groups if group.title == RUN))
    parser.add_argument("-h", "--help", action="store_true", default=argparse.SUPPRESS,
                        help="Show this help and exit.")
    parser.add_argument(HELP_BEAM, action="store_true", default=argparse.SUPPRESS,
                        help="List Beam's own options and exit.")
    return parser


def prepare_help() -> str:
    """``--help`` of ``beam-prep prepare`` and ``python -m pipelines.prepare_images``."""
    return prepare_parser().format_help()


def beam_option_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """(class name, its flags' parser) for each of Beam's options classes that has flags.

    Beam's own classes only (``apache_beam.options.pipeline_options``), in the order
    Beam defines them: other modules' subclasses exist or not depending on what was
    imported, and each is a section of ``--help_beam``.
    """
    found = []
    for cls in option_classes():
        if issubclass(cls, PrepareImagesOptions) or cls.__module__ != PipelineOptions.__module__:
            continue
        parser = _parser(usage=argparse.SUPPRESS)
        add_options_arguments(cls, parser)
        for action in parser._actions:
            if DRY_RUN in action.option_strings:  # Beam's own words are for testing runners
                action.help = DRY_RUN_HELP
        if parser._actions:  # argparse has no public count of its options.
            found.append((cls.__name__, parser))
    return found


def beam_options_help() -> str:
    """``--help_beam``: every flag Beam's options classes define, a section per class."""
    sections = ["Beam's options, which beam-prep passes to Beam (a section per Beam options class):"]
    for name, parser in beam_option_parsers():
        # The text starts with argparse's heading for options ("options:"): the class names the section.
        body = parser.format_help().strip().split("\n", 1)[1]
        sections.append(f"{name}:\n{body}")
    return "\n\n".join(sections) + "\n"
