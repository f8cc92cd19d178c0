"""An append (``--append``): the dataset's own options, and what a new listing adds to the dataset.

Before any work: the options come from the dataset's manifest, and one given that contradicts
them is refused (``appending_config``). Once listed, each file is compared with the records
already there (``narrow``): a file at a path the dataset holds is not written (its bytes changed:
``changed.jsonl``), nor one whose bytes it holds (``skipped.jsonl``), and the sources of the
run's input the dataset holds but the listing lacks are counted as gone. A file that failed or was
skipped in an earlier version is counted, not tried or reported again: each report names a file once
across the versions. What the run writes is
the rest, as the dataset's next version (docs/guides/preparing.md, "Adding images").
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import gc
import hashlib
import heapq
import io
import json
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

from beam_prep import wording
from beam_prep.errors import DatasetError, OptionsError
from beam_prep.io.dali_index import SUFFIX as DALI_SUFFIX
from beam_prep.io.dali_index import index_name
from beam_prep.io.storage import is_local, join, open_to_read, read_bytes, storage_error
from beam_prep.model.dataset import COMPRESSIONS, MANIFEST, DatasetInfo, parse_manifest
from beam_prep.write.grow.existing import Existing, Record
from beam_prep.write.grow.existing import read_existing as _read
from beam_prep.write.images.imaging import ImageSpec
from beam_prep.write.plan.config import PrepareConfig, check_values
from beam_prep.write.plan.listing import Listing
from beam_prep.write.plan.listing.listed import Choice
from beam_prep.write.plan.selection import ListedRow
from beam_prep.write.shared import layout
from beam_prep.write.shared.entry import printable
from beam_prep.write.shared.spill import SortedRows, SpillFolder

__all__ = ["COPY_REASON", "Additions", "Existing", "appending_config", "check_new_names", "check_version",
           "describe", "found_lines", "held", "narrow", "read_dataset", "read_existing"]

COPY_REASON = "copy of a record already in the dataset"  # skipped.jsonl's (changed.jsonl names the record)
_THREADS = 16  # files hashed, or shards read, at once
_READ = 1 << 20
_INLINE = (64, 16 << 20)  # local files (at most, and bytes at most) a chunk reads without threads

# Each flag an append takes from the dataset, and the manifest's options that record it.
_TAKEN: Mapping[str, tuple[str, ...]] = {
    "image_size": ("height", "width"), "resize_mode": ("resize_mode",), "channels": ("channels",),
    "image_format": ("image_format",), "jpeg_quality": ("jpeg_quality",), "no_upscale": ("no_upscale",),
    "background": ("background",), "max_pixels": ("max_pixels",), "compression": ("compression",),
    "file_format": ("file_format",), "label_offset": ("label_offset",), "labels_txt": ("labels_txt",),
    "validation_percent": ("validation_percent",), "stratify": ("stratify",), "recursive": ("recursive",),
    "near_duplicate_distance": ("near_duplicate_distance",), "max_per_class": ("max_per_class",),
}
_SPEC_FIELDS = frozenset(f.name for f in dataclasses.fields(ImageSpec))
# Flags an append does not take, and why.
_REFUSED = {
    "labels_file": "an append keeps the dataset's label ids and gives new labels the next ones, by name",
    "overwrite": "--overwrite replaces the dataset",
}


def read_dataset(output: str) -> tuple[DatasetInfo, dict[str, Any]]:
    """The dataset in ``output`` an append adds to, and its whole manifest.

    Raises:
      OptionsError: ``output`` holds no dataset, or one whose manifest is damaged or from a newer
        beam-prep (the reader's word on it): a bad ``--output``, before any work.
    """
    path = join(output, MANIFEST)
    try:
        text = read_bytes(path)
    except Exception as e:
        raise OptionsError(f"--output {output} holds no beam-prep dataset to append to (no {MANIFEST} readable: "
                           f"{e.__class__.__name__}): prepare it without --append first") from e
    try:
        manifest = parse_manifest(text, path)
        return DatasetInfo.from_json(manifest, output, path), manifest
    except DatasetError as e:
        raise OptionsError(str(e)) from e


def appending_config(config: PrepareConfig, given: Collection[str]) -> PrepareConfig:
    """The configuration of an append: the dataset's own options in place of the defaults, and the
    dataset version it makes (the next one).

    Args:
      config: the command's configuration, ``append`` set.
      given: the flags the command was given, by name without dashes (``image_size``).

    Raises:
      OptionsError: no dataset in ``config.output`` (or a damaged one, or one from a newer beam-prep), or
        a flag given that contradicts the dataset's options or that an append does not take (one line,
        naming both values).
    """
    info, manifest = read_dataset(config.output)
    options = manifest.get("options")
    if not isinstance(options, Mapping):
        raise OptionsError(f"{join(config.output, MANIFEST)} records no options, which an append takes")
    for flag, why in _REFUSED.items():
        if flag in given:
            raise OptionsError(f"--append does not take --{flag}: {why}")
    # What the manifest's dataset keys say, checked as every reader checks them; the rest from its options.
    recorded = {**options, "file_format": info.file_format, "compression": info.compression.lower(),
                "label_offset": info.label_offset}
    taken: dict[str, Any] = {}
    for flag, fields in _TAKEN.items():
        theirs = tuple(recorded.get(name, getattr(config.spec, name, None)) if name in _SPEC_FIELDS
                       else recorded.get(name, getattr(config, name)) for name in fields)
        if flag in given:
            mine = tuple(getattr(config.spec if name in _SPEC_FIELDS else config, name) for name in fields)
            if mine != theirs:
                raise OptionsError(f"--{flag} {_shown(mine)} contradicts the dataset in {config.output}, made "
                                   f"with {_shown(theirs)}: drop it (an append takes the dataset's options)")
        taken.update(zip(fields, theirs))
    try:
        if taken["compression"] not in COMPRESSIONS:
            raise OptionsError(f"compression {taken['compression']!r} is not one beam-prep writes")
        check_values({key: taken[key] for key in ("labels_txt", "validation_percent", "near_duplicate_distance")})
        cap = taken["max_per_class"]
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            raise ValueError(f"max_per_class {cap!r}")
        spec = dataclasses.replace(config.spec, **{k: v for k, v in taken.items() if k in _SPEC_FIELDS},
                                   perceptual_hash=taken["near_duplicate_distance"] >= 0)
        spec.info  # noqa: B018 - its checks
    except (OptionsError, TypeError, ValueError) as e:
        raise OptionsError(f"{join(config.output, MANIFEST)} records options an append cannot take ({e}): "
                           "the manifest was edited, or is damaged") from e
    return dataclasses.replace(config, spec=spec, version=info.version + 1,
                               **{k: v for k, v in taken.items() if k not in _SPEC_FIELDS})


def check_new_names(output: str, info: DatasetInfo, splits: Iterable[str], version: int) -> None:
    """An append's shards are named as no file of the dataset is (``layout.shard_prefix``'s ``-v<version>``),
    unless a split of the dataset is named as another's version (``train-v2``): refused, not written over.

    Raises:
      OptionsError: naming the file.
    """
    taken = [name for split in info.splits.values() for name in (*split.shards, *(split.dali_index or ()))]
    for split in splits:
        prefix = layout.shard_prefix(split, version)
        ours = re.compile(rf"({re.escape(index_name(prefix)[:-len(DALI_SUFFIX)])}|{re.escape(prefix)})"
                          r"-\d+-of-\d+", re.IGNORECASE)
        clash = next((name for name in taken if ours.match(name)), None)
        if clash is not None:
            raise OptionsError(f"{output} holds {clash}, named as this append's shards of split {split!r} are: "
                               f"a split named as another's version {version}; prepare the new images into "
                               "another folder")


def check_version(output: str, version: int) -> None:
    """That the dataset in ``output`` is still the one an append planned to add version ``version`` to.

    Raises:
      DatasetError: another run added a version since (its records would be named twice): run again.
    """
    info, _ = read_dataset(output)
    if info.version != version - 1:
        raise DatasetError(f"{output} became version {info.version} while this append made version {version} "
                           "(another run appended to it): no manifest written; run it again")


def _shown(values: tuple[Any, ...]) -> str:
    if len(values) == 2 and all(isinstance(v, int) for v in values):
        return f"{values[0]}x{values[1]}"
    return " ".join("none" if v is None else str(v) for v in values)


def read_existing(output: str, folder: SpillFolder, under: str | None = None) -> Existing:
    """The records of the dataset in ``output``, as an append compares a listing with them (``existing``):
    read from its kept hash files, each version's that keeps none made in ``folder`` from its shards first;
    ``under``: the append's input, below which alone its records are compared by path (None: all).

    Raises:
      OptionsError, DatasetError: as ``read_dataset``; DatasetError, StorageError: a kept file or a
        shard cannot be read.
    """
    info, manifest = read_dataset(output)
    return _read(output, folder, info, manifest, under)


# --- what a listing adds -----------------------------------------------------


@dataclasses.dataclass
class Additions:
    """What an append's listing adds to the dataset and what it leaves out (``REPORT``'s content).

    Attributes:
      new_labels: the labels the dataset gains, in the order of their names (their ids: the next ones).
      unchanged: files at a path the dataset holds, with the same bytes: its own records.
      failed_before: files that became no record in an earlier version (errors.jsonl): not tried again.
      skipped_before: files passed over in an earlier version (skipped.jsonl: not an image, a copy...): not
        named there again.
      copies: files at a new path whose bytes the dataset holds: not written; skipped.jsonl and changed.jsonl
        (``{"path", "sha256", "split", "of", "of_split"}``: ``of`` the record's source, in ``of_split``;
        ``split`` the one the file would have gone to).
      changed: files at a path the dataset holds whose bytes changed: not written (an append never rewrites
        a record); changed.jsonl (``{"path", "sha256", "now"}``).
      gone: sources of records made from the run's input that the listing lacks: their records stay;
        changed.jsonl (``{"path", "sha256"}``).
      rows: the changed.jsonl rows this plan holds itself, each with its ``change`` (``changed``, ``copy``
        or ``gone``): the copies ``WriteImageDataset``'s publication sets apart, and every row of a plan an
        earlier beam-prep made. Those ``narrow`` finds are in the run's folder instead (``layout.CHANGES``,
        ``found_lines``), sorted on disk: an input of millions lost, rewritten or copied would put
        millions here.
    """

    new_labels: list[str] = dataclasses.field(default_factory=list)
    unchanged: int = 0
    failed_before: int = 0
    skipped_before: int = 0
    copies: int = 0
    changed: int = 0
    gone: int = 0
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Additions:
        body = dict(body)
        rows = list(body.pop("rows", ()))
        for key, change in (("changed", "changed"), ("copies", "copy"), ("gone", "gone")):
            if isinstance(body.get(key), list):  # an earlier beam-prep's plan, its rows in it
                rows += [{**row, "change": change} for row in body[key]]
                body[key] = len(body[key])
        return cls(**body, rows=rows)

    def add_copies(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Counts ``rows`` (``copies``'s) as copies, held in this plan."""
        added = [{**row, "change": "copy"} for row in rows]
        self.rows += added
        self.copies += len(added)

    def counts(self) -> dict[str, Any]:
        """The manifest's word on it (``versions[].appended``)."""
        return {"new_labels": list(self.new_labels), "unchanged": self.unchanged,
                "failed_before": self.failed_before, "skipped_before": self.skipped_before,
                "copies": self.copies, "changed": self.changed, "gone": self.gone}

    def changed_lines(self, found: Iterable[str] = ()) -> Iterator[str]:
        """changed.jsonl: a line a changed file, then one a copy, then one a source gone, each sorted by path:
        this plan's ``rows`` and ``found`` (the run folder's ``found_lines``, in that order already)."""
        found = iter(found)
        line = next(found, None)

        def of_kind(prefix: str) -> Iterator[str]:
            nonlocal line
            while line is not None and line.startswith(prefix):
                yield line
                line = next(found, None)

        for change in _CHANGES:
            mine = sorted((row for row in self.rows if row["change"] == change), key=lambda row: row["path"])
            theirs = of_kind(_change_prefix(change))
            if mine:
                yield from heapq.merge((_line(row) for row in mine), theirs, key=lambda text: json.loads(text)["path"])
            else:
                yield from theirs
        if line is not None:
            raise DatasetError(f"an append's run folder holds a line that is no change: {line[:200]!r}")


