"""The pipeline's options, and their validation before any work starts."""
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

from beam_prep.doc_pages import doc_page
from beam_prep.errors import BeamPrepWarning, OptionsError
from beam_prep.io.storage import is_local
from beam_prep.model.dataset import COMPRESSIONS, FILE_FORMATS, TFRECORD, shard_suffix
from beam_prep.write.formats import check_installed
from beam_prep.write.imaging import (DEFAULT_BACKGROUND, DEFAULT_MAX_PIXELS, ORIGINAL, OUTPUT_FORMATS, RESIZE_MODES,
                                     ImageSpec, parse_colour)
from beam_prep.write.metadata import check_path
from beam_prep.write.readahead import DEFAULT_MAX_BYTES, ReadConfig

SINKS = ("auto", "streaming", "shuffle")
# labels.txt's forms: one name a line (line number = index in the labels), or TF-slim's
# "id:name" lines (ids as stored, label_offset included). See dataset.labels_lines.
LABELS_TXT_FORMS = ("names", "slim")
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


# The sections of --help, in order. Every option is declared in one of them, and the
# help is built from these declarations (beam_prep.cli.usage), so it lists each option once.
INPUT_OUTPUT = "input and output"
IMAGE = "image"
LABELS_SPLITS = "labels and splits"
SHARDS = "shards and compression"
RUN = "run"
SECTIONS = (INPUT_OUTPUT, IMAGE, LABELS_SPLITS, SHARDS, RUN)
DEFAULT_PROGRESS_INTERVAL = 30.0


class PrepareImagesOptions(PipelineOptions):
    """Options of ``pipelines.prepare_images``; every other flag is Beam's.

    Each option's help says what it is for in one line; its default is added
    from the declaration (beam_prep.cli.usage), except where None stands for a choice
    made later, which the help then names itself, ``(default: ...)``.
    """

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        section = {title: parser.add_argument_group(title) for title in SECTIONS}
        _input_output_arguments(section[INPUT_OUTPUT])
        _image_arguments(section[IMAGE])
        _labels_split_arguments(section[LABELS_SPLITS])
        _shard_arguments(section[SHARDS])
        _run_arguments(section[RUN])


def _input_output_arguments(group: Any) -> None:
    """--help's "input and output" section: where images come from, where the dataset goes."""
    group.add_argument(
        "--input", help="Image tree root, ROOT/<label>/<image>: a local path or gs://bucket/prefix (required).")
    group.add_argument(
        "--output", help="Where shards, labels.txt, errors.jsonl and manifest.json go (required).")
    group.add_argument("--overwrite", action="store_true", default=False,
                       help="Replace a dataset already in --output.")
    group.add_argument(
        "--read_concurrency", type=int, default=None,
        help=f"Files each worker reads ahead of its work at once (default: {DEFAULT_REMOTE_READ_CONCURRENCY} "
             "for gs:// input, which hides round trips; 0 for local disk: each file read when its turn comes).")
    group.add_argument(
        "--read_ahead_mb", type=int, default=DEFAULT_READ_AHEAD_MB,
        help="Cap on the bytes a worker's read-ahead holds, on top of --read_concurrency's cap on files.")


def _image_arguments(group: Any) -> None:
    """--help's "image" section: the size, mode and format of each stored image."""
    group.add_argument(
        "--image_size", default=None,
        help=f"Output size: an int for a square, or HxW (default: {DEFAULT_IMAGE_SIZE}).")
    group.add_argument("--resize_mode", default="center_crop", help=f"One of {', '.join(RESIZE_MODES)}.")
    group.add_argument("--channels", type=int, default=3, help="3 for RGB, 1 for grayscale.")
    group.add_argument(
        "--image_format", default="jpeg",
        help=f"One of {', '.join(OUTPUT_FORMATS)}. original stores a source JPEG byte for byte when it "
             "decodes, has --channels, needs no EXIF rotation and no resize, and any other image as a "
             "JPEG at --jpeg_quality: for training that crops at read time (with --resize_mode none, or "
             "shorter_side and --no_upscale). With center_crop, stretch or pad it keeps only the sources "
             "already at exactly --image_size.")
    group.add_argument("--jpeg_quality", type=int, default=90, help="JPEG quality, 1-100.")
    group.add_argument(
        "--no_upscale", action="store_true", default=False,
        help="--resize_mode shorter_side: an image already smaller than --image_size keeps its size "
             "(with --image_format original, a JPEG one its bytes).")
    group.add_argument(
        "--background", default="white",
        help="The colour transparent pixels are composited on, as image viewers show them: a name "
             "(white, black) or #rrggbb.")
    group.add_argument(
        "--max_pixels", type=int, default=DEFAULT_MAX_PIXELS,
        help="Images with more pixels are reported as errors (decompression-bomb guard).")


