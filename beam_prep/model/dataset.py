"""What a beam-prep dataset is: its labels, splits, image description and compression, and their JSON form.

The one model of a dataset that both sides use: the writer builds a
:class:`DatasetInfo` and writes ``DatasetInfo.to_json()`` into
``manifest.json`` (:mod:`beam_prep.write.finish.manifest`), the reader reads it back with
``DatasetInfo.from_json`` (:func:`beam_prep.reader.load_info`). Each object
owns both directions of its JSON, as TFDS's feature objects do, so a field
added on one side cannot be forgotten on the other.

No Beam and no TensorFlow here: Beam workers and training hosts both import it.
Reading and writing the file itself stays with each side (Beam's
``FileSystems`` on one, ``tf.io.gfile`` on the other).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from beam_prep.errors import DatasetError, OptionsError
from beam_prep.io.storage import join
from beam_prep.model.features import IMAGE_FORMATS
from beam_prep.model.names import check_distinct, check_file_name

__all__ = [
    "COMPRESSIONS",
    "FILE_FORMATS",
    "FORMAT_VERSION",
    "MANIFEST",
    "READ_COMPRESSIONS",
    "Compression",
    "DatasetInfo",
    "FileFormat",
    "ImageInfo",
    "SplitInfo",
    "VersionInfo",
    "labels_lines",
    "parse_manifest",
    "shard_suffix",
]

MANIFEST = "manifest.json"
# The manifest format this beam-prep writes, and the newest it reads.
FORMAT_VERSION = 1


class Compression(NamedTuple):
    """How one ``--compression`` choice is written: file suffix, Beam's and the manifest's name."""

    suffix: str
    beam_type: str  # an apache_beam CompressionTypes value (those are plain strings)
    manifest_name: str  # also TensorFlow's name for it


# --compression -> how shards are written and what the manifest calls it.
COMPRESSIONS: Mapping[str, Compression] = {
    "gzip": Compression(".tfrecord.gz", "gzip", "GZIP"),
    "none": Compression(".tfrecord", "uncompressed", "NONE"),
}
# What the reader takes: what the writer writes, and ZLIB, which TensorFlow
# also reads (for files written elsewhere).
READ_COMPRESSIONS = ("GZIP", "ZLIB", "NONE")


class FileFormat(NamedTuple):
    """How one ``--file_format`` names its shards, and what reads them: said in every
    error that finds a dataset in the hands of another format's reader."""

    suffix: str  # tfrecord: its compression's suffix instead (COMPRESSIONS)
    reader: str


TFRECORD = "tfrecord"
# --file_format -> its shards' suffix and its reader. TFDS's names for the same choice.
FILE_FORMATS: Mapping[str, FileFormat] = {
    TFRECORD: FileFormat(".tfrecord", "beam_prep.make_dataset (tf.data)"),
    "array_record": FileFormat(".array_record", "beam_prep.data_source (Grain, PyTorch)"),
    "webdataset": FileFormat(".tar", "beam_prep.webdataset_pipeline (webdataset, PyTorch)"),
}


def shard_suffix(file_format: str, compression: str) -> str:
    """A shard's file name suffix: a TFRecord's says its compression (``.tfrecord.gz``); the
    other formats are never GZIP-compressed."""
    if file_format == TFRECORD:
        return COMPRESSIONS[compression].suffix
    return FILE_FORMATS[file_format].suffix