_CHANGES = ("changed", "copy", "gone")  # changed.jsonl's kinds of line, in its order


def _line(row: Mapping[str, Any]) -> str:
    """A changed.jsonl line: the row's keys sorted, ``change`` first of them."""
    return json.dumps(row, ensure_ascii=False, sort_keys=True)


def _change_prefix(change: str) -> str:
    return f'{{"change": {json.dumps(change)},'


def found_lines(work: str) -> Iterator[str]:
    """The changed.jsonl lines an append's ``narrow`` found, from its run's folder ``work`` (none where a
    run of an earlier beam-prep left no such file: its plan holds them).

    Raises:
      StorageError: the file is there but cannot be read.
    """
    from apache_beam.io.filesystems import FileSystems  # here: the launcher imports this module before Beam

    path = join(work, layout.CHANGES)
    if not FileSystems.exists(path):
        return
    with open_to_read(path) as f, io.TextIOWrapper(f, encoding="utf-8") as text:
        for line in text:
            yield line.rstrip("\n")


def describe(written: int, counts: Mapping[str, Any], reports: bool = True) -> str:
    """What an append added and left out (``Additions.counts``), in a line; with ``reports``, where to look."""
    parts = [f"{wording.count(written, 'record')} added"]
    if counts.get("new_labels"):
        parts.append(f"new classes {', '.join(map(repr, counts['new_labels']))} (ids after the others)")
    if counts.get("unchanged"):
        parts.append(f"{wording.count(counts['unchanged'], 'file')} already in it")
    if counts.get("failed_before"):
        parts.append(f"{wording.count(counts['failed_before'], 'file')} that failed before, not tried again"
                     + (" (errors.jsonl)" if reports else ""))
    if counts.get("skipped_before"):
        parts.append(f"{wording.count(counts['skipped_before'], 'file')} skipped before, not named again"
                     + (" (skipped.jsonl)" if reports else ""))
    for key, what in (("copies", "copies of records already in it, not written"),
                      ("changed", "files changed since their records were made, not written"),
                      ("gone", "sources gone, their records kept")):
        if counts.get(key):
            parts.append(f"{counts[key]:,} {what}" + (" (changed.jsonl)" if reports else ""))
    return "; ".join(parts)