def _labels_split_arguments(group: Any) -> None:
    """--help's "labels and splits" section."""
    group.add_argument(
        "--validation_percent", type=float, default=0.0,
        help="Share of files put in the validation split, by a stable hash of their path.")
    group.add_argument(
        "--labels_file", default=None,
        help="Label order, one name a line (default: the label folders' names, sorted).")
    group.add_argument(
        "--label_offset", type=int, default=0,
        help="Stored label ids start at this number (1: id 0 is kept for background, as "
             "ImageNet-style training code expects); the reader subtracts it again.")
    group.add_argument(
        "--metadata", default=None,
        help="A table saying what each image is (CSV, TSV or JSON Lines, by extension; local or gs://): "
             "a file_name column (the image's path under --input), label (one name) or labels (a JSON "
             "list, or names separated by ; in CSV/TSV), an optional split column, and any other column, "
             "stored in each record as a feature of its own. Files under --input that no row names are "
             "skipped (default: none: each image's label is its folder's name).")
    group.add_argument(
        "--recursive", action="store_true", default=False,
        help="Images at any depth under a label folder take that top folder's label (as Keras's "
             "image_dataset_from_directory); without it, images deeper than the label folders are skipped.")
    group.add_argument(
        "--labels_txt", default="names",
        help="labels.txt's form: names (one name a line) or slim "
             "(TF-slim's id:name lines, ids as stored).")


def _shard_arguments(group: Any) -> None:
    """--help's "shards and compression" section."""
    group.add_argument(
        "--file_format", default=TFRECORD,
        help="The shards' format, for the training stack that reads them: tfrecord (tf.data, "
             "beam_prep.make_dataset), array_record (Grain and JAX, or PyTorch, through "
             "beam_prep.data_source; needs the array-record package) or webdataset (tar shards for "
             "PyTorch's webdataset.WebDataset). The records are the same in each.")
    group.add_argument(
        "--num_shards", type=int, default=0,
        help="Shards per split; 0 chooses a count from the data (about --target_shard_mb each).")
    group.add_argument("--target_shard_mb", type=int, default=DEFAULT_TARGET_SHARD_MB,
                       help="Shard size aimed at when --num_shards is 0.")
    group.add_argument(
        "--compression", default=None,
        help="gzip or none, for --file_format tfrecord (the other formats are never GZIP-compressed) "
             "(default: none for --image_format original, whose whole JPEGs "
             "compress by under 1%%, and gzip otherwise). JPEG and PNG payloads barely compress; raw pixels do, "
             "but inflating them caps read speed below decoding JPEG: prefer none for raw. "
             "none also writes TFDS's metadata, and is what TPU ResNet and TF-slim code read "
             f"({doc_page('guides/training-code.md')}).")
    group.add_argument(
        "--sink", default="auto",
        help="streaming: each worker writes whole shards, memory stays flat (local runners); "
             "shuffle: Beam's file sink after the runner's shuffle (distributed runners); "
             "auto picks by runner.")


