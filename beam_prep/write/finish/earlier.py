"""The kept hash files a run publishes, and an append's duplicate search against the whole dataset.

Every run publishes its version's kept hash file (``kept_hashes``), made from its workers' hash
lines, less the records ``--cross_split_duplicates drop`` left out. An append searches its new
records' duplicates among the dataset's too: each earlier version's kept file (the dataset's, or
the one the append made from the shards of a dataset that kept none: in the run's folder, and
published with it) is written out as hash lines, full paths under its version's input, and
``duplicates.find`` reports the groups that hold a new record (docs/design/duplicates.md).
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from apache_beam.io.filesystems import FileSystems

from beam_prep.errors import DatasetError
from beam_prep.io.storage import join, open_to_read, storage_error
from beam_prep.model.dataset import DatasetInfo
from beam_prep.write.finish import drop, duplicates, near_earlier
from beam_prep.write.shared import hash_lines, kept_hashes
from beam_prep.write.shared.kept_hashes import KeptFile
from beam_prep.write.shared.spill import SpillFolder

__all__ = ["Earlier", "find", "kept_file"]


@dataclasses.dataclass
class Earlier:
    """An append's earlier versions' kept hash files.

    Attributes:
      entries: each version's manifest entry, oldest first.
      from_run: the names of those the append made (the run's folder holds them): published with it.
      copies: the run's records with the bytes of an earlier version's record, where ``find`` was asked
        to set them apart (``near_earlier.split_off``).
    """

    entries: list[KeptFile]
    from_run: list[str]
    copies: list[near_earlier.Copy] = dataclasses.field(default_factory=list)


def find(output: str, work: str, manifest: Mapping[str, Any], hash_files: Iterable[str], listed: int, distance: int | None,
         pairs: list[tuple[int, int]] | None, version: int | None,
         set_apart: bool = False) -> tuple[duplicates.Duplicates, Earlier]:
    """``duplicates.find`` over the run's ``hash_files`` (``listed``: the most lines they hold); for an
    append (``version``, ``manifest`` the dataset's), over the dataset's records too, the groups
    holding a new one reported: over the new records and those of the dataset's that copy, or are
    near, one of them (``near_earlier``), all a group holding a new record can hold. ``pairs``: the
    pipeline's near pairs, of the run's records alone: an append searches here. ``set_apart``: the
    run's records with the bytes of an earlier version's record (``WriteImageDataset``'s: the command
    writes none) are set apart first (``Earlier.copies``), and the search is over the others.

    Raises:
      DatasetError: an earlier version's kept file is in neither the dataset nor the run's folder,
        or damaged. StorageError: a file cannot be read.
    """
    run_files = sorted(hash_files)
    if version is None:
        return duplicates.find(run_files, listed, distance, pairs), Earlier([], [])
    earlier, folder = _earlier_files(output, work, manifest)
    try:
        kept = [(source, root, e["version"]) for e, (source, root) in zip(earlier.entries,
                                                                          _sources(output, work, manifest, earlier))]
        if set_apart:
            run_files, earlier.copies = near_earlier.split_off(kept, run_files, folder)
        chosen = near_earlier.matching(kept, duplicates.read_chunks(run_files), distance, folder)
        found = duplicates.find([*(path for path, _, _ in chosen), *run_files], listed + sum(n for *_, n in chosen),
                                distance, None, {path: v for path, v, _ in chosen}, version)
    finally:
        folder.close()
    return found, earlier


def _earlier_files(output: str, work: str, manifest: Mapping[str, Any]) -> tuple[Earlier, SpillFolder]:
    kept = kept_hashes.listed(manifest)
    entries, from_run = [], []
    for v in DatasetInfo.from_json(manifest, output, "manifest.json").history:
        if v.version in kept:
            entries.append(kept[v.version])
            continue
        name = kept_hashes.kept_name(v.version)
        path = join(work, name)
        if not FileSystems.exists(path):
            raise DatasetError(f"{output} keeps no hash lines of version {v.version} ({name}), and run folder "
                               f"{work} holds none: remove that folder to start the append over (an append takes no --overwrite)")
        entries.append(KeptFile.of(v.version, *_count_and_digest(path)))
        from_run.append(name)
    return Earlier(entries, from_run), SpillFolder(prefix="beam-prep-earlier-")


def _sources(output: str, work: str, manifest: Mapping[str, Any], earlier: Earlier) -> Iterator[tuple[str, str | None]]:
    """Each earlier kept file's path and its version's input."""
    roots = {v.version: v.input for v in DatasetInfo.from_json(manifest, output, "manifest.json").history}
    for entry in earlier.entries:
        folder = work if entry["file"] in earlier.from_run else output
        yield join(folder, entry["file"]), roots.get(entry["version"])


def _count_and_digest(path: str) -> tuple[int, str]:
    """A kept file's lines and sha256."""
    digest = hashlib.sha256()
    try:
        with open_to_read(path) as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("read", path, e) from e
    return sum(len(lines) for lines in kept_hashes.read_lines(path)), digest.hexdigest()


def kept_file(hash_files: Iterable[str], root: str | None, target: str, version: int,
              dropping: drop.Dropping | None) -> KeptFile:
    """Writes the run's version's kept hash file at ``target`` from its workers' hash files, the records
    ``dropping`` left out left out.

    Raises:
      DatasetError: a line is not a hash line. StorageError: a file cannot be read or written.
    """
    def rows() -> Iterator[tuple[bytes, bytes]]:
        for path, lines in duplicates.read_chunks(sorted(hash_files)):
            for line in lines:
                parsed = hash_lines.parse(path, line)
                if dropping is None or not dropping.holds(parsed.split.decode(), parsed.sha256.decode()):
                    yield kept_hashes.relative_to(root, line)

    return kept_hashes.write_sorted(rows(), target, version)