def narrow(config: PrepareConfig, listing: Listing, existing: Existing) -> tuple[Listing, Additions]:
    """The part of ``listing`` an append writes, labelled with the dataset's ids (new labels after
    them), and what it left out.

    A path the dataset holds is a record of it, or changed; a new path's bytes (hashed: read, not
    decoded) that the dataset holds are a copy. A file at a path the dataset holds is read only where
    its size or stamp differ from those its record kept, or where none were kept (``Record.same_source``;
    ``--append_check content``: every one is read): as rsync, a file rewritten with its size and a
    restored modification time is taken as unchanged. A copy is added to the listing's skipped files; a
    file the dataset's errors.jsonl or skipped.jsonl names already is counted, and left out of them. The dataset's
    ``--stratify`` and ``--max_per_class`` then choose among the new files alone: each label's
    validation share is of its new files, and its cap counts the records it holds already (a label
    of 8 records capped at 10 takes 2 new files at most; the others are skipped as over the cap). The
    narrowed listing carries the kept hash files ``existing`` made (``Listing.carried``) to the run's folder.

    Raises:
      OptionsError: the listing's records are not of the dataset's kind (multi-label, extra features).
      StorageError: a file cannot be read.
    """
    info = existing.info
    if listing.multi_label != info.multi_label or dict(listing.extra_features) != dict(info.extra_features):
        raise OptionsError(f"--input {config.input} lists records of another kind than the dataset in "
                           f"{config.output} (multi-label, or --metadata columns): an append adds records alike")
    additions = Additions(skipped_before=listing.leave_out_skips(existing.skipped))
    new: list[tuple[int, ListedRow, str, str]] = []  # each file at a path the dataset lacks: its place, row, path shown, sha256
    changed = SortedRows(listing.folder, "changed")  # (path, changed.jsonl line), sorted on disk
    copies = SortedRows(listing.folder, "copies")
    gone = SortedRows(listing.folder, "gone")
    keep: list[ListedRow] = []
    new_labels: set[str] = set()
    by_content = config.append_check == "content"
    failed, skipped = existing.failed, existing.skipped
    root = listing.root

    def lost(path: str, record: Record) -> None:
        gone.append((path, _line({"change": "gone", "path": path, "sha256": record.sha256})))

    def settle(looked: list[tuple[int, ListedRow, str, str, Record | None]], read: Callable[[], dict[str, str]]
               ) -> None:
        sums = read()
        for place, row, path, shown, before in looked:
            if shown in failed:  # errors.jsonl names files as messages show them
                additions.failed_before += 1
            elif before is not None:
                sha256 = sums.get(path)
                if sha256 is None or before.sha256 == sha256:  # not read: its size and stamp are its record's
                    additions.unchanged += 1
                else:
                    additions.changed += 1
                    changed.append((shown, _line({"change": "changed", "path": shown, "sha256": before.sha256,
                                                  "now": sha256})))
            elif shown in skipped:  # a copy, or a record --cross_split_duplicates dropped
                additions.skipped_before += 1
            else:
                new.append((place, row, shown, sums[path]))

    with concurrent.futures.ThreadPoolExecutor(_THREADS, thread_name_prefix="hash") as pool, _collection_paused():
        reading = None  # the last chunk's rows, its files read on the pool while the next chunk is looked up
        # A file whose size and stamp are its record's is counted unchanged, not read (but where a file failed
        # before: errors.jsonl is looked up first).
        for unchanged, chunk in existing.compare(listing.rows(), lost, listing.folder, not failed and not by_content):
            additions.unchanged += unchanged
            looked: list[tuple[int, ListedRow, str, str, Record | None]] = []
            for place, row, before in chunk:
                path = f"{root}/{row[1]}"
                looked.append((place, row, path, printable(path), before))
            read = _reading(pool, [(path, row[4]) for _, row, path, shown, before in looked
                                   if _must_read(row, shown, before, existing, by_content)])
            if reading is not None:
                settle(*reading)
            reading = looked, read
        if reading is not None:
            settle(*reading)
    new.sort(key=lambda found: found[0])  # the listing's order: the shards' deal
    records = existing.first_with({sha256 for _, _, _, sha256 in new})  # one pass over the dataset's kept lines
    for _, row, shown, sha256 in new:
        if (copy := records.get(sha256)) is not None:
            additions.copies += 1
            copies.append((shown, _line({"change": "copy", "path": shown, "sha256": sha256, "split": row[2],
                                         "of": copy[1], "of_split": copy[0]})))
            listing.add_skip(row[1], COPY_REASON)
        else:
            keep.append(row)
            _, _, _, label, _, labels, _, _ = row
            new_labels.update(name for name in (labels if labels is not None else (label,)) if name not in info.labels)
    found = listing.folder.file(layout.CHANGES)  # changed.jsonl's lines, on disk: as many as the dataset's records
    with open(found, "w", encoding="utf-8") as f:
        for rows in (changed, copies, gone):
            for _, line in rows:
                f.write(line + "\n")
    additions.gone = gone.count
    additions.new_labels = sorted(new_labels & set(listing.labels))  # a table's row without a label: none
    labels = [*info.labels, *additions.new_labels]
    choice = Choice(config.validation_percent, config.stratify, config.max_per_class,
                    held(info) if config.max_per_class is not None else {})
    narrowed = listing.narrowed(keep, labels, config.label_offset, choice)
    narrowed.carried.update(existing.generated)
    narrowed.carried[layout.CHANGES] = found
    return narrowed, additions