def _run_arguments(group: Any) -> None:
    """--help's "run" section: progress and logging."""
    group.add_argument(
        "--progress_interval", type=float, default=DEFAULT_PROGRESS_INTERVAL,
        help="Seconds between progress lines when stderr is not a terminal (a terminal gets a "
             "progress bar); local runs only.")
    group.add_argument(
        "--verbose", action="store_true", default=False,
        help="Show Beam's log and a failed job's full traceback on stderr, instead of "
             "a one-line error that names a log file holding them.")


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
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
    reads: ReadConfig = ReadConfig()
    label_offset: int = 0
    labels_txt: str = "names"
    metadata: str | None = None
    recursive: bool = False
    file_format: str = TFRECORD

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
    for flag, path in (("--input", source), ("--output", target)):
        if not path.startswith("gs://"):
            raise OptionsError(f"DataflowRunner workers cannot see local paths: {flag} must be gs://, not {path}")
    setup = options.view_as(SetupOptions)
    if not (setup.setup_file or options.view_as(WorkerOptions).sdk_container_image):
        raise OptionsError("DataflowRunner workers need beam-prep: pass --setup_file ./setup.py "
                           "or --sdk_container_image with the image the Dockerfile builds")


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


def config_from_options(options: PipelineOptions) -> PrepareConfig:
    """Checks every option a user can get wrong, with a message that says what to fix.

    Raises:
      OptionsError: on the first problem found.
    """
    o = options.view_as(PrepareImagesOptions)
    if not o.input:
        raise OptionsError("--input is required: the root of the image tree (a path or gs://bucket/prefix)")
    if not o.output:
        raise OptionsError("--output is required: where the TFRecords go (a path or gs://bucket/prefix)")
    compression = (o.compression if o.compression is not None
                   else default_compression(o.image_format, o.file_format))
    check_values({"resize_mode": o.resize_mode, "image_format": o.image_format,
                  "compression": compression, "label_offset": o.label_offset, "labels_txt": o.labels_txt,
                  "validation_percent": o.validation_percent, "read_ahead_mb": o.read_ahead_mb})
    if o.read_concurrency is not None:
        check_values({"read_concurrency": o.read_concurrency})
    check_file_format(o.file_format, compression)
    if o.sink not in SINKS:
        raise OptionsError(f"--sink must be one of {', '.join(SINKS)}, not {o.sink!r}")
    if o.num_shards < 0:
        raise OptionsError(f"--num_shards must be 0 (automatic) or more, not {o.num_shards}")
    if o.target_shard_mb < 1:
        raise OptionsError(f"--target_shard_mb must be at least 1, not {o.target_shard_mb}")
    if not o.progress_interval > 0:
        raise OptionsError(f"--progress_interval must be more than 0 seconds, not {o.progress_interval}")
    spec = image_spec(o.image_size, o.resize_mode, o.channels, o.image_format, o.jpeg_quality, o.max_pixels,
                      no_upscale=o.no_upscale, background=o.background)

    source, target = normalised_path(o.input), normalised_path(o.output)
    if is_local(source) and not os.path.isdir(source):
        raise OptionsError(f"--input {o.input} is not a directory")
    if _inside(target, source):
        raise OptionsError(f"--output {o.output} is inside --input {o.input}: its files would be listed as input")
    if options.view_as(StandardOptions).runner in ("DataflowRunner", "TestDataflowRunner"):
        _check_dataflow(options, source, target)
    table = _metadata_path(o.metadata, o.recursive)
    concurrency = o.read_concurrency
    if concurrency is None:
        concurrency = 0 if is_local(source) else DEFAULT_REMOTE_READ_CONCURRENCY
    reads = ReadConfig(concurrency=concurrency, max_bytes=o.read_ahead_mb * 2**20)
    return PrepareConfig(input=source, output=target, spec=spec,
                         validation_percent=o.validation_percent, labels_file=o.labels_file,
                         num_shards=o.num_shards, target_shard_mb=o.target_shard_mb,
                         overwrite=o.overwrite, sink=o.sink, compression=compression, reads=reads,
                         label_offset=o.label_offset, labels_txt=o.labels_txt, metadata=table,
                         recursive=o.recursive, file_format=o.file_format)


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
