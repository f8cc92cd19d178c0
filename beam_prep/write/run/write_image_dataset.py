"""``WriteImageDataset``: the dataset writer as a Beam PTransform, for pipelines that find images their own way.

Applied to a PCollection of ``(source, label[, split[, name[, features]]])``, as Beam's
``WriteToTFRecord`` is, it writes the command's dataset: the same records
(``examples.make_example``, paths read by the same ``FileReader``), the shuffle
sink's writing (``shard_sinks.WriteEntriesShuffle``), and the same manifest step
(``publish.complete``: published only when the counts add up), so the two
cannot drift apart. Labels are given and splits declared, since writes are built
before any element exists; and the output folder's claim is taken twice,
briefly (when applied, and to publish), since no claim can be held while some
runner runs the pipeline. See docs/guides/beam-pipeline.md.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import numbers
import os
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.pvalue import PCollection, TaggedOutput

from beam_prep.errors import CrossSplitLeakage, ElementError, ImageError, OptionsError
from beam_prep.io.dali_index import index_name
from beam_prep.io.storage import is_local
from beam_prep.model.dataset import TFRECORD, shard_suffix
from beam_prep.model.features import SCHEMA
from beam_prep.model.names import NAME_MAX, name_problem
from beam_prep.write.finish import duplicates, manifest, publication, publish
from beam_prep.write.grow import append, existing, label_ids
from beam_prep.write.images import resample_loader
from beam_prep.write.images.examples import Outcome, failure_report
from beam_prep.write.images.imaging import DEFAULT_BACKGROUND, DEFAULT_MAX_PIXELS, ImageSpec
from beam_prep.write.images.phash import DEFAULT_DISTANCE
from beam_prep.write.images.readahead import ReadAheadConfig
from beam_prep.write.journal import resume
from beam_prep.write.plan.config import (
    DEFAULT_READ_AHEAD_MB,
    DEFAULT_REMOTE_READ_CONCURRENCY,
    PrepareConfig,
    check_file_format,
    check_values,
    default_compression,
    image_spec,
    normalised_path,
)
from beam_prep.write.plan.listing import check_label_name, split_for
from beam_prep.write.plan.run_plan import RunPlan
from beam_prep.write.run.claim import CLAIM_NAME, claim_output, new_run_id
from beam_prep.write.shared import layout
from beam_prep.write.shared.entry import DEFAULT_SPLIT, UNKNOWN_LABEL, VALIDATION_SPLIT, FileEntry
from beam_prep.write.sinks.shard_sinks import WriteEntriesShuffle
from beam_prep.write.sinks.tally import NAMESPACE, Counters

__all__ = ["ImageElement", "WriteImageDataset"]

_FAILED = "failed"
# The element count the near-duplicate search plans its bands for: the transform cannot know it ahead.
_NEAR_SEARCH_COUNT = 1_000_000
# The arguments an append takes from the dataset when not given (``append.appending_config``'s flags).
_TAKEN = ("image_size", "resize_mode", "channels", "image_format", "jpeg_quality", "no_upscale", "background",
          "max_pixels", "compression", "file_format", "label_offset", "labels_txt", "validation_percent",
          "near_duplicate_distance")


class ImageElement(NamedTuple):
    """One element of ``WriteImageDataset``'s input; a plain tuple in this order works as well.

    A named tuple rather than a class of its own, so that a pipeline may yield
    ``(path, label)`` pairs as they are and give the rest only where it has them.
    Its fields, in order, are its constructor's arguments:

    Attributes:
      source: a path (local or ``gs://``), read by the workers, or the image file's bytes.
      label: a name in ``labels``, or its index there; with ``multi_label=True``, a list of them.
      split: the split it goes to; None picks one by ``validation_percent``.
      name: the record's ``image/filename``, hashed for its split and shown in
        errors.jsonl. None: a path's name (relative to ``root`` when under it),
        or ``sha256:<hex>`` of the bytes.
      features: the record's extra features, a value for each key of
        ``extra_features`` (as ``--metadata``'s columns): None where none are declared.
    """

    source: str | bytes
    label: str | int | Sequence[str | int]
    split: str | None = None
    name: str | None = None
    features: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class _Naming:
    """How an element becomes a listed file: its label id, split and name."""

    labels: tuple[str, ...]  # the labels given: an element's int label is an index here
    splits: tuple[str, ...]
    validation_percent: float
    root: str | None
    label_offset: int = 0
    multi_label: bool = False
    extra_features: Mapping[str, str] = dataclasses.field(default_factory=dict)  # key -> bytes, int64 or float
    ids: tuple[str, ...] = ()  # the labels in id order (an append's: the dataset's, then new ones); () is ``labels``

    @property
    def order(self) -> tuple[str, ...]:
        """The labels in id order: labels.txt's."""
        return self.ids or self.labels


def _image_element(element: Any) -> ImageElement:
    """The element as an ``ImageElement``; raises ElementError for a shape no data can excuse."""
    if not isinstance(element, (tuple, list)) or not 2 <= len(element) <= 5:
        raise ElementError("WriteImageDataset takes (source, label[, split[, name[, features]]]) elements, "
                           f"not {_short(element)}")
    image = ImageElement(*element)
    if not isinstance(image.source, (str, bytes, bytearray, memoryview)):
        raise ElementError(f"an element's source is a path (str) or an image's bytes, not "
                           f"{type(image.source).__name__}: {_short(element)}")
    for field in ("split", "name"):
        if not isinstance(getattr(image, field), (str, type(None))):
            raise ElementError(f"an element's {field} is a str or None: {_short(element)}")
    return image


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


class _ElementToEntryFn(beam.DoFn):
    """A user's element to ``FileEntry`` (a path, read later) or ``(FileEntry, bytes)``.

    An unknown label or split goes to the ``failed`` output, counted as the sinks count.
    """

    def __init__(self, naming: _Naming) -> None:
        self._naming = naming
        self._listed = Metrics.counter(NAMESPACE, "listed")
        self._counters = Counters()
        self._ids: dict[str, int] = {}

    def setup(self) -> None:
        self._ids = {label: i + self._naming.label_offset for i, label in enumerate(self._naming.order)}

    def process(self, element: Any):
        self._listed.inc()
        image = _image_element(element)
        data = None if isinstance(image.source, str) else bytes(image.source)
        name = image.name if image.name is not None else self._default_name(image.source, data)
        if self._naming.multi_label:
            labels, label_ids = self._labels(image.label, element)
            label = ";".join(labels)
            label_id = label_ids[0] if label_ids and UNKNOWN_LABEL not in label_ids else UNKNOWN_LABEL
        else:
            if isinstance(image.label, (list, tuple)):
                raise ElementError(f"an element's label is one name or index, unless WriteImageDataset has "
                                   f"multi_label=True: {_short(element)}")
            (label, label_id), labels, label_ids = self._label(image.label), None, None
        extra, misfit = self._features(image.features, element)
        split = image.split if image.split is not None else split_for(name, self._naming.validation_percent)
        entry = FileEntry(path=name if data is not None else image.source, relpath=name, split=split,
                          label=label, label_id=label_id, size=len(data) if data is not None else 0,
                          labels=labels, label_ids=label_ids, extra=extra)
        problem = None
        if label_id == UNKNOWN_LABEL:
            problem = ImageError("label", f"label {image.label!r} is not in labels "
                                          f"({len(self._naming.labels)} names, indices 0-{len(self._naming.labels) - 1})")
        elif split not in self._naming.splits:
            problem = ImageError("split", f"split {split!r} is not in splits {list(self._naming.splits)}")
        elif misfit is not None:
            problem = ImageError("features", misfit)
        if problem is not None:
            failure = failure_report(entry, problem)
            self._counters.count(Outcome(None, failure, 0))
            yield TaggedOutput(_FAILED, failure)
            return
        yield entry if data is None else (entry, data)

    def _labels(self, labels: Any, element: Any) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """A multi-label element's names and ids (UNKNOWN_LABEL for a name or index not in ``labels``)."""
        if not isinstance(labels, (list, tuple)):
            raise ElementError(f"with multi_label=True an element's label is a list of names or indices: "
                               f"{_short(element)}")
        pairs = dict(self._label(label) for label in labels)  # in order, each label once
        return tuple(pairs), tuple(pairs.values())

    def _features(self, values: Any, element: Any) -> tuple[dict[str, Any] | None, str | None]:
        """An element's extra features, and why one does not fit its declared kind (None if all do).

        Raises:
          ElementError: features that are not a dict of exactly the declared keys.
        """
        declared = self._naming.extra_features
        if not declared:
            if values is not None:
                raise ElementError(f"an element has features, but WriteImageDataset declares no extra_features: "
                                   f"{_short(element)}")
            return None, None
        if not isinstance(values, Mapping) or set(values) != set(declared):
            raise ElementError(f"an element's features are a dict of the keys of extra_features "
                               f"({', '.join(declared)}): {_short(element)}")
        out = {}
        for key, kind in declared.items():
            value = values[key]
            if not _fits(value, kind):
                return None, f"feature {key!r} is {_short(value)}, not {kind}"
            out[key] = float(value) if kind == "float" else value
        return out, None

    def _label(self, label: Any) -> tuple[str, int]:
        labels = self._naming.labels
        if isinstance(label, str):
            return label, self._ids.get(label, UNKNOWN_LABEL)
        if isinstance(label, numbers.Integral) and not isinstance(label, bool) and 0 <= label < len(labels):
            return labels[int(label)], self._ids[labels[int(label)]]
        return str(label), UNKNOWN_LABEL

    def _default_name(self, path: str, data: bytes | None) -> str:
        if data is not None:
            return "sha256:" + hashlib.sha256(data).hexdigest()
        root = self._naming.root
        if root is None:
            return path
        full = os.path.abspath(path) if is_local(path) and is_local(root) else path
        return full[len(root) + 1:] if full.startswith(root + "/") else path


def _fits(value: Any, kind: str) -> bool:
    """Whether a feature's value is of its declared kind (bytes: a str; an int counts as a float)."""
    if kind == "bytes":
        return isinstance(value, str)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return isinstance(value, numbers.Integral) and -(2**63) <= value < 2**63 if kind == "int64" else True


def _finalize(listed: int, config: PrepareConfig, plan: RunPlan, options: dict[str, Any] | None = None,
              **reported: Any) -> dict[str, Any]:
    """The manifest step, under the output's claim.

    Refuses a dataset that appeared since the transform was applied (unless ``overwrite``; not
    where this run's publication began: a retried step finishes it), or, for an append, one that
    gained a version since (``append.check_version``), then ``publish.complete`` with the sink's
    reports; then ``_checked_leakage``.
    """
    with claim_output(config.output, plan.run_id, heartbeat_s=None):
        if not publish.begun(config.output, plan.run_id, reported["shards"]):
            layout.check_output(config.output, config.overwrite, [], config.append)
            if config.append:
                append.check_version(config.output, config.version)
        built = publish.complete(config, dataclasses.replace(plan, listed=listed), publish.ShardReports(**reported),
                                 options)
    return _checked_leakage(config, built)


def _published(_: Any, config: PrepareConfig) -> dict[str, Any]:
    """The manifest step of a transform whose publication a kill cut short, finished when it was applied."""
    return _checked_leakage(config, manifest.read(config.output))


def _checked_leakage(config: PrepareConfig, built: dict[str, Any]) -> dict[str, Any]:
    """The manifest; with ``cross_split_duplicates="fail"``, fails the job if copies lie in two splits."""
    leaking = duplicates.leakage_error(config.cross_split_duplicates, built, config.output)
    if leaking is not None:
        raise CrossSplitLeakage(leaking, built)
    return built


def _given_keywords(init: Callable[..., None]) -> Callable[..., None]:
    """``init``, recording the keywords its caller gave (``self._given``).

    An append takes the dataset's value for each option not given, and refuses one given that contradicts it.
    """

    @functools.wraps(init)
    def recording(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._given = frozenset(kwargs)
    return recording


class WriteImageDataset(beam.PTransform):
    """Writes a PCollection of ``(source, label[, split[, name[, features]]])`` as a beam-prep dataset.

    ``source`` is a path (local or ``gs://``) or an image file's bytes; ``label``
    a name in ``labels`` or its index; see ``ImageElement``. Every element
    becomes a record as the command makes it, or a line of errors.jsonl (an
    image that cannot be read or decoded, an unknown label or split), never a
    failed job. The output is the command's: shards per split, labels.txt,
    errors.jsonl and, written last, manifest.json, whose ``counts.listed`` is
    the number of elements (an append's: less those the dataset holds). Applied, it returns a PCollection of that manifest
    (one dict). Labels are given and splits declared because a pipeline's writes
    are built before any element exists. See docs/guides/beam-pipeline.md.

    While the pipeline runs, ``ElementError`` (an element that is not such a
    tuple), ``DatasetError`` (counts that do not add up) and, with
    ``cross_split_duplicates="fail"``, ``CrossSplitLeakage`` (raised once the
    dataset is written) fail the job.

    Args:
      output: the dataset folder, local or ``gs://``.
      labels: the label names in id order (labels.txt); an element's int label is the index.
      label_offset: stored ids start at this number (``--label_offset``: 1 keeps id 0 for background).
      labels_txt: labels.txt's form, ``names`` or ``slim`` (``--labels_txt``).
      image_size: an int for a square, ``(height, width)`` or ``"HxW"``; None: 224, or
        each image's own size with ``resize_mode="none"`` (``--image_size``).
      resize_mode: ``center_crop``, ``stretch``, ``pad``, ``shorter_side`` or ``none`` (``--resize_mode``).
      channels: 3 for RGB, 1 for grayscale (``--channels``).
      image_format: ``jpeg``, ``png``, ``raw`` or ``original`` (``--image_format``).
      jpeg_quality: JPEG quality, 1-100 (``--jpeg_quality``).
      max_pixels: images with more pixels go to errors.jsonl (``--max_pixels``, a decompression-bomb guard).
      no_upscale: with ``shorter_side``, an image already smaller keeps its size (``--no_upscale``).
      background: the colour transparent pixels are composited on: a name or ``#rrggbb`` (``--background``).
      validation_percent: share of elements without a split put in ``validation``, by name hash.
      splits: the splits elements may name, in manifest order (default: train[, validation]).
      root: paths under it are named relative to it, as the command names files under ``--input``.
      num_shards: shards per split; None lets the runner choose (as ``WriteToTFRecord`` does).
      compression: ``gzip`` or ``none`` for TFRecords; None: as the command chooses
        (``none`` for ``original`` images and for the other file formats, else ``gzip``).
      file_format: ``tfrecord``, ``array_record`` or ``webdataset`` (``--file_format``).
      overwrite: replace a dataset, or an unfinished run's files, already in ``output``.
      append: add the elements to the dataset in ``output`` as its next version, as ``prepare --append``
        does: the options not given are the dataset's, one given that contradicts them is refused; its
        label ids stay, and ``labels`` it lacks get the next ids in the order of their names; its splits
        unless ``splits`` is given; new shards ``<split>-v<version>-...``. An element whose bytes a
        record of the dataset has is left out, as ``prepare --append`` leaves it out: a copy (another
        path) is named in skipped.jsonl and changed.jsonl and counted as skipped, the record's own
        file (its path) counted as unchanged; since its sha256 is known only once a worker has read
        it, it is written, then its shard written again without it before anything is published.
        ``counts.listed`` is then the elements less those. A dataset made with ``--stratify`` or
        ``--max_per_class`` is refused.
      read_concurrency: files each worker reads ahead of its work at once; the default
        reads ahead since paths may be anywhere (0: each file in the worker's thread).
      read_ahead_mb: cap on the bytes a worker's read-ahead holds (``--read_ahead_mb``).
      multi_label: each element's label is a list; records hold a list of ids, as ``--metadata``'s
        labels column makes them.
      extra_features: feature key -> ``bytes``, ``int64`` or ``float``: each element's ``features``
        give these, stored in its record and listed in the manifest, as ``--metadata``'s columns.
      near_duplicate_distance: records whose perceptual hashes differ in at most this many bits
        are near duplicates; -1 finds exact copies only (``--near_duplicate_distance``).
      cross_split_duplicates: ``report`` copies across splits, ``drop`` each file that copies a
        file kept in an earlier split (train first, test last; named in skipped.jsonl), or
        ``fail`` the job once the dataset is written (``--cross_split_duplicates``).

    Raises:
      OptionsError: when constructed or applied, before the pipeline runs: a bad
        argument; ``output`` holds a dataset or an unfinished run's files and
        ``overwrite`` is False; another run is writing into it; with ``append``, no
        dataset in ``output``, or an argument that contradicts it.
      StorageError: when applied: ``output`` cannot be listed.
    """

    @_given_keywords
    def __init__(
        self,
        output: str,
        labels: Sequence[str],
        *,
        label_offset: int = 0,
        labels_txt: str = "names",
        image_size: int | tuple[int, int] | str | None = None,
        resize_mode: str = "center_crop",
        channels: int = 3,
        image_format: str = "jpeg",
        jpeg_quality: int = 90,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        no_upscale: bool = False,
        background: str = DEFAULT_BACKGROUND,
        validation_percent: float = 0.0,
        splits: Sequence[str] | None = None,
        root: str | None = None,
        num_shards: int | None = None,
        compression: str | None = None,
        file_format: str = "tfrecord",
        overwrite: bool = False,
        append: bool = False,
        read_concurrency: int = DEFAULT_REMOTE_READ_CONCURRENCY,
        read_ahead_mb: int = DEFAULT_READ_AHEAD_MB,
        multi_label: bool = False,
        extra_features: Mapping[str, str] | None = None,
        near_duplicate_distance: int = DEFAULT_DISTANCE,
        cross_split_duplicates: str = "report",
    ) -> None:
        """Checks every argument (see the class's Args), before any pipeline is built."""
        super().__init__()
        if append and overwrite:
            raise OptionsError("append adds to the dataset in output and overwrite replaces it: pass one of them")
        if compression is None:
            compression = default_compression(image_format, file_format)
        check_file_format(file_format, compression, prefix="")
        check_values({"label_offset": label_offset, "labels_txt": labels_txt,
                      "validation_percent": validation_percent, "compression": compression,
                      "read_concurrency": read_concurrency, "read_ahead_mb": read_ahead_mb,
                      "resize_mode": resize_mode, "image_format": image_format,
                      "near_duplicate_distance": near_duplicate_distance,
                      "cross_split_duplicates": cross_split_duplicates}, prefix="")
        resample_loader.choice()  # a BEAM_PREP_RESIZE_KERNEL value it does not take: refused here, not per image
        self._naming = _Naming(labels=_checked_labels(labels),
                               splits=_checked_splits(splits, validation_percent),
                               validation_percent=float(validation_percent),
                               root=normalised_path(root) if root is not None else None, label_offset=label_offset,
                               multi_label=bool(multi_label), extra_features=_checked_features(extra_features))
        if num_shards is not None and (not isinstance(num_shards, int) or num_shards < 0):
            raise OptionsError(f"num_shards must be a positive int (None: the runner chooses), not {num_shards!r}")
        spec = _checked_spec(image_size, resize_mode, channels, image_format, jpeg_quality, max_pixels,
                             no_upscale, background)
        self._config = PrepareConfig(
            input=self._naming.root or "", output=normalised_path(output),
            spec=dataclasses.replace(spec, perceptual_hash=near_duplicate_distance >= 0),
            validation_percent=validation_percent, num_shards=num_shards or 0, overwrite=overwrite,
            sink="shuffle", compression=compression,
            reads=ReadAheadConfig(concurrency=read_concurrency, max_bytes=read_ahead_mb * 2**20),
            label_offset=label_offset, labels_txt=labels_txt, file_format=file_format,
            near_duplicate_distance=near_duplicate_distance, cross_split_duplicates=cross_split_duplicates,
            append=bool(append))

    def expand(self, elements: PCollection) -> PCollection:
        """Beam's PTransform entry point: the elements written as the dataset (see the class)."""
        config, naming = self._config, self._naming
        run_id = new_run_id()
        options = _options(config, naming)
        if config.append:
            _appending(config, naming, self._given)  # refused before any work
        if _clear_output(config.output, config.overwrite, run_id, options, config.append):
            return (elements
                    | "CountElements" >> beam.combiners.Count.Globally()
                    | "Finalize" >> beam.Map(_published, config))
        appended = None
        if config.append:  # the dataset as it is now, a publication left unfinished finished: the version after it
            config, naming, appended = _appending(config, naming, self._given)
            info, dataset = append.read_dataset(config.output)  # one made before kept hash files: made here
            existing.write_unkept(config.output, info, dataset, layout.run_folder(config.output, run_id))
        elif config.overwrite:
            label_ids.warn_if_ids_move(config.output, naming.labels, config.label_offset)
        plan = RunPlan(labels=list(naming.order), num_shards={s: config.num_shards for s in naming.splits},
                       listed=0, skipped=0, sink=config.sink, run_id=run_id, multi_label=naming.multi_label,
                       extra_features=dict(naming.extra_features), appended=appended,
                       copies_written=config.append)
        entries = elements | "ToEntries" >> beam.ParDo(_ElementToEntryFn(naming)).with_outputs(
            _FAILED, main="entries")
        written = entries.entries | "WriteShards" >> WriteEntriesShuffle(
            config.spec, config.reads, layout.run_folder(config.output, run_id), config.compression,
            plan.num_shards, file_format=config.file_format, version=config.version)
        failures = (written.failures, entries[_FAILED]) | "AllFailures" >> beam.Flatten()
        return (elements
                | "CountElements" >> beam.combiners.Count.Globally()
                | "Finalize" >> beam.Map(_finalize, config, plan, options,
                                         **publish.side_inputs(written, failures, config, _NEAR_SEARCH_COUNT)))


def _options(config: PrepareConfig, naming: _Naming) -> dict[str, Any]:
    """What the same transform repeats (as ``resume.record_options`` is the same command), as JSON values."""
    return json.loads(json.dumps({**resume.command_options(config), "labels": list(naming.labels),
                                  "splits": list(naming.splits), "multi_label": naming.multi_label,
                                  "extra_features": dict(naming.extra_features)}))


def _clear_output(output: str, overwrite: bool, run_id: str, options: dict[str, Any], adding: bool = False) -> bool:
    """Refuses an occupied ``output`` without ``overwrite`` or ``adding``; with either, removes unfinished runs' files.

    A publication a run was stopped in is finished first (``publication.finish_unfinished``); where
    it was the same transform's (``options``, without ``overwrite``), its dataset is this one's, and
    True says so. Done under the output's claim, so a command running into the folder is refused
    (``OutputBusy``) rather than having its files removed.
    """
    with claim_output(output, run_id, heartbeat_s=None):
        finished = publication.finish_unfinished(output, layout.unfinished_runs(output, CLAIM_NAME), overwrite)
        if not overwrite and any(p.options == options for p in finished):
            return True
        leftovers = layout.unfinished_runs(output, CLAIM_NAME)
        layout.check_output(output, overwrite, leftovers, adding)
        layout.remove_unfinished_runs(output, leftovers)
    return False


def _appending(config: PrepareConfig, naming: _Naming, given: Collection[str]) -> tuple[PrepareConfig, _Naming,
                                                                                         dict[str, Any]]:
    """An append's configuration and naming, and what it adds (``append.Additions``, for the manifest's version).

    The dataset's options (``append.appending_config``); its labels' ids kept, and the labels given that
    it lacks after them, in the order of their names; its splits, unless ``splits`` is given.

    Raises:
      OptionsError: no dataset in ``output`` (or a damaged one, or one from a newer beam-prep), an argument
        given that contradicts the dataset's, a dataset made with ``--stratify`` or ``--max_per_class``
        (which need every file listed first), or one of another kind of records.
    """
    try:
        config = append.appending_config(config, [name for name in _TAKEN if name in given])
        info, _ = append.read_dataset(config.output)
    except OptionsError as e:  # the command's words: flags named as this transform's arguments
        raise OptionsError(re.sub(r"--(?=[a-z])", "", str(e))) from e
    if config.stratify or config.max_per_class is not None:
        option = "stratify" if config.stratify else f"max_per_class {config.max_per_class}"
        raise OptionsError(f"the dataset in {config.output} was made with {option}, which chooses among all the "
                           "files at once and WriteImageDataset sees one element at a time: append with "
                           "beam_prep.prepare(..., append=True)")
    if naming.multi_label != info.multi_label or dict(naming.extra_features) != dict(info.extra_features):
        raise OptionsError(f"the dataset in {config.output} holds other records (multi_label={info.multi_label}, "
                           f"extra_features={dict(info.extra_features)}): an append adds records alike")
    new = sorted(set(naming.labels) - set(info.labels))
    splits = naming.splits if "splits" in given else tuple(dict.fromkeys(
        [*info.splits, *_checked_splits(None, config.validation_percent)]))
    append.check_new_names(config.output, info, splits, config.version)
    naming = dataclasses.replace(naming, ids=(*info.labels, *new), splits=splits,
                                 validation_percent=config.validation_percent, label_offset=config.label_offset)
    return config, naming, append.Additions(new_labels=new).to_json()



def _checked_labels(labels: Sequence[str]) -> tuple[str, ...]:
    if isinstance(labels, (str, bytes)):
        raise OptionsError(f"labels is a list of names, not one {type(labels).__name__}: {labels!r}")
    labels = tuple(labels)
    if not labels:
        raise OptionsError("labels must name at least one label")
    seen = set()
    for label in labels:
        if not isinstance(label, str) or not label:
            raise OptionsError(f"labels are non-empty names (str), not {label!r}")
        check_label_name(label, label, what="label")
        if label in seen:
            raise OptionsError(f"labels lists {label!r} more than once")
        seen.add(label)
    return labels


def _checked_features(extra_features: Mapping[str, str] | None) -> dict[str, str]:
    """``extra_features``, checked: keys that are not the record's own, kinds bytes, int64 or float."""
    if extra_features is None:
        return {}
    if not isinstance(extra_features, Mapping):
        raise OptionsError(f"extra_features maps each feature's key to its kind, not {extra_features!r}")
    for key, kind in extra_features.items():
        if not isinstance(key, str) or not key or key in SCHEMA:
            raise OptionsError(f"extra_features: {key!r} cannot be a feature of its own (empty, or a key of the "
                               "record's image and label): rename it")
        if kind not in ("bytes", "int64", "float"):
            raise OptionsError(f"extra_features: {key!r} has kind {kind!r}, not one of bytes, int64, float")
    return dict(extra_features)


def _checked_splits(splits: Sequence[str] | None, validation_percent: float) -> tuple[str, ...]:
    if splits is None:
        return (DEFAULT_SPLIT, VALIDATION_SPLIT) if validation_percent else (DEFAULT_SPLIT,)
    if isinstance(splits, (str, bytes)):
        raise OptionsError(f"splits is a list of names, not one {type(splits).__name__}: {splits!r}")
    splits = tuple(splits)
    if not splits or len({str(split).lower() for split in splits}) != len(splits):  # Train is train on macOS
        raise OptionsError(f"splits must name one split or more, each once (in any case), not {list(splits)}")
    for split in splits:
        _check_split_name(split)
    return splits


def _check_split_name(split: Any) -> None:
    """Refuses a split name the readers would refuse in its files' names (``model.names``' rule).

    A split names its shard files (``<split>-00000-of-00004.tfrecord.gz``) and their DALI indexes
    (``dali-<shard>.idx``, the longest): no separators, no globs, no words for a shell.

    Raises:
      OptionsError: naming the split and the rule.
    """
    room = NAME_MAX - len(index_name(layout.shard_name("", 0, 1, shard_suffix(TFRECORD, "none"))))  # the longest
    if not isinstance(split, str) or name_problem(split) is not None or len(split) > room:
        raise OptionsError(f"split {split!r} cannot name shard files: use ASCII letters, digits, _ . - "
                           f"(not . or - first), at most {room} of them")


def _checked_spec(image_size: int | tuple[int, int] | str | None, resize_mode: str, channels: int,
                  image_format: str, jpeg_quality: int, max_pixels: int, no_upscale: bool,
                  background: str) -> ImageSpec:
    if isinstance(image_size, tuple):
        image_size = "x".join(str(side) for side in image_size)
    return image_spec(None if image_size is None else str(image_size), resize_mode, channels, image_format,
                      jpeg_quality, max_pixels, prefix="", no_upscale=no_upscale, background=background)
