"""The records a dataset holds, as an append looks them up: an index on disk, not dicts in memory.

An append compares each listed file with every record of the dataset (by path and by sha256), and
a dataset may hold millions: the records go into an SQLite table in the listing's temporary folder,
so the launcher holds a page cache, not a Python object a record. They are read from the dataset's
kept hash files (``kept_hashes``): no shard is read, no image decoded. A dataset made before it kept
them is read from its shards once, each record's stored image decoded for its perceptual hash, and
the files that reading makes (``generated``) go to the run's folder, to be published with the
append: the next append reads them. Each record's source size and stamp, where its version kept
them (``plan.listing.stamps``), come with it (``Record``): what tells an append a file unchanged unread.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import io
import itertools
import json
import logging
import sqlite3
from collections.abc import Collection, Iterator, Sequence
from typing import Any, NamedTuple

from PIL import Image

from beam_prep.errors import DatasetError, StorageError
from beam_prep.io.storage import join, read_bytes
from beam_prep.model.dataset import DatasetInfo
from beam_prep.write.images.imaging import is_flat
from beam_prep.write.images.phash import phash
from beam_prep.write.plan.listing import stamps
from beam_prep.write.shared import hash_lines, kept_hashes
from beam_prep.write.shared.entry import printable, unquoted
from beam_prep.write.shared.layout import ERRORS, SKIPPED
from beam_prep.write.shared.shard_formats import ShardFormat, StoredImage, shard_format
from beam_prep.write.shared.spill import SpillFolder

__all__ = ["Existing", "Record", "read_existing", "stored_phash", "write_unkept"]

_LOG = logging.getLogger(__name__)

_THREADS = 16  # shards read at once, where the dataset keeps no hash lines
_BATCH = 4096  # rows inserted, or looked up, at a time
_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
_SHA256_HEX = 64  # a kept line starts with its source's sha256, in hex


class Record(NamedTuple):
    """A record of the dataset, as an append compares a listed file with it.

    Attributes:
      sha256: its source's sha256 (hex).
      split: its split.
      size: its source's size when it was listed; None: its version kept no stamps.
      stamp: its source's stamp then (``plan.walk.Stamp``); None: none kept.
    """

    sha256: str
    split: str
    size: int | None
    stamp: str | None

    def same_source(self, size: int, stamp: str | None) -> bool:
        """Whether a file of ``size`` and ``stamp`` is the one the record was made from, as rsync tells (its
        size and stamp unchanged), without reading it."""
        return stamp is not None and self.stamp == stamp and self.size == size


@dataclasses.dataclass
class Existing:
    """The records a dataset holds (``read_existing``), by full source path (under its version's input),
    as messages and the kept files show it (``printable``: a name that is not UTF-8 escaped).

    Attributes:
      info: the dataset.
      manifest: its whole manifest.
      failed: the files that became no record (errors.jsonl), which an append does not try again.
      skipped: the files passed over (skipped.jsonl), which it does not report again.
      generated: kept hash file name -> local file, for each version whose records were read from its
        shards (a dataset made before it kept them): the run's folder gets them, and the append publishes them.
      records: the records indexed by path (``read_existing``'s ``under``).
    """

    info: DatasetInfo
    manifest: dict[str, Any]
    failed: frozenset[str]
    skipped: frozenset[str]
    generated: dict[str, str]
    records: int
    _db: sqlite3.Connection
    # Each version's kept hash file, its input ("": none) and the sha256 the manifest lists (None: one made
    # from its shards for this append), oldest first.
    _kept: list[tuple[str, str, str | None]]

    def latest(self, keys: Sequence[str]) -> list[Record | None]:
        """The latest record made from each of ``keys`` (full paths as messages show them: ``printable``;
        None: none), with its source's size and stamp where its version kept them, looked up together: a
        query for all, not one each. The paths count as listed by the append (``gone``: the others)."""
        self._db.execute("BEGIN")  # one transaction, not one a row
        self._db.execute("DELETE FROM chunk")
        self._db.executemany("INSERT OR IGNORE INTO chunk VALUES (?)", ((k,) for k in keys))
        self._db.execute("INSERT OR IGNORE INTO listed SELECT path FROM chunk")
        self._db.execute("COMMIT")
        found = {path: Record(sha256, split, size, stamp) for path, sha256, split, size, stamp in self._db.execute(
            "SELECT c.path, l.sha256, l.split, l.size, l.stamp FROM chunk c JOIN latest l ON l.path = c.path")}
        return [found.get(k) for k in keys]

    def first_with(self, sha256s: Collection[str]) -> dict[str, tuple[str, str]]:
        """``sha256 -> (split, path)`` of the first record (oldest version first, then by path) with the bytes
        of each of ``sha256s`` the dataset holds: one pass over its kept hash lines, none parsed but those.

        Every kept file is read to its end and its bytes checked against the manifest's sha256, whatever is
        found first: one gone, cut short or altered (a version's whose records ``read_existing`` did not
        index, its input elsewhere, as much as one's it did) is refused, rather than an append finding
        nothing to add.

        Raises:
          StorageError: a kept file cannot be read, or is not gzip (cut short included); DatasetError: its
            bytes are not those the manifest lists, or a line it names a record by is not a hash line.
        """
        wanted = {sha256.encode() for sha256 in sha256s}
        found: dict[str, tuple[str, str]] = {}
        for file, root, expected in self._kept:
            digest = hashlib.sha256()
            for lines in kept_hashes.read_lines(file, digest):
                if not wanted:
                    continue
                for line in lines:
                    if line[:_SHA256_HEX] in wanted:
                        wanted.discard(line[:_SHA256_HEX])
                        path, sha256, split = _row(file, line, root)
                        found[sha256] = (split, path)
            if expected is not None and digest.hexdigest() != expected:
                raise DatasetError(f"{file} is not the kept hash file the manifest lists (its sha256 is "
                                   f"{digest.hexdigest()}, not {expected}): run verify on the dataset")
        return found

    def gone(self, prefix: str) -> Iterator[tuple[str, str]]:
        """``(path, sha256)`` of each record's source under ``prefix`` that no ``latest`` looked up, by path."""
        prefix = printable(prefix)
        yield from self._db.execute(
            "SELECT path, sha256 FROM latest WHERE substr(path, 1, ?) = ? AND path NOT IN (SELECT path FROM listed) "
            "ORDER BY path", (len(prefix), prefix))

    def close(self) -> None:
        self._db.close()


def read_existing(output: str, folder: SpillFolder, info: DatasetInfo, manifest: dict[str, Any],
                  under: str | None = None) -> Existing:
    """Indexes the records of the dataset in ``output`` (``info``, ``manifest``) in ``folder``: from its
    kept hash files, or, for the versions that have none, from their shards (``generated``).

    Args:
      under: the append's input: only the records whose source lies below it are indexed by path (no
        other is ever looked up by one, nor gone); None: every record.

    Raises:
      DatasetError: a kept file or a shard is damaged; StorageError: one cannot be read.
    """
    kept = kept_hashes.listed(manifest)
    prefix = None if under is None else printable(under.rstrip("/")) + "/"
    db = sqlite3.connect(folder.file("existing.sqlite"), isolation_level=None, check_same_thread=False)
    for pragma in ("journal_mode = OFF", "synchronous = OFF", "cache_size = -8192", "temp_store = FILE"):
        db.execute(f"PRAGMA {pragma}")
    # Each path's latest record: a version's rows replace an older version's at the same path.
    db.execute("CREATE TABLE latest (path TEXT PRIMARY KEY, sha256 TEXT, split TEXT, version INTEGER, size INTEGER, "
               "stamp TEXT) WITHOUT ROWID")
    db.execute("CREATE TABLE listed (path TEXT PRIMARY KEY) WITHOUT ROWID")  # every path ``latest`` looked up
    db.execute("CREATE TABLE chunk (path TEXT PRIMARY KEY) WITHOUT ROWID")  # the paths it looks up at once
    stamped = stamps.listed(manifest)
    generated: dict[str, str] = {}
    files: list[tuple[str, str, str | None]] = []
    count = 0
    try:
        db.execute("BEGIN")
        for version in info.history:
            root = version.input or ""
            name = kept_hashes.kept_name(version.version)
            if version.version in kept:
                path, expected = join(output, name), kept[version.version]["sha256"]
            else:
                path = generated[name] = folder.file(name)
                expected = None
                _write_from_shards(output, info, version, path)
            files.append((path, root, expected))
            if prefix is not None and root and not _overlap(printable(root.rstrip("/")) + "/", prefix):
                continue  # no source of this version lies below the input
            lines = (line for chunk in kept_hashes.read_lines(path) for line in chunk)
            while batch := list(itertools.islice(lines, _BATCH)):
                rows = [(*_row(path, line, root), version.version) for line in batch]
                if prefix is not None:
                    rows = [row for row in rows if row[0].startswith(prefix)]
                db.executemany("INSERT OR REPLACE INTO latest VALUES (?, ?, ?, ?, NULL, NULL)", rows)
                count += len(rows)
            if version.version in stamped:
                _add_stamps(db, output, stamped[version.version], version.input)
        db.execute("COMMIT")
    except BaseException:
        db.close()
        raise
    return Existing(info, manifest, _named(output, ERRORS), _named(output, SKIPPED), generated, count, db, files)


def _overlap(one: str, other: str) -> bool:
    """Whether two folders (``/``-ended) hold files in common: one is the other, or below it."""
    return one.startswith(other) or other.startswith(one)


def write_unkept(output: str, info: DatasetInfo, manifest: dict[str, Any], folder: str) -> list[str]:
    """Writes in ``folder`` (a run's folder, local or gs://) the kept hash file of each version of the
    dataset in ``output`` that keeps none, read from its shards: what the append's publication reads
    and publishes, where no listing was compared with the dataset (``WriteImageDataset``).

    Returns:
      The names written, oldest version first.

    Raises:
      DatasetError: a shard is damaged; StorageError: one cannot be read, or a file written.
    """
    kept = kept_hashes.listed(manifest)
    written = []
    for version in info.history:
        if version.version not in kept:
            name = kept_hashes.kept_name(version.version)
            _write_from_shards(output, info, version, join(folder, name))
            written.append(name)
    return written


def _write_from_shards(output: str, info: DatasetInfo, version: Any, target: str) -> None:
    """``version``'s kept hash file at ``target``, read from its shards."""
    kept_hashes.write_sorted(_from_shards(output, info, version.added), target, version.version)


def _add_stamps(db: sqlite3.Connection, output: str, entry: dict[str, Any], root: str | None) -> None:
    """A version's kept stamp file onto its records in ``latest`` (those a later version's replaced keep
    none); where it cannot be read, or is not what the manifest lists, none of it (that version's files are
    hashed), with a warning."""
    version = entry["version"]
    lines = stamps.read(output, entry, root)
    try:
        while batch := list(itertools.islice(lines, _BATCH)):
            db.executemany("UPDATE latest SET size = ?, stamp = ? WHERE path = ? AND version = ?",
                           [(size, stamp, path, version) for path, size, stamp in batch])
    except (ValueError, StorageError) as e:
        db.execute("UPDATE latest SET size = NULL, stamp = NULL WHERE version = ?", (version,))
        _LOG.warning("%s left out (%s): the files of version %d are read again to tell them unchanged",
                     join(output, entry["file"]), e, version)


def _row(file: str, line: bytes, root: str) -> tuple[str, str, str]:
    """A kept line as ``(full path, sha256, split)``."""
    parsed = hash_lines.parse(file, line)
    name = unquoted(parsed.path)
    return (f"{printable(root)}/{name}" if root else name), parsed.sha256.decode(), parsed.split.decode()


def _from_shards(output: str, info: DatasetInfo, added: Any) -> Iterator[tuple[bytes, bytes]]:
    """A version's kept rows (``kept_hashes.write_sorted``) read from its shards: each record's sha256
    and file name from its source field, its perceptual hash from its stored image (none for one of a
    flat colour, as the workers write it), ``_THREADS`` shards at once."""
    fmt = shard_format(info.file_format)
    compression = info.compression.lower()
    jobs = [(split, shard) for split, (shards, _, _) in added.items() for shard in shards]

    def rows(job: tuple[str, str]) -> list[tuple[bytes, bytes]]:
        split, shard = job
        found = []
        for payload in fmt.read(join(output, shard), compression):
            sha256, name = fmt.source(payload)
            picture = stored_phash(fmt, payload, join(output, shard))
            found.append(kept_hashes.relative_to(None, hash_lines.hash_line(sha256, split, name, picture).encode()))
        return found

    with concurrent.futures.ThreadPoolExecutor(_THREADS, thread_name_prefix="existing") as pool:
        for start in range(0, len(jobs), _THREADS):
            for found in pool.map(rows, jobs[start:start + _THREADS]):
                yield from found


def stored_phash(fmt: ShardFormat, payload: bytes, shard: str) -> int | None:
    """The perceptual hash of a record's stored image (None: one flat colour, as the workers leave it out).

    Raises:
      DatasetError: the image cannot be decoded, naming the shard.
    """
    stored: StoredImage = fmt.stored_image(payload)
    try:
        if stored.image_format == "raw":
            image = Image.frombytes(_MODES[stored.channels], (stored.width, stored.height), stored.data)
        else:
            image = Image.open(io.BytesIO(stored.data))
            image.load()
    except (OSError, ValueError, KeyError) as e:
        raise DatasetError(f"{shard} holds a record whose image cannot be decoded ({e}): run verify on the dataset") from e
    return None if is_flat(image) else phash(image)


def _named(output: str, report: str) -> frozenset[str]:
    """The paths a report of the dataset names (errors.jsonl, skipped.jsonl; none where the dataset has
    no such report, or an unreadable one), as messages show them (``entry.printable``)."""
    path = join(output, report)
    try:
        lines = read_bytes(path).decode("utf-8").splitlines()
    except Exception:  # noqa: BLE001 - each filesystem raises its own types: no report, no failures to skip
        return frozenset()
    failed = set()
    for line in lines:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            failed.add(str(json.loads(line)["path"]))
    return frozenset(failed)