@dataclasses.dataclass(frozen=True)
class ImageInfo:
    """How images are stored: the manifest's ``image`` section, or given for bare files.

    ``height`` and ``width`` are None when images keep varying sizes
    (``resize_mode`` shorter_side or none); every image has ``channels``.
    ``resize_mode`` is what the writer did (None when unknown: bare files);
    the reader does not need it.
    """

    height: int | None
    width: int | None
    channels: int = 3
    format: str = "jpeg"
    resize_mode: str | None = None

    def __post_init__(self) -> None:
        if self.format not in IMAGE_FORMATS:
            raise OptionsError(f"image format must be one of {IMAGE_FORMATS}, not {self.format!r}")
        if self.channels not in (1, 3):
            raise OptionsError(f"image channels must be 1 or 3, not {self.channels}")
        if (self.height is None) != (self.width is None):
            raise OptionsError("image height and width are both sizes or both None (sizes vary)")
        if self.height is not None and (self.height < 1 or self.width < 1):
            raise OptionsError(f"image size must be positive, not {self.height}x{self.width}")

    @property
    def fixed_size(self) -> bool:
        """Whether every stored image has the same height and width."""
        return self.height is not None

    def to_json(self) -> dict[str, Any]:
        return {"height": self.height, "width": self.width, "channels": self.channels,
                "format": self.format, "resize_mode": self.resize_mode}

    @classmethod
    def from_json(cls, image: Mapping[str, Any]) -> ImageInfo:
        return cls(height=image.get("height"), width=image.get("width"),
                   channels=int(image.get("channels", 3)), format=str(image.get("format", "jpeg")),
                   resize_mode=image.get("resize_mode"))


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """One split: its shard files and, when the writer knew them, each one's record count,
    size in bytes and sha256 (lists in ``shards``' order).

    ``shards`` are names relative to the dataset folder ``root`` (as the
    manifest lists them); ``files`` are their full paths. ``dali_index``: each shard's DALI
    index file (``io.dali_index``), where the writer wrote them (uncompressed TFRecord
    shards); ``index_files`` are their full paths.
    """

    name: str
    shards: tuple[str, ...]
    num_examples: int
    shard_num_examples: tuple[int, ...] | None = None
    class_counts: Mapping[str, int] | None = None
    root: str = ""
    shard_bytes: tuple[int, ...] | None = None
    shard_sha256: tuple[str, ...] | None = None
    dali_index: tuple[str, ...] | None = None

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(join(self.root, shard) for shard in self.shards)

    def first(self, shards: int, num_examples: int, class_counts: Mapping[str, int] | None) -> SplitInfo:
        """The split as its first ``shards`` shards, holding ``num_examples`` records (``class_counts``)."""
        def cut(values):
            return values[:shards] if values is not None else None
        return dataclasses.replace(
            self, shards=self.shards[:shards], num_examples=num_examples, class_counts=class_counts,
            shard_num_examples=cut(self.shard_num_examples), shard_bytes=cut(self.shard_bytes),
            shard_sha256=cut(self.shard_sha256), dali_index=cut(self.dali_index))

    @property
    def index_files(self) -> tuple[str, ...] | None:
        return tuple(join(self.root, name) for name in self.dali_index) if self.dali_index is not None else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_examples": self.num_examples, "shards": list(self.shards)}
        if self.class_counts is not None:
            out["class_counts"] = dict(self.class_counts)
        if self.shard_num_examples is not None:
            out["shard_num_examples"] = list(self.shard_num_examples)
        if self.shard_bytes is not None:
            out["shard_bytes"] = list(self.shard_bytes)
        if self.shard_sha256 is not None:
            out["shard_sha256"] = list(self.shard_sha256)
        if self.dali_index is not None:
            out["dali_index"] = list(self.dali_index)
        return out

    @classmethod
    def from_json(cls, name: str, split: Mapping[str, Any], root: str = "",
                  seen: dict[str, tuple[str, str]] | None = None) -> SplitInfo:
        """Raises DatasetError (without the manifest's path: the caller adds it), UnsafeName for a split,
        shard or index name beam-prep does not write (``names.check_file_name``), or a file named twice, in
        any case, or named as the manifest (``names.check_distinct``; ``seen``: the files other splits
        named, which this one's are added to)."""
        check_file_name(name, "a split's name")
        names = {key: split[key] for key in ("shards", "dali_index") if split.get(key) is not None}
        for key, value in names.items():
            if not isinstance(value, list):
                raise DatasetError(f"splits.{name}.{key} is {value!r}, not a list of file names")
            for i, file_name in enumerate(value):
                check_file_name(file_name, f"splits.{name}.{key}[{i}]")
        shards = tuple(split["shards"])
        for key in ("shard_num_examples", "shard_bytes", "shard_sha256", "dali_index"):
            if split.get(key) is not None and len(split[key]) != len(shards):
                raise DatasetError(f"split {name!r} lists {len(shards)} shards but {len(split[key])} {key}")
        if seen is None:
            seen = {}
        seen.setdefault(MANIFEST, ("the manifest", MANIFEST))  # a shard or an index over it would replace it
        for key, value in names.items():
            check_distinct(value, f"splits.{name}.{key}", seen)
        counts, sizes, sha256 = (split.get(key) for key in ("shard_num_examples", "shard_bytes", "shard_sha256"))
        class_counts = split.get("class_counts")
        return cls(name=name, shards=shards, num_examples=int(split["num_examples"]),
                   shard_num_examples=tuple(int(n) for n in counts) if counts is not None else None,
                   class_counts=dict(class_counts) if class_counts is not None else None, root=root,
                   shard_bytes=tuple(int(n) for n in sizes) if sizes is not None else None,
                   shard_sha256=tuple(str(h) for h in sha256) if sha256 is not None else None,
                   dali_index=tuple(split["dali_index"]) if split.get("dali_index") is not None else None)