def held(info: DatasetInfo) -> dict[str, int]:
    """The records each label of the dataset holds, over its splits (a multi-label record under each label).

    Raises:
      OptionsError: the manifest does not count a split's records per label (nothing to cap by).
    """
    counts: collections.Counter[str] = collections.Counter()
    for split in info.splits.values():
        if split.class_counts is None:
            raise OptionsError(f"{join(info.root, MANIFEST)} does not count split {split.name!r}'s records per "
                               "label, which --max_per_class counts: the manifest was edited, or is damaged")
        counts.update(split.class_counts)
    return dict(counts)


@contextlib.contextmanager
def _collection_paused() -> Iterator[None]:
    """The garbage collector off while the listing is compared with the dataset: the comparison makes a few
    objects a record and frees them as it goes (no cycles), but the collections their number sets off would
    each walk every object alive, the listing's chunk and the kept files' included, many times over."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _must_read(row: ListedRow, shown: str, before: Record | None, existing: Existing, by_content: bool) -> bool:
    """Whether ``narrow`` needs the sha256 of ``row``'s file (``shown``: ``printable``): not for a file that
    failed or was skipped before (its bytes decide nothing), nor, but ``by_content``, for one whose size
    and stamp are its record's."""
    if shown in existing.failed:
        return False
    if before is not None:
        return by_content or not before.same_source(row[4], row[7])
    return shown not in existing.skipped


