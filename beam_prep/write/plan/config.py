"""A run's configuration (``PrepareConfig``) and its checks, before any work starts.

The command line declares its flags in ``beam_prep.cli.options``, which reads them into a
``PrepareConfig`` with ``config_from_flags``; ``WriteImageDataset`` checks its arguments of
the same names with ``check_values`` and ``image_spec``.
"""
from __future__ import annotations

import dataclasses
import os
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    WorkerOptions,
)

from beam_prep.errors import BeamPrepWarning, OptionsError
from beam_prep.io.storage import is_local
from beam_prep.model.dataset import COMPRESSIONS, FILE_FORMATS, TFRECORD, shard_suffix
from beam_prep.write.images import jpeg_path, resample
from beam_prep.write.images.imaging import (
    DEFAULT_BACKGROUND,
    ORIGINAL,
    OUTPUT_FORMATS,
    RESIZE_MODES,
    ImageSpec,
    parse_colour,
)
from beam_prep.write.images.phash import DEFAULT_DISTANCE
from beam_prep.write.images.readahead import DEFAULT_MAX_BYTES, ReadAheadConfig
from beam_prep.write.plan.failure_budget import parse_max_failures
from beam_prep.write.plan.metadata import check_path
from beam_prep.write.plan.runners import LOCAL_WORKERS_FLAG, REMOTE_WORKER_FLAGS, check_runner, is_local_runner
from beam_prep.write.shared.entry import printable
from beam_prep.write.shared.shard_formats import check_installed

SINKS = ("auto", "streaming", "shuffle")
# labels.txt's forms: one name a line (line number = index in the labels), or TF-slim's
# "id:name" lines (ids as stored, label_offset included). See dataset.labels_lines.
LABELS_TXT_FORMS = ("names", "slim")
# What a run does about a copy or near copy across splits (docs/design/duplicates.md).
DROP = "drop"  # leave out each cross-split group's files outside its kept split (finish.drop)
CROSS_SPLIT_ACTIONS = ("report", "fail", DROP)
# --append_check: how an append tells a file at a path the dataset holds unchanged: by its size and stamp
# (``write.plan.listing.stamps``), reading it only where they differ from its record's, or by its bytes.
APPEND_CHECKS = ("stat", "content")
MAX_NEAR_DUPLICATE_DISTANCE = 32  # half the hash's bits: beyond, unrelated pictures match
# The most ids --label_offset may reserve below the first label: 1 is ImageNet's background;
# a few more cover other conventions, and a typo like 1000 is refused.
MAX_LABEL_OFFSET = 16
DEFAULT_IMAGE_SIZE = 224
DEFAULT_TARGET_SHARD_MB = 150
# Reads in flight per worker for remote input: chosen with the writer benchmark's gs:// mode
# (see docs/performance/writer.md).
DEFAULT_REMOTE_READ_CONCURRENCY = 32
DEFAULT_READ_AHEAD_MB = DEFAULT_MAX_BYTES // 2**20
MAX_READ_CONCURRENCY = 256
# The largest output side: 16384x16384 RGB is 805 MB of pixels a record, about where
# decoders, protobuf (2 GB a message) and accelerators give out.
MAX_IMAGE_SIDE = 16384
DEFAULT_PROGRESS_INTERVAL = 30.0
# The default of --progress_interval: a log or CI job pins it once for every run, and the tests
# pin it so that no run prints a progress line because the machine is slow.
PROGRESS_INTERVAL_ENV = "BEAM_PREP_PROGRESS_INTERVAL"


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
    """What one run of ``prepare`` is asked to do: every option that decides its dataset, checked.

    Made from the command line by ``beam_prep.cli.options.config_from_options`` (or by
    ``WriteImageDataset`` from its arguments), then read by every stage: the planner
    lists ``input`` and picks the shard counts, the sinks write the records ``spec``
    describes, and the manifest records the whole configuration (its ``options``).
    Frozen: a run's configuration does not change once checked.

    Attributes:
      input: the image tree's root, ROOT/<label>/<image>: a local path made absolute
        or a gs:// prefix without a trailing slash (``normalised_path``).
      output: where the dataset goes, spelled as ``input`` is.
      spec: what each image becomes: its size, resize mode, channels and format.
      validation_percent: the share of files put in the validation split, in [0, 100).
      labels_file: a file of label names, one a line, that fixes the labels' order;
        None takes the label folders' names, sorted.
      num_shards: shards per split; 0 chooses a count from the data.
      target_shard_mb: the shard size aimed at when ``num_shards`` is 0.
      overwrite: whether a dataset already in ``output`` may be replaced.
      sink: ``auto``, ``streaming`` or ``shuffle`` (``SINKS``): which sink writes the shards.
      compression: ``gzip`` or ``none``, a key of ``model.dataset.COMPRESSIONS``.
      reads: how far each worker's reads run ahead of its work.
      label_offset: the id stored for the first label (1 keeps id 0 for background).
      labels_txt: labels.txt's form, ``names`` or ``slim`` (``LABELS_TXT_FORMS``).
      metadata: a table naming each image's label(s), split and other features, normalised
        as ``input`` is; None labels each image by its folder.
      recursive: whether images at any depth under a label folder take its label.
      file_format: the shards' format, a key of ``model.dataset.FILE_FORMATS``.
      stratify: whether each label gets its own ``validation_percent`` share of
        validation images (``selection``) instead of each file's hash deciding alone.
      max_per_class: the most files each label keeps, chosen by a stable hash (the rest
        skipped); None keeps them all.
      max_failures: how many files may fail before the run exits non-zero, a count (``"10"``)
        or a percent of the files listed (``"2.5%"``) (``failure_budget``); None: any number.
      near_duplicate_distance: the largest Hamming distance between two records' perceptual
        hashes that makes them near duplicates; -1 looks for exact copies only.
      cross_split_duplicates: ``report`` the copies across splits, ``fail`` the run once
        its reports are written, or ``drop`` each file that copies, or is within the threshold
        of, a file kept in an earlier split (``finish.split_order``: train first, test last)
        (``CROSS_SPLIT_ACTIONS``).
      append: add the new images of ``input`` to the dataset in ``output`` (``--append``), with
        the dataset's own options (``write.grow.append``).
      version: the dataset version the run makes: 1, or the next with ``append``; it names the
        shards of versions after the first (``layout.shard_name``).
      append_check: how an append tells a file at a path the dataset holds unchanged
        (``APPEND_CHECKS``): ``stat``, its size and stamp are its record's (read only where they
        differ), or ``content``, its bytes (every such file read).
    """

    input: str
    output: str
    spec: ImageSpec
    validation_percent: float = 0.0
    labels_file: str | None = None
    num_shards: int = 0
    target_shard_mb: int = DEFAULT_TARGET_SHARD_MB
    overwrite: bool = False
    sink: str = "auto"
    compression: str = "gzip"
    reads: ReadAheadConfig = ReadAheadConfig()
    label_offset: int = 0
    labels_txt: str = "names"
    metadata: str | None = None
    recursive: bool = False
    file_format: str = TFRECORD
    stratify: bool = False
    max_per_class: int | None = None
    max_failures: str | None = None
    near_duplicate_distance: int = DEFAULT_DISTANCE
    cross_split_duplicates: str = "report"
    append: bool = False
    version: int = 1
    append_check: str = "stat"

    @property
    def shard_suffix(self) -> str:
        """Its shards' file name suffix (``layout.shard_name``)."""
        return shard_suffix(self.file_format, self.compression)