@dataclasses.dataclass(frozen=True)
class VersionInfo:
    """One version of a dataset: what its run added (the first run: version 1; each append: the next).

    ``added``: split -> (shard names, records, records per label) the version added, its shards at
    the end of the split's ``shards``. ``num_labels``: the labels the dataset had then (labels only
    grow, new ones at the end, so a version's labels are the first ``num_labels``). ``created``
    and ``input``: when and from what it was made (None where a manifest did not say).
    """

    version: int
    added: Mapping[str, tuple[tuple[str, ...], int, Mapping[str, int] | None]]
    num_labels: int
    created: str | None = None
    input: str | None = None
    appended: Mapping[str, Any] | None = None
    """An append's word on the files it did not write (``append.Additions.counts``); None for version 1."""

    @property
    def num_examples(self) -> int:
        return sum(n for _, n, _ in self.added.values())

    def to_json(self) -> dict[str, Any]:
        splits = {}
        for split, (shards, n, class_counts) in self.added.items():
            splits[split] = {"num_examples": n, "shards": list(shards)}
            if class_counts is not None:
                splits[split]["class_counts"] = dict(class_counts)
        out = {"version": self.version, "created": self.created, "input": self.input,
               "num_labels": self.num_labels, "splits": splits}
        if self.appended is not None:
            out["appended"] = dict(self.appended)
        return out

    @classmethod
    def from_json(cls, version: Mapping[str, Any]) -> VersionInfo:
        added = {str(split): (tuple(str(name) for name in v["shards"]), int(v["num_examples"]),
                              {str(k): int(n) for k, n in v["class_counts"].items()}
                              if v.get("class_counts") is not None else None)
                 for split, v in version["splits"].items()}
        created, source = version.get("created"), version.get("input")
        appended = version.get("appended")
        return cls(version=int(version["version"]), added=added, num_labels=int(version["num_labels"]),
                   created=str(created) if created is not None else None,
                   input=str(source) if source is not None else None,
                   appended=dict(appended) if appended is not None else None)

    @classmethod
    def whole(cls, labels: Sequence[str], splits: Mapping[str, SplitInfo], created: str | None = None,
              source: str | None = None) -> VersionInfo:
        """Version 1 holding every record of ``splits``: a first run's, or a manifest's without versions."""
        return cls(version=1, num_labels=len(labels), created=created, input=source,
                   added={name: (s.shards, s.num_examples, s.class_counts) for name, s in splits.items()})