def _sha256s(pool: concurrent.futures.Executor, paths: list[str]) -> dict[str, str]:
    """Each file's sha256 (hex), read on ``pool``'s threads.

    Raises:
      StorageError: a file cannot be read, naming it.
    """
    return dict(zip(paths, pool.map(_digest, paths)))


def _reading(pool: concurrent.futures.Executor, files: list[tuple[str, int]]) -> Callable[[], dict[str, str]]:
    """Each file's sha256 (hex) (``files``: path and listed size): the call returned gives them once read, or
    raises ``StorageError`` naming a file that cannot be read. Read on ``pool``'s threads from now; but a few
    small local files (``_INLINE``), read by that call: handing a file to a thread and back costs more than
    reading a cached one, and the threads would wait on the comparison that holds the interpreter meanwhile."""
    paths = [path for path, _ in files]
    if len(files) <= _INLINE[0] and sum(size for _, size in files) <= _INLINE[1] and all(map(is_local, paths)):
        return lambda: {path: _digest(path) for path in paths}
    digests = pool.map(_digest, paths)
    return lambda: dict(zip(paths, digests))


def _digest(path: str) -> str:
    h = hashlib.sha256()
    try:
        # A local file with plain ``open``: Beam's dispatch holds the GIL far longer than the read, and these
        # threads run beside the comparison, which holds it between their turns.
        with (open(path, "rb", buffering=0) if is_local(path) else open_to_read(path)) as f:
            for block in iter(lambda: f.read(_READ), b""):
                h.update(block)
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("read", path, e) from e
    return h.hexdigest()