def default_compression(image_format: str, file_format: str = TFRECORD) -> str:
    """``--compression`` when none is given: a dataset of original JPEGs is stored uncompressed,
    since GZIP costs a large share of its CPU for almost no bytes (docs/guides/preparing.md), and
    the formats other than TFRecord are never GZIP-compressed."""
    return "none" if image_format == ORIGINAL or file_format != TFRECORD else "gzip"


def check_file_format(file_format: str, compression: str, prefix: str = "--") -> None:
    """The format is known, its library installed, and a compression it can have.

    Raises:
      OptionsError: an unknown format (the choices named), a missing library (its install
        command), or GZIP asked of a format that is not TFRecord.
    """
    check_values({"file_format": file_format}, prefix)
    if file_format != TFRECORD and compression != "none":
        raise OptionsError(f"{prefix}compression {compression} is for {prefix}file_format tfrecord only: "
                           f"{file_format} shards are not GZIP-compressed (drop {prefix}compression)")
    check_installed(file_format)


def parse_image_size(text: str | None, resize_mode: str) -> tuple[int | None, int | None]:
    if resize_mode == "none":
        if text is not None:
            raise OptionsError("--resize_mode none keeps each image's size: drop --image_size")
        return None, None
    if text is None:
        return DEFAULT_IMAGE_SIZE, DEFAULT_IMAGE_SIZE
    match = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?", str(text))
    if not match:
        raise OptionsError(f"--image_size must be an int or HxW (e.g. 224 or 240x320), not {text!r}")
    height = int(match.group(1))
    width = int(match.group(2) or height)
    if height < 1 or width < 1:
        raise OptionsError(f"--image_size must be at least 1 pixel, not {text!r}")
    if max(height, width) > MAX_IMAGE_SIDE:
        raise OptionsError(f"--image_size must be at most {MAX_IMAGE_SIDE} a side, not {text!r}")
    return height, width


