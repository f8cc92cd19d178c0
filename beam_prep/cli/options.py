"""The command's flags, declared in the sections ``--help`` shows them in.

``PrepareImagesOptions`` is the options class Beam parses the command line with, and the
help (``beam_prep.cli.usage``) is built from its declarations; ``config_from_options``
reads the parsed flags into the run's configuration, whose checks are the planner's
(``beam_prep.write.plan.config``).
"""
from __future__ import annotations

from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions

from beam_prep.doc_pages import doc_page
from beam_prep.model.dataset import TFRECORD
from beam_prep.write.images.imaging import DEFAULT_MAX_PIXELS, OUTPUT_FORMATS, RESIZE_MODES
from beam_prep.write.plan.config import (
    DEFAULT_DISTANCE,
    DEFAULT_IMAGE_SIZE,
    DEFAULT_PROGRESS_INTERVAL,
    DEFAULT_READ_AHEAD_MB,
    DEFAULT_REMOTE_READ_CONCURRENCY,
    DEFAULT_TARGET_SHARD_MB,
    PROGRESS_INTERVAL_ENV,
    PrepareConfig,
    config_from_flags,
)

__all__ = ["DRY_RUN", "DRY_RUN_HELP", "SECTIONS", "PrepareImagesOptions", "add_dry_run_argument", "config_from_options"]


# The sections of --help, in order. Every option is declared in one of them, and the
# help is built from these declarations (beam_prep.cli.usage), so it lists each option once.
INPUT_OUTPUT = "input and output"
IMAGE = "image"
LABELS_SPLITS = "labels and splits"
SHARDS = "shards and compression"
RUN = "run"
SECTIONS = (INPUT_OUTPUT, IMAGE, LABELS_SPLITS, SHARDS, RUN)


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
        "--append", action="store_true", default=False,
        help="Add the images of --input that the dataset in --output does not hold yet, as its next version, "
             "with the dataset's own options (an option given that contradicts them is refused); its records, "
             "shards and label ids stay as they are. With the dataset's --stratify, each label's validation share "
             "is of its new files alone; its --max_per_class counts the records each label holds already "
             f"({doc_page('guides/preparing.md')}).")
    group.add_argument(
        "--append_check", default="stat",
        help="How --append tells a file at a path the dataset holds unchanged: stat (the default, as rsync) "
             "reads it only where its size or modification time (a gs:// object's generation) differ from "
             "those its record kept, so a file rewritten with the same size and its old time restored is taken "
             "as unchanged; content reads every such file and compares its SHA-256.")
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
        "--stratify", action="store_true", default=False,
        help="Give each label round(--validation_percent of its files) validation images, the files "
             "with the lowest stable hash, instead of letting each file's hash decide alone; a label "
             "keeps at least one training image. With --append, among each label's new files alone.")
    group.add_argument(
        "--max_per_class", type=int, default=None,
        help="Keep at most this many files of each label, chosen by a stable hash of their path; the "
             "rest are skipped and named in skipped.jsonl (default: all): for quick experiments on a "
             "big tree. With --append, the records a label holds already count: the dataset's cap holds "
             "over all its versions (another cap is refused).")
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
             "stored in each record as a feature of its own; file_name is relative to --input wherever the "
             "table lives. Files under --input that no row names are skipped (default: a metadata.jsonl or "
             "metadata.csv inside each split folder, as Hugging Face's imagefolder has it, its file_name "
             "relative to that folder; without those, each image's label is its folder's name).")
    group.add_argument(
        "--recursive", action="store_true", default=False,
        help="Images at any depth under a label folder take that top folder's label (as Keras's "
             "image_dataset_from_directory); without it, images deeper than the label folders are skipped.")
    group.add_argument(
        "--near_duplicate_distance", type=int, default=DEFAULT_DISTANCE,
        help="Records whose perceptual hashes (64 bits) differ in at most this many bits are near "
             "duplicates (a re-encoded, resized or recoloured copy), listed in duplicates.jsonl and "
             "counted within and across splits; -1 finds exact copies only "
             f"({doc_page('design/duplicates.md')}).")
    group.add_argument(
        "--cross_split_duplicates", default="report",
        help="What a copy or near copy in two splits (leakage) does: report (in the summary, the "
             "manifest and duplicates.jsonl), fail (the same, then exit 1: for automated jobs), or drop "
             "(the same, and each file that copies, or is within the threshold of, a file kept in an earlier "
             "split is left out of the dataset, named in skipped.jsonl; the splits' order: train, validation, "
             "val, the others by name, test last).")
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
             "none also writes TFDS's metadata and, beside each shard, the index NVIDIA DALI reads it with "
             "(dali-<shard>.idx: always, a line a record), and is what TPU ResNet and TF-slim code read "
             f"({doc_page('guides/training-code.md')}).")
    group.add_argument(
        "--sink", default="auto",
        help="streaming: each worker writes whole shards, memory stays flat (local runners); "
             "shuffle: Beam's file sink after the runner's shuffle (distributed runners); "
             "auto picks by runner.")


def _run_arguments(group: Any) -> None:
    """--help's "run" section: progress, logging and the failure budget."""
    group.add_argument(
        "--progress_interval", type=float, default=None,
        help="Seconds between progress lines when stderr is not a terminal (a terminal gets a "
             f"progress bar); local runs only (default: ${PROGRESS_INTERVAL_ENV}, else "
             f"{DEFAULT_PROGRESS_INTERVAL:g}).")
    group.add_argument(
        "--verbose", action="store_true", default=False,
        help="Show Beam's log and a failed job's full traceback on stderr, instead of "
             "a one-line error that names a log file holding them.")
    group.add_argument(
        "--max_failures", default=None,
        help="The most files that may fail (errors.jsonl) for the run to succeed: a count (10) or a "
             "percent of the files listed (2.5%%). The run writes everything all the same, then exits "
             "1 with one line when more failed (default: any number).")


DRY_RUN = "--dry_run"
# Beam's TestOptions declares --dry_run (its help: for testing runners), so the flag is parsed as Beam's
# and cannot be declared again here; the help shows it among the run's options with what it does here.
DRY_RUN_HELP = ("List the tree and plan the run (images and shards per split, labels, skipped files), print "
                "the plan and write nothing; a remote runner also builds the whole job and does not submit it. "
                "--dry_run=false runs.")


def add_dry_run_argument(parser: Any) -> None:
    """``--dry_run`` as the help shows it: beam-prep's meaning of Beam's flag."""
    parser.add_argument(DRY_RUN, action="store_true", default=False, help=DRY_RUN_HELP)


def config_from_options(options: PipelineOptions) -> PrepareConfig:
    """The run's configuration from its command line, every option checked.

    Args:
      options: the parsed command line; its ``PrepareImagesOptions`` flags and Beam's.

    Returns:
      The run's ``PrepareConfig``.

    Raises:
      OptionsError: on the first problem found, with a message that says what to fix.
    """
    return config_from_flags(options.view_as(PrepareImagesOptions), options)
