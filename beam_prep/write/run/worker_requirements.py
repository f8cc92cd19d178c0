"""What Dataflow workers staged with ``--setup_file`` must install beside beam-prep for ``--file_format``.

Beam stages ``--setup_file``'s package and its workers install it with its
``install_requires`` only, never an extra: a worker would meet a missing
``array_record`` at its first shard. So the launcher adds the format's library
to the job's ``--requirements_file`` (a copy of the user's, if given, with the
line added), which Beam stages and every worker installs at start-up. Without
a file of the user's, Beam is told not to download the requirement at launch
(``--requirements_cache skip``): the workers install it from PyPI, as they
install the rest. The worker image the Dockerfile builds
(``--sdk_container_image``) has the libraries already.
"""
from __future__ import annotations

import logging
import tempfile

from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions, WorkerOptions

from beam_prep.errors import OptionsError
from beam_prep.write.shared.shard_formats import writer_library

__all__ = ["add_format_requirement"]

_LOG = logging.getLogger(__name__)
_SKIP_CACHE = "skip"  # Beam's stager.SKIP_REQUIREMENTS_CACHE


def add_format_requirement(options: PipelineOptions, file_format: str) -> str | None:
    """Adds ``file_format``'s writer library to the requirements ``--setup_file`` workers install.

    Returns:
      The requirements file the job now stages, or None where nothing was needed (a format
      with no library, no ``--setup_file``, or a worker image).

    Raises:
      OptionsError: the user's ``--requirements_file`` cannot be read.
    """
    library = writer_library(file_format)
    setup = options.view_as(SetupOptions)
    if library is None or not setup.setup_file or options.view_as(WorkerOptions).sdk_container_image:
        return None
    lines: list[str] = []
    if setup.requirements_file:
        try:
            with open(setup.requirements_file, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError as e:
            raise OptionsError(f"cannot read --requirements_file {setup.requirements_file}: {e}") from e
    elif setup.requirements_cache is None:
        setup.requirements_cache = _SKIP_CACHE
    lines.append(library.requirement)
    with tempfile.NamedTemporaryFile("w", prefix="beam-prep-requirements-", suffix=".txt", delete=False,
                                     encoding="utf-8") as f:
        f.write("".join(f"{line}\n" for line in lines))
    setup.requirements_file = f.name
    _LOG.info("--file_format %s: the workers install %s (--requirements_file %s)", file_format,
              library.requirement, f.name)
    return f.name