def image_spec(image_size: str | None, resize_mode: str, channels: int, image_format: str,
               jpeg_quality: int, max_pixels: int, prefix: str = "--", no_upscale: bool = False,
               background: str = DEFAULT_BACKGROUND) -> ImageSpec:
    """The image options as an ``ImageSpec``; ``prefix`` is how messages name them (flags: ``--``).

    Raises:
      OptionsError: a size ``parse_image_size`` refuses, or a value ``ImageSpec`` does.
    """
    height, width = parse_image_size(image_size, resize_mode)
    try:
        spec = ImageSpec(height=height, width=width, channels=channels, resize_mode=resize_mode,
                         image_format=image_format, jpeg_quality=jpeg_quality, max_pixels=max_pixels,
                         no_upscale=no_upscale, background=parse_colour(background))
    except ValueError as e:
        raise OptionsError(f"{prefix}{e}") from e
    if spec.image_format == ORIGINAL and spec.fixed_size:
        _warn_originals_resized(spec, prefix)
    return spec


def _warn_originals_resized(spec: ImageSpec, prefix: str) -> None:
    """Originals with a fixed-size mode keep only the JPEGs already that size: allowed (a tree
    prepared at its size keeps them all), but said before any work, as a run that keeps none
    of its JPEGs otherwise says so only in its summary at the end."""
    p = prefix
    no_upscale = f"{p}no_upscale" if p else "no_upscale=True"  # a flag, or a keyword argument
    warnings.warn(BeamPrepWarning(
        f"{p}image_format original with {p}resize_mode {spec.resize_mode} keeps only the JPEGs already "
        f"exactly {spec.height}x{spec.width} as they are, and re-encodes every other image at that size: "
        f"{p}resize_mode none, or {p}resize_mode shorter_side {no_upscale}, keeps the rest"), stacklevel=3)


def _warn_remote_worker_counts(options: PipelineOptions) -> None:
    """Dataflow's worker counts on a local run: accepted by Beam and ignored, so said before any work."""
    worker = options.view_as(WorkerOptions)
    given = [flag for flag in sorted(REMOTE_WORKER_FLAGS) if getattr(worker, flag[2:], None)]
    if given:
        warnings.warn(BeamPrepWarning(
            f"{' and '.join(given)} {'set' if len(given) > 1 else 'sets'} Dataflow's workers, and a local run "
            f"ignores {'them' if len(given) > 1 else 'it'}: pass {LOCAL_WORKERS_FLAG} to choose how many "
            f"processes this machine runs"), stacklevel=3)


def progress_interval(flag: float | None) -> float:
    """Seconds between progress lines: ``--progress_interval``, else ``$BEAM_PREP_PROGRESS_INTERVAL``,
    else ``DEFAULT_PROGRESS_INTERVAL``.

    Raises:
      OptionsError: the flag or the variable is not a number of seconds more than 0, naming it.
    """
    if flag is not None:
        name, value = "--progress_interval", flag
    elif os.environ.get(PROGRESS_INTERVAL_ENV, "").strip():
        name, value = PROGRESS_INTERVAL_ENV, os.environ[PROGRESS_INTERVAL_ENV]
    else:
        return DEFAULT_PROGRESS_INTERVAL
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:  # NaN too
        raise OptionsError(f"{name} must be more than 0 seconds, not {value}")
    return seconds


def normalised_path(path: str) -> str:
    """A local path made absolute, a gs:// one without a trailing slash: one spelling a folder."""
    return os.path.abspath(path) if is_local(path) else path.rstrip("/")