def _check_versions(versions: Sequence[VersionInfo], splits: Mapping[str, SplitInfo], num_labels: int) -> None:
    """Each version numbered from 1, and the versions' shards, in order, each split's whole list (their
    record counts are ``verify``'s to check, against the records).

    Raises:
      DatasetError: (without the manifest's path: the caller adds it) what does not add up.
    """
    if not versions:
        raise DatasetError("versions is empty: a dataset has version 1 at least")
    for i, version in enumerate(versions):
        if version.version != i + 1:
            raise DatasetError(f"versions[{i}] is version {version.version}, not {i + 1}")
        unknown = [split for split in version.added if split not in splits]
        if unknown:
            raise DatasetError(f"version {version.version} adds to split {unknown[0]!r}, which splits lacks")
        if not 0 <= version.num_labels <= num_labels or (i and version.num_labels < versions[i - 1].num_labels):
            raise DatasetError(f"version {version.version} has {version.num_labels} labels, of {num_labels}")
    for name, split in splits.items():
        shards = tuple(s for v in versions for s in v.added.get(name, ((), 0, None))[0])
        if shards != split.shards:
            raise DatasetError(f"the versions' shards of split {name!r} are not its shards, in order "
                               f"({len(shards)} and {len(split.shards)})")


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """A dataset's description, checked: what the writer records and the reader reads.

    ``root`` is the dataset folder ("" until it has one); ``compression`` is
    the manifest's name for it (``GZIP``, ``NONE``). ``label_offset`` is what
    the writer added to each label's index in ``labels`` to get the id it
    stored (``--label_offset``: 1 for code that keeps 0 for background).
    ``multi_label``: each record holds a list of label ids (``--metadata``'s labels
    column), not one. ``extra_features``: the record's features beyond the image and
    label (``--metadata``'s other columns), key -> kind (bytes, int64 or float).
    ``file_format`` is a key of ``FILE_FORMATS`` (manifests before it: ``tfrecord``).
    """

    root: str
    labels: tuple[str, ...]
    splits: Mapping[str, SplitInfo]
    image: ImageInfo
    compression: str = "GZIP"
    label_offset: int = 0
    multi_label: bool = False
    extra_features: Mapping[str, str] = dataclasses.field(default_factory=dict)
    file_format: str = TFRECORD
    versions: tuple[VersionInfo, ...] = ()

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    @property
    def history(self) -> tuple[VersionInfo, ...]:
        """The dataset's versions, oldest first: ``versions``, or version 1 holding everything."""
        return self.versions or (VersionInfo.whole(self.labels, self.splits),)

    @property
    def version(self) -> int:
        """The latest version: the one this description holds."""
        return len(self.history)

    def at_version(self, version: int | None) -> DatasetInfo:
        """The dataset as it was at ``version``: its splits hold that version's shards and records only,
        and its labels those it had then. None: the latest (this description).

        Raises:
          DatasetError: no such version (one line naming the dataset and its versions).
        """
        history = self.history
        if version is None:
            return self
        if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= len(history):
            have = "version 1" if len(history) == 1 else f"versions 1-{len(history)}"
            raise DatasetError(f"{self.root or 'this dataset'} has no version {version!r}: it has {have}")
        if version == len(history):
            return self
        kept = history[:version]
        splits = {}
        for name, split in self.splits.items():
            added = [v.added[name] for v in kept if name in v.added]
            if added:
                splits[name] = split.first(sum(len(shards) for shards, _, _ in added),
                                           sum(n for _, n, _ in added), _summed(c for _, _, c in added))
        return dataclasses.replace(self, labels=self.labels[:kept[-1].num_labels], splits=splits, versions=kept)

    def require_format(self, file_format: str, reader: str) -> None:
        """Refuses a dataset of another format than ``reader`` reads, naming the reader that does.

        Raises:
          DatasetError: the dataset's format is not ``file_format``.
        """
        if self.file_format != file_format:
            right = FILE_FORMATS[self.file_format].reader
            raise DatasetError(f"{self.root or 'this dataset'} holds {self.file_format} shards "
                               f"(--file_format {self.file_format}), which {reader} does not read: "
                               f"read it with {right}")

    def to_json(self) -> dict[str, Any]:
        """The manifest's dataset keys, in the manifest's order (the writer adds its run's record)."""
        out = {
            "format_version": FORMAT_VERSION,
            "labels": list(self.labels),
            "splits": {name: split.to_json() for name, split in self.splits.items()},
            "image": self.image.to_json(),
            "compression": self.compression,
            "label_offset": self.label_offset,
            "file_format": self.file_format,
        }
        if self.multi_label:  # written only where set: single-label manifests stay as they were
            out["multi_label"] = True
        if self.extra_features:
            out["extra_features"] = dict(self.extra_features)
        if self.versions:  # a description made without them (not from a manifest) holds one version: said by omission
            out["versions"] = [v.to_json() for v in self.versions]
        return out

    @classmethod
    def from_json(cls, manifest: Any, root: str, where: str) -> DatasetInfo:
        """Checks a parsed manifest; ``where`` (its path) names it in errors.

        Raises:
          DatasetError: a newer format, or a manifest that is incomplete or malformed.
        """
        try:
            version = manifest["format_version"]
            if version > FORMAT_VERSION:
                raise DatasetError(
                    f"{where} has format_version {version}; this beam-prep reads up to "
                    f"{FORMAT_VERSION}: upgrade beam-prep")
            try:
                seen: dict[str, tuple[str, str]] = {}  # each file once, in any case, across the splits
                splits = {name: SplitInfo.from_json(name, s, root, seen)
                          for name, s in manifest["splits"].items()}
            except DatasetError as e:  # its own type kept: UnsafeName stays one
                raise type(e)(f"{where}: {e}") from e
            compression = str(manifest.get("compression", "GZIP")).upper()
            if compression not in READ_COMPRESSIONS:
                raise DatasetError(f"{where}: unknown compression {compression!r}")
            file_format = str(manifest.get("file_format", TFRECORD))
            if file_format not in FILE_FORMATS:
                raise DatasetError(f"{where}: unknown file_format {file_format!r} (this beam-prep reads "
                                   f"{', '.join(FILE_FORMATS)}): upgrade beam-prep")
            labels = tuple(manifest["labels"])
            versions = _versions(manifest, labels, splits, where)
            return cls(root=root, labels=labels, splits=splits,
                       image=ImageInfo.from_json(manifest["image"]), compression=compression,
                       label_offset=int(manifest.get("label_offset", 0)),
                       multi_label=bool(manifest.get("multi_label", False)),
                       extra_features=_extra_features(manifest.get("extra_features", {})),
                       file_format=file_format, versions=versions)
        except (KeyError, TypeError, AttributeError, ValueError, OverflowError) as e:  # a count "many", 1e400, NaN
            raise DatasetError(f"{where} is incomplete or malformed: missing or bad {e}") from e
        except OptionsError as e:
            raise DatasetError(f"{where}: {e}") from e