def _inside(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or under it, links resolved: an output reached through a link counts."""
    if is_local(path) and is_local(folder):
        path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _check_dataflow(options: PipelineOptions, source: str, target: str) -> None:
    """What a Dataflow submission needs, checked before listing or staging anything."""
    cloud = options.view_as(GoogleCloudOptions)
    missing = [flag for flag, value in (("--project", cloud.project), ("--region", cloud.region))
               if not value]
    if missing:
        raise OptionsError(f"DataflowRunner needs {' and '.join(missing)} (the GCP project and region to run in)")
    if not (cloud.temp_location or "").startswith("gs://"):
        raise OptionsError("DataflowRunner needs --temp_location gs://BUCKET/tmp (where Beam stages and writes temp files)")
    setup = options.view_as(SetupOptions)
    if not (setup.setup_file or options.view_as(WorkerOptions).sdk_container_image):
        raise OptionsError("DataflowRunner workers need beam-prep: pass --setup_file ./setup.py "
                           "or --sdk_container_image with the image the Dockerfile builds")


def _check_remote_paths(runner: str, source: str, target: str) -> None:
    """A runner whose workers run elsewhere (Dataflow, Flink, Spark, a portable job server) reads
    and writes where they are: a local folder there is another, or none, and a run on it loses
    its records at the end. Refused before any work."""
    for flag, path in (("--input", source), ("--output", target)):
        if is_local(path):
            raise OptionsError(f"{runner} workers cannot see local paths: {flag} must be gs://, not {path}")


# The checks the command's flags and WriteImageDataset's arguments of the same name share:
# name -> (test, what a good value is).
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "resize_mode": (lambda v: v in RESIZE_MODES, f"must be one of {', '.join(RESIZE_MODES)}"),
    "image_format": (lambda v: v in OUTPUT_FORMATS, f"must be one of {', '.join(OUTPUT_FORMATS)}"),
    "compression": (lambda v: v in COMPRESSIONS, f"must be one of {', '.join(COMPRESSIONS)}"),
    "file_format": (lambda v: v in FILE_FORMATS, f"must be one of {', '.join(FILE_FORMATS)}"),
    "label_offset": (lambda v: isinstance(v, int) and 0 <= v <= MAX_LABEL_OFFSET,
                     f"must be in [0, {MAX_LABEL_OFFSET}] (1 keeps id 0 for background)"),
    "labels_txt": (lambda v: v in LABELS_TXT_FORMS, f"must be one of {', '.join(LABELS_TXT_FORMS)}"),
    "validation_percent": (lambda v: 0 <= v < 100, "must be in [0, 100)"),
    "read_concurrency": (lambda v: isinstance(v, int) and 0 <= v <= MAX_READ_CONCURRENCY,
                         f"must be in [0, {MAX_READ_CONCURRENCY}] (0 reads each file when its turn comes)"),
    "read_ahead_mb": (lambda v: v >= 1, "must be at least 1"),
    "near_duplicate_distance": (lambda v: isinstance(v, int) and -1 <= v <= MAX_NEAR_DUPLICATE_DISTANCE,
                                f"must be in [0, {MAX_NEAR_DUPLICATE_DISTANCE}] bits, or -1 for exact copies only"),
    "cross_split_duplicates": (lambda v: v in CROSS_SPLIT_ACTIONS, f"must be one of {', '.join(CROSS_SPLIT_ACTIONS)}"),
    "append_check": (lambda v: v in APPEND_CHECKS, f"must be one of {', '.join(APPEND_CHECKS)}"),
}


def check_values(values: Mapping[str, Any], prefix: str = "--") -> None:
    """Checks values by their option's name; ``prefix`` is how the message names them (flags: ``--``).

    Raises:
      OptionsError: the first bad value, named, with what a good one is.
    """
    for name, value in values.items():
        test, rule = _RULES[name]
        try:
            good = test(value)
        except TypeError:
            good = False
        if not good:
            raise OptionsError(f"{prefix}{name} {rule}, not {value!r}")


def config_from_flags(o: Any, options: PipelineOptions) -> PrepareConfig:
    """Checks every option a user can get wrong, with a message that says what to fix.

    Args:
      o: the command's flags, parsed (``beam_prep.cli.options.PrepareImagesOptions``): an object
        with an attribute per flag (``o.input``, ``o.image_size``, ...).
      options: all of the run's options, Beam's too (the runner, and a Dataflow job's project,
        region and staging, which are checked here as well).

    Returns:
      The run's configuration, its paths normalised and its defaults chosen.

    Raises:
      OptionsError: on the first problem found.
    """
    if not o.input:
        raise OptionsError("--input is required: the root of the image tree (a path or gs://bucket/prefix)")
    if not o.output:
        raise OptionsError("--output is required: where the TFRecords go (a path or gs://bucket/prefix)")
    compression = (o.compression if o.compression is not None
                   else default_compression(o.image_format, o.file_format))
    check_values({"resize_mode": o.resize_mode, "image_format": o.image_format,
                  "compression": compression, "label_offset": o.label_offset, "labels_txt": o.labels_txt,
                  "validation_percent": o.validation_percent, "read_ahead_mb": o.read_ahead_mb,
                  "near_duplicate_distance": o.near_duplicate_distance,
                  "cross_split_duplicates": o.cross_split_duplicates, "append_check": o.append_check})
    if o.read_concurrency is not None:
        check_values({"read_concurrency": o.read_concurrency})
    check_file_format(o.file_format, compression)
    if o.sink not in SINKS:
        raise OptionsError(f"--sink must be one of {', '.join(SINKS)}, not {o.sink!r}")
    if o.num_shards < 0:
        raise OptionsError(f"--num_shards must be 0 (automatic) or more, not {o.num_shards}")
    if o.target_shard_mb < 1:
        raise OptionsError(f"--target_shard_mb must be at least 1, not {o.target_shard_mb}")
    _check_selection(o.stratify, o.validation_percent, o.max_per_class, o.append)
    if o.append and o.overwrite:
        raise OptionsError("--append adds to the dataset in --output and --overwrite replaces it: pass one of them")
    if o.append_check != APPEND_CHECKS[0] and not o.append:
        raise OptionsError(f"--append_check {o.append_check} says how --append tells a file unchanged: pass --append, "
                           "or drop it")
    max_failures = parse_max_failures(o.max_failures) if o.max_failures is not None else None
    progress_interval(o.progress_interval)
    resample.check_choice()  # BEAM_PREP_RESIZE_KERNEL: a value it takes, and one this environment can honour
    jpeg_path.check_choice()  # BEAM_PREP_JPEG_PATH: a value it takes
    spec = image_spec(o.image_size, o.resize_mode, o.channels, o.image_format, o.jpeg_quality, o.max_pixels,
                      no_upscale=o.no_upscale, background=o.background)

    for flag, path in (("input", o.input), ("output", o.output)):
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: Beam's options (protobuf) carry UTF-8 text alone
            raise OptionsError(f"--{flag} {printable(path)} is a path no UTF-8 spells, which a Beam pipeline cannot "
                               "carry: rename that folder (file names below it may be any bytes)") from None
    source, target = normalised_path(o.input), normalised_path(o.output)
    if is_local(source) and not os.path.isdir(source):
        raise OptionsError(f"--input {o.input} is not a directory")
    if _inside(target, source):
        raise OptionsError(f"--output {o.output} is inside --input {o.input}: its files would be listed as input")
    runner = check_runner(options.view_as(StandardOptions).runner)
    if runner in ("DataflowRunner", "TestDataflowRunner"):
        _check_dataflow(options, source, target)
    if not is_local_runner(runner):
        _check_remote_paths(runner, source, target)
    else:
        _warn_remote_worker_counts(options)
    table = _metadata_path(o.metadata, o.recursive)
    concurrency = o.read_concurrency
    if concurrency is None:
        concurrency = 0 if is_local(source) else DEFAULT_REMOTE_READ_CONCURRENCY
    reads = ReadAheadConfig(concurrency=concurrency, max_bytes=o.read_ahead_mb * 2**20)
    if o.near_duplicate_distance < 0:  # exact copies only: the workers need not hash the pictures
        spec = dataclasses.replace(spec, perceptual_hash=False)
    return PrepareConfig(input=source, output=target, spec=spec,
                         validation_percent=o.validation_percent, labels_file=o.labels_file,
                         num_shards=o.num_shards, target_shard_mb=o.target_shard_mb,
                         overwrite=o.overwrite, sink=o.sink, compression=compression, reads=reads,
                         label_offset=o.label_offset, labels_txt=o.labels_txt, metadata=table,
                         recursive=o.recursive, file_format=o.file_format, stratify=o.stratify,
                         max_per_class=o.max_per_class, max_failures=max_failures,
                         near_duplicate_distance=o.near_duplicate_distance,
                         cross_split_duplicates=o.cross_split_duplicates, append=o.append,
                         append_check=o.append_check)


def _check_selection(stratify: bool, validation_percent: float, max_per_class: int | None, append: bool) -> None:
    """--stratify shares out a validation percent, so it needs one (an append takes the dataset's);
    --max_per_class keeps at least one file.

    Raises:
      OptionsError: naming the flag and what to give.
    """
    if stratify and not validation_percent and not append:
        raise OptionsError("--stratify gives each label its --validation_percent share of validation images: "
                           "give --validation_percent too (e.g. --validation_percent 10)")
    if max_per_class is not None and max_per_class < 1:
        raise OptionsError(f"--max_per_class must be at least 1 (files kept per label), not {max_per_class}")


def _metadata_path(path: str | None, recursive: bool) -> str | None:
    """--metadata, normalised and checked (its extension, that a local table exists); None without it.

    Raises:
      OptionsError: a table that cannot be read, or --recursive beside it (the table places each image).
    """
    if path is None:
        return None
    if recursive:
        raise OptionsError("--metadata names each image wherever it is: drop --recursive")
    check_path(path)
    return normalised_path(path)