_EXTRA_KINDS = ("bytes", "int64", "float")


def _versions(manifest: Mapping[str, Any], labels: tuple[str, ...], splits: Mapping[str, SplitInfo],
              where: str) -> tuple[VersionInfo, ...]:
    """The manifest's versions, checked; a manifest without them (written before versions) holds
    version 1 alone, made when it says, from its input."""
    if manifest.get("versions") is None:
        options = manifest.get("options")
        source = options.get("input") if isinstance(options, Mapping) else None
        created = manifest.get("created")
        return (VersionInfo.whole(labels, splits, str(created) if created is not None else None,
                                  str(source) if source is not None else None),)
    if not isinstance(manifest["versions"], list):
        raise DatasetError(f"{where}: versions is {manifest['versions']!r}, not a list")
    versions = tuple(VersionInfo.from_json(v) for v in manifest["versions"])
    try:
        _check_versions(versions, splits, len(labels))
    except DatasetError as e:
        raise DatasetError(f"{where} is damaged: {e}") from e
    return versions


def _summed(counts: Iterable[Mapping[str, int] | None]) -> dict[str, int] | None:
    """Records per label over several versions' additions; None where one of them did not count."""
    total: dict[str, int] = {}
    for c in counts:
        if c is None:
            return None
        for label, n in c.items():
            total[label] = total.get(label, 0) + n
    return total


def _extra_features(features: Mapping[str, Any]) -> dict[str, str]:
    """The manifest's extra_features, checked: key -> one of bytes, int64, float."""
    bad = {key: kind for key, kind in dict(features).items() if kind not in _EXTRA_KINDS}
    if bad:
        key = next(iter(bad))
        raise OptionsError(f"extra feature {key!r} has kind {bad[key]!r}, not one of {', '.join(_EXTRA_KINDS)}")
    return {str(key): str(kind) for key, kind in features.items()}


def labels_lines(labels: Sequence[str], form: str, label_offset: int) -> list[str]:
    """labels.txt: one name a line in label order (``names``: line k from 0 is stored id
    k + label_offset, and the file is a valid --labels_file), or TF-slim's ``id:name``
    lines with the ids as stored (``slim``: what its dataset_utils.read_label_file parses)."""
    if form == "slim":
        return [f"{i + label_offset}:{name}" for i, name in enumerate(labels)]
    return list(labels)


def parse_manifest(text: bytes | str, where: str) -> Any:
    """The manifest's JSON; ``where`` (its path) names it in the error.

    Raises:
      DatasetError: not valid JSON.
    """
    try:
        return json.loads(text)
    except ValueError as e:
        raise DatasetError(f"{where} is not valid JSON: {e}") from e
