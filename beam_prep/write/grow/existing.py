"""The records a dataset holds, as an append compares a listing with them: streamed, not held in memory.

An append compares each listed file with every record of the dataset (by path and by sha256), and
a dataset may hold millions: its kept hash files (``kept_hashes``) and stamp files are sorted by path,
so the records below the append's input are read in path order a chunk at a time, each chunk's
looked up in memory, and merged with the listing sorted alike where they are many (``Existing.compare``):
the launcher holds a chunk of records, not a Python object each, and no index is built. No shard is read, no image decoded. A dataset made before it kept
them is read from its shards once, each record's stored image decoded for its perceptual hash, and
the files that reading makes (``generated``) go to the run's folder, to be published with the
append: the next append reads them. Each record's source size and stamp, where its version kept
them (``plan.listing.stamps``), come with it (``Record``): what tells an append a file unchanged unread.
"""
from __future__ import annotations

import bisect
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import heapq
import io
import itertools
import json
import logging
import operator
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

import numpy as np
from PIL import Image

from beam_prep.errors import DatasetError, StorageError
from beam_prep.io.storage import join, read_bytes
from beam_prep.model.dataset import DatasetInfo
from beam_prep.write.images.imaging import is_flat
from beam_prep.write.images.phash import phash
from beam_prep.write.plan.listing import stamps
from beam_prep.write.plan.selection import ListedRow
from beam_prep.write.shared import hash_lines, kept_hashes, sorted_sets
from beam_prep.write.shared.entry import printable, unquoted
from beam_prep.write.shared.layout import ERRORS, SKIPPED
from beam_prep.write.shared.shard_formats import ShardFormat, StoredImage, shard_format
from beam_prep.write.shared.spill import SortedRows, SpillFolder

__all__ = ["Existing", "Record", "read_existing", "stored_phash", "write_unkept"]

_LOG = logging.getLogger(__name__)

_THREADS = 16  # shards read at once, where the dataset keeps no hash lines
_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
_SHA256_HEX = 64  # a kept line starts with its source's sha256, in hex
_quoted = json.encoder.encode_basestring_ascii  # as json.dumps quotes a path: how the kept files sort


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


class _Records(Sequence[Record]):
    """A chunk's records, each made when asked for (``records[i]``): a chunk of an append's comparison is
    mostly of files unchanged by their size and stamp, whose records it never asks for.

    Attributes:
      stamps: each record's source's ``(size, stamp)``; ``(None, None)``: none kept.
    """

    __slots__ = ("_fields", "stamps")

    def __init__(self, fields: list[list[bytes]], stamps: list[tuple[int, str] | tuple[None, None]]) -> None:
        self._fields = fields  # each record's hash line, split: sha256, split, ...
        self.stamps = stamps

    @staticmethod
    def joined(chunks: Iterable[_Records]) -> _Records:
        """The records of ``chunks``, in turn, as one chunk."""
        chunks = list(chunks)
        return _Records([f for chunk in chunks for f in chunk._fields], [s for chunk in chunks for s in chunk.stamps])

    def __len__(self) -> int:
        return len(self._fields)

    def __getitem__(self, i: int) -> Record:  # type: ignore[override]  # no slices
        five = self._fields[i]
        return Record(five[0].decode("ascii", "replace"), five[1].decode("utf-8", "replace"), *self.stamps[i])

    def __iter__(self) -> Iterator[Record]:
        return map(self.__getitem__, range(len(self._fields)))

    def line(self, i: int) -> tuple[list[bytes], tuple[int, str] | tuple[None, None]]:
        """Record ``i``'s split hash line and stamp, as ``_Records`` takes them."""
        return self._fields[i], self.stamps[i]


@dataclasses.dataclass
class Existing:
    """The records a dataset holds (``read_existing``), each by its full source path (under its version's
    input) as messages and the kept files show it (``printable``: a name that is not UTF-8 escaped).

    Attributes:
      info: the dataset.
      manifest: its whole manifest.
      failed: the files that became no record (errors.jsonl), which an append does not try again.
      skipped: the files passed over (skipped.jsonl), which it does not report again.
      generated: kept hash file name -> local file, for each version whose records were read from its
        shards (a dataset made before it kept them): the run's folder gets them, and the append publishes them.
    """

    info: DatasetInfo
    manifest: dict[str, Any]
    failed: frozenset[str]
    skipped: frozenset[str]
    generated: dict[str, str]
    # The paths ``compare`` names the records by start so (``read_existing``'s ``under``, printable,
    # ``/``-ended; "": every record).
    _prefix: str
    # Each version's kept hash file, its input ("": none) and the sha256 the manifest lists (None: one made
    # from its shards for this append), oldest first.
    _kept: list[tuple[str, str, str | None]]
    # The versions whose records may lie below ``_prefix``, oldest first.
    _sources: list[_Source]
    # The kept files a comparison read whole, their bytes checked: their lines' sha256 prefixes, sorted (``_records``).
    _read: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    @property
    def records(self) -> int:
        """How many records lie below the input: their lines read anew."""
        return sum(len(keys) for keys, _ in self._latest())

    def _sorted_join(self, rows: Iterable[tuple[bytes, _T]], chunks: Iterator[tuple[list[bytes], _Records]],
                     gone: Callable[[str, Record], None], folder: SpillFolder | None
                     ) -> Iterator[list[tuple[_T, Record | None]]]:
        """Each of ``rows`` (``(key, item)``: ``_key``) with the latest record made from its path (None: none),
        ``_JOINED`` rows at a time, where the records below the input are many (``chunks``): the rows sorted by
        key (on disk in ``folder``, a temporary one where None, but for a few), and merged with them; each
        record no row names to ``gone`` (its full path, and it)."""
        rows = iter(rows)
        spill = SpillFolder(prefix="beam-prep-join-") if folder is None else folder
        try:
            by_key = SortedRows(spill, "join")  # in memory but for millions
            for n, (key, item) in enumerate(rows):
                by_key.append((key, n, item))
            joined = self._merged(((key, item) for key, _, item in by_key), chunks, gone)
            while block := list(itertools.islice(joined, _JOINED)):
                yield block
        finally:
            if folder is None:
                spill.close()

    def compare(self, rows: Iterable[ListedRow], gone: Callable[[str, Record], None], folder: SpillFolder | None = None,
                by_stamp: bool = True) -> Iterator[tuple[int, list[tuple[int, ListedRow, Record | None]]]]:
        """A listing's rows (``ListedRow``s, their paths under the input) against the records below the input, a
        block at a time as ``(counted, others)``: how many rows' files are the records made from their paths by
        size and stamp (``Record.same_source``), left out; and each other row with its place among ``rows`` and
        the latest record made from its path (None: none), with its source's size and stamp where its version
        kept them. ``by_stamp`` False: none counted, every row given. Each record no row names goes to ``gone``
        (its full path, and it).

        No index: the kept files' lines are read in path order a chunk at a time. Where the records are few
        (``_ONE_CHUNK``), in one chunk, a block of rows is compared a column at a time, in a few calls, in the
        rows' order (an append of the dataset's own input compares as many rows as the dataset holds); else
        the rows are sorted by key and merged with the chunks (``_sorted_join``).

        Raises:
          DatasetError: a kept file's line is not a hash line, or its lines are not sorted by path, or its
            bytes are not the manifest's; StorageError: one cannot be read.
        """
        rows = iter(rows)
        if not self._sources:  # no record below the input: nothing to look up
            place = 0
            while block := list(itertools.islice(rows, _JOINED)):
                yield 0, list(zip(range(place, place + len(block)), block, itertools.repeat(None)))
                place += len(block)
            return
        head, chunks = _head(self._latest())
        if head is None:  # many: by the merge, a row at a time
            keyed = ((_key(row[1]), (place, row)) for place, row in enumerate(rows))
            for joined in self._sorted_join(keyed, chunks, gone, folder):
                others = [(place, row, before) for (place, row), before in joined
                          if not (by_stamp and before is not None and before.same_source(row[4], row[7]))]
                yield len(joined) - len(others), others
            return
        keys, records = head
        at = dict(zip(keys, range(len(keys))))
        # Each record's kept (size, stamp) ((None, None): none kept, which no row's equals): a row's file is its
        # record's where its own are equal.
        stamped = dict(zip(keys, records.stamps)) if by_stamp else {}
        named: set[int | None] = set()
        place = 0
        while block := list(itertools.islice(rows, _JOINED)):
            block_keys = _keys([row[1] for row in block])
            found = list(map(at.get, block_keys))
            named.update(found)
            same = list(map(operator.eq, map(stamped.get, block_keys), zip(map(_SIZE, block), map(_STAMP, block))))
            others = [(place + i, block[i], None if found[i] is None else records[found[i]])
                      for i in itertools.compress(range(len(block)), map(operator.not_, same))]
            yield len(block) - len(others), others
            place += len(block)
        self._lost(keys, records, named, gone)

    def _merged(self, rows: Iterator[tuple[bytes, _T]], chunks: Iterator[tuple[list[bytes], _Records]],
                gone: Callable[[str, Record], None]) -> Iterator[tuple[_T, Record | None]]:
        """``_sorted_join`` of ``rows`` sorted by key with the chunks of records, in key order, a row at a time."""
        keys: list[bytes] = []
        records: _Records = _NO_CHUNK[1]
        at: dict[bytes, int] = {}
        named: set[int | None] = set()
        top = b""  # the chunk's last key
        for row_key, item in rows:
            while row_key > top:  # the chunk's records end before it: the next chunk
                self._lost(keys, records, named, gone)
                keys, records = next(chunks, _NO_CHUNK)
                at, named = dict(zip(keys, range(len(keys)))), set()
                top = keys[-1] if keys else _AFTER_ALL
            found = at.get(row_key)
            named.add(found)
            yield item, None if found is None else records[found]
        self._lost(keys, records, named, gone)
        for keys, records in chunks:
            self._lost(keys, records, set(), gone)

    def first_with(self, sha256s: Collection[str]) -> dict[str, tuple[str, str]]:
        """``sha256 -> (split, path)`` of the first record (oldest version first, then by path) with the bytes
        of each of ``sha256s`` the dataset holds: one pass over its kept hash lines, none parsed but those.

        Every kept file is read to its end and its bytes checked against the manifest's sha256, whatever is
        found first: one gone, cut short or altered (a version's whose records lie below no input ``compare``
        reads, as much as one's that do) is refused, rather than an append finding nothing to add. One a
        ``compare`` read whole was checked then, and is read again only where a record's sha256 begins as one of
        ``sha256s`` does.

        Raises:
          StorageError: a kept file cannot be read, or is not gzip (cut short included); DatasetError: its
            bytes are not those the manifest lists, or a line it names a record by is not a hash line.
        """
        wanted = {sha256.encode() for sha256 in sha256s}
        found: dict[str, tuple[str, str]] = {}
        for file, root, expected in self._kept:
            known = self._read.get(file)
            if known is not None and not sorted_sets.isin(_prefix_column(wanted), known, among_sorted=True).any():
                continue  # read whole by a comparison, its bytes checked: none of its records is wanted
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
                raise _not_listed(file, digest.hexdigest(), expected)
        return found

    def _lost(self, keys: list[bytes], records: _Records, named: set[int | None],
              gone: Callable[[str, Record], None]) -> None:
        """Each of a chunk's records no row named (``named``: the places of those named), to ``gone`` with its
        full path.

        Raises:
          DatasetError: a key is not a JSON string.
        """
        for key, record in (zip(keys, records) if not named else
                            ((keys[i], records[i]) for i in sorted(set(range(len(keys))) - named))):
            try:
                name = unquoted(key)
            except ValueError:
                name = None
            if not isinstance(name, str):
                raise DatasetError(f"a kept hash file of {self.info.root} names a record by a path that is not "
                                   f"JSON: {key[:200]!r}; run verify on the dataset")
            gone(self._prefix + name, record)

    def _latest(self) -> Iterator[tuple[list[bytes], _Records]]:
        """The latest record made from each path below the input, in key order (``_key``), a chunk at a time:
        the keys, and the records; a later version's over an earlier's."""
        streams = [_records(source, self._read) for source in self._sources]
        if len(streams) == 1:
            yield from streams[0]
            return
        merged = heapq.merge(*(_flat(stream, order) for order, stream in enumerate(streams)))  # (key, order): once
        keys: list[bytes] = []
        lines: list[tuple[list[bytes], Any]] = []
        for key, _, line in merged:
            if keys and keys[-1] == key:
                lines[-1] = line
                continue
            if len(keys) >= _CHUNK:
                yield keys, _Records([five for five, _ in lines], [stamp for _, stamp in lines])
                keys, lines = [], []
            keys.append(key)
            lines.append(line)
        if keys:
            yield keys, _Records([five for five, _ in lines], [stamp for _, stamp in lines])


def _head(chunks: Iterator[tuple[list[bytes], _Records]]
          ) -> tuple[tuple[list[bytes], _Records] | None, Iterator[tuple[list[bytes], _Records]]]:
    """The records of ``chunks`` as one chunk where they number ``_ONE_CHUNK`` at most (and no chunks left);
    else None, and the chunks (those read to tell put back at their head)."""
    head: list[tuple[list[bytes], _Records]] = []
    for chunk in chunks:
        head.append(chunk)
        if sum(len(keys) for keys, _ in head) > _ONE_CHUNK:
            return None, itertools.chain(head, chunks)
    return ([key for keys, _ in head for key in keys], _Records.joined(records for _, records in head)), iter(())


def _key(relpath: str) -> bytes:
    """The key ``compare`` orders a path under the input by: as the kept files quote and sort it (``relpath`` as
    a listing holds it: ``printable`` here)."""
    return _quoted(relpath if relpath.isascii() else printable(relpath)).encode("ascii")


def _keys(relpaths: list[str]) -> list[bytes]:
    """``_key`` of each of ``relpaths``: where all are ASCII, quoted and encoded in a few calls (a
    quoted path holds no newline: JSON escapes it)."""
    if relpaths and all(map(str.isascii, relpaths)):
        return "\n".join(map(_quoted, relpaths)).encode("ascii").split(b"\n")
    return list(map(_key, relpaths))


def _prefix_column(sha256s: Collection[bytes]) -> np.ndarray:
    """Each sha256 (hex)'s first 8 bytes, as ``hash_lines.columns`` gives them."""
    return np.array([int(sha256[:16], 16) for sha256 in sha256s], dtype=np.uint64)


def _flat(stream: Iterator[tuple[list[bytes], _Records]], order: int
          ) -> Iterator[tuple[bytes, int, tuple[list[bytes], Any]]]:
    """A version's chunks of records as ``(key, order, line)`` (``_Records.line``), ``order`` its place among the
    versions."""
    for keys, records in stream:
        for i, key in enumerate(keys):
            yield key, order, records.line(i)


_T = TypeVar("_T")
_AFTER_ALL = b"\xff"  # after every key (a key is ASCII JSON)
_NO_CHUNK: tuple[list[bytes], _Records] = ([], _Records([], []))
_JOINED = 4096  # rows ``join`` gives at a time
_CHUNK = 1 << 13  # records read, or merged from several versions, at a time
_ONE_CHUNK = 1 << 16  # records below the input looked up in memory at once, where no more: no listing sorted


class _Source(NamedTuple):
    """A version's kept lines whose records may lie below an append's input, as ``Existing.compare`` reads them.

    Attributes:
      version: the version.
      file: its kept hash file (local, or beside the manifest).
      expected: the sha256 the manifest lists of it (None: made from its shards for this append).
      strip: the quoted start of its paths that lie below the input (its own input above the append's:
        ``'"sub/'``), cut off them; its other paths left out. Empty: none.
      add: the quoted start put before its paths to make them the input's (its input below the append's).
      stamps: its kept stamp file's manifest entry (``stamps.listed``), checked; None: none used.
      output: the dataset.
    """

    version: int
    file: str
    expected: str | None
    strip: bytes
    add: bytes
    stamps: dict[str, Any] | None
    output: str

    def keys(self, quoted: list[bytes]) -> list[bytes]:
        """Paths as this version's files quote them, as keys (``_key``); those not below the input
        left out (``strip``)."""
        if self.strip:
            cut = len(self.strip)
            return [b'"' + path[cut:] for path in quoted if path.startswith(self.strip)]
        if self.add:
            return [self.add + path[1:] for path in quoted]
        return quoted


def _records(source: _Source, read: dict[str, np.ndarray]) -> Iterator[tuple[list[bytes], _Records]]:
    """``source``'s records below the input in key order, a chunk (of the file's lines) at a time: their keys,
    and the records; of a path that two lines name, the last line's (as the dataset's files are read, the
    later replaces the earlier). The file read whole, its bytes checked, ``read`` gets each of its lines'
    sha256 prefix, sorted (``Existing.first_with``), before the last chunk.

    Raises:
      DatasetError: a line is not a hash line, or the lines are not in path order, or the file's bytes are
        not the manifest's. StorageError: the file cannot be read.
    """
    stamped = _Stamps(source)
    pending: tuple[list[bytes], list[list[bytes]]] | None = None  # a chunk held until the next's first key
    last = b""
    digest = hashlib.sha256()
    prefixes: list[np.ndarray] | None = []  # None: more lines than ``read`` is given for
    for lines in kept_hashes.read_lines(source.file, digest):
        fields = [line.split(b"\t", 4) for line in lines]
        # Each line's fields counted, its sha256's length and its split checked, a column at a time.
        if fields and (min(map(len, fields)) < 4 or set(map(len, map(_FIRST, fields))) != {_SHA256_HEX}
                       or not all(map(_SECOND, fields))):
            for line in lines:
                hash_lines.parse(source.file, line)  # raises, naming the line
        if prefixes is not None:
            prefixes.append(_prefixes(source.file, lines, fields))
            if sum(map(len, prefixes)) > _ONE_CHUNK:  # read again for copies: memory for millions
                prefixes = None
        if source.strip:
            fields = [five for five in fields if five[3].startswith(source.strip)]
        keys = source.keys([five[3] for five in fields])
        if not keys:
            continue
        if keys[0] < last or keys != sorted(keys):
            _refuse(source, "its lines are not in path order")
        last = keys[-1]
        if len(set(keys)) < len(keys):  # a path named twice: its last line's
            places = sorted(dict(zip(keys, range(len(keys)))).values())
            keys, fields = [keys[i] for i in places], [fields[i] for i in places]
        for start in range(0, len(keys), _CHUNK):
            if pending is not None:
                if pending[0][-1] == keys[start]:
                    del pending[0][-1], pending[1][-1]
                if pending[0]:
                    yield stamped.records(*pending)
            pending = keys[start:start + _CHUNK], fields[start:start + _CHUNK]
    if source.expected is not None and digest.hexdigest() != source.expected:
        raise _not_listed(source.file, digest.hexdigest(), source.expected)
    if prefixes is not None:
        read[source.file] = np.sort(np.concatenate(prefixes)) if prefixes else np.zeros(0, dtype=np.uint64)
    if pending is not None and pending[0]:
        yield stamped.records(*pending)


def _prefixes(file: str, lines: list[bytes], fields: list[list[bytes]]) -> np.ndarray:
    """Each of ``lines``'s sha256 prefix (``hash_lines.columns``'s first column), its ``fields`` split already.

    Raises:
      DatasetError: a line is not a hash line.
    """
    try:
        raw = bytes.fromhex(b"".join([five[0] for five in fields]).decode("ascii"))
        if len(raw) == len(fields) * _SHA256_HEX // 2:
            return np.frombuffer(raw, dtype=">u8")[::_SHA256_HEX // 16].astype(np.uint64)
    except ValueError:  # not hex: ``columns`` names the line
        pass
    return hash_lines.columns(file, lines)[0]


class _Stamps:
    """A version's kept stamps, read along its records (both in key order) to give each its size and stamp.

    Raises:
      DatasetError: the file (its bytes the manifest's: ``stamps.check``) holds a line that is not a stamp line.
    """

    def __init__(self, source: _Source) -> None:
        self._source = source
        self._blocks = stamps.blocks(source.output, source.stamps) if source.stamps is not None else iter(())
        self._held: list[list[bytes]] = []  # read, after the last record's key

    def records(self, keys: list[bytes], fields: list[list[bytes]]) -> tuple[list[bytes], _Records]:
        """The records of the hash lines ``fields`` (``keys``: theirs), each with its stamp where one is kept."""
        try:
            found = self._upto(keys[-1])
        except ValueError as e:
            raise DatasetError(f"{join(self._source.output, self._source.stamps['file'])} holds a line that is not a "
                               f"stamp line ({e}), though its bytes are the manifest's: run verify on the dataset"
                               ) from e
        # The stamps looked up by ``map``: a chunk's in one call, its records made only where asked for.
        return keys, _Records(fields, list(map(found.get, keys, itertools.repeat(_NO_STAMP))))

    def _upto(self, top: bytes) -> dict[bytes, tuple[int, str]]:
        """The stamps read up to key ``top`` (included), by key (of a key named twice, the last)."""
        found: dict[bytes, tuple[int, str]] = {}
        while True:
            if not self._held:
                block = next(self._blocks, None)
                if block is None:
                    return found
                self._held = self._read(block)
                if not self._held:
                    continue
            if self._held[-1][0] <= top:
                found.update(self._held)
                self._held = []
                continue
            cut = bisect.bisect_right(self._held, top, key=operator.itemgetter(0))
            found.update(self._held[:cut])
            self._held = self._held[cut:]
            return found

    def _read(self, block: list[list[bytes]]) -> list[tuple[bytes, tuple[int, str]]]:
        """A block of stamp lines as ``(key, (size, stamp))``, those not below the input left out.

        Raises:
          ValueError: a size or a stamp is not one.
        """
        source = self._source
        keys = source.keys([three[2] for three in block])
        if source.strip:
            block = [three for three in block if three[2].startswith(source.strip)]
        sizes = list(map(int, map(_FIRST, block)))
        return list(zip(keys, zip(sizes, _column(block, 1, "ascii", "strict"))))


_NO_STAMP: tuple[None, None] = (None, None)
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)
_SIZE, _STAMP = operator.itemgetter(4), operator.itemgetter(7)  # a ``ListedRow``'s size and stamp


def _column(rows: list[list[bytes]], at: int, encoding: str, errors: str = "replace") -> list[str]:
    """Field ``at`` of each row, decoded: joined by newlines (which no field holds) and decoded at once, as each
    decoded alone would be (an undecodable end of one field is replaced before the newline, as at its end)."""
    if not rows:
        return []
    return b"\n".join([row[at] for row in rows]).decode(encoding, errors).split("\n")


def _refuse(source: _Source, why: str) -> None:
    """Refuses ``source``'s kept file: as not the manifest's where its bytes are not (``first_with``'s word),
    else for ``why``.

    Raises:
      DatasetError: always. StorageError: the file cannot be read.
    """
    if source.expected is not None:
        digest = hashlib.sha256()
        for _ in kept_hashes.read_lines(source.file, digest):
            pass
        if digest.hexdigest() != source.expected:
            raise _not_listed(source.file, digest.hexdigest(), source.expected)
    raise DatasetError(f"{source.file} is not a kept hash file beam-prep writes ({why}): an append reads a kept file's "
                       "lines in path order, as beam-prep sorts them; this one was made otherwise")


def _not_listed(file: str, actual: str, expected: str) -> DatasetError:
    return DatasetError(f"{file} is not the kept hash file the manifest lists (its sha256 is {actual}, not "
                        f"{expected}): run verify on the dataset")


def read_existing(output: str, folder: SpillFolder, info: DatasetInfo, manifest: dict[str, Any],
                  under: str | None = None) -> Existing:
    """The records of the dataset in ``output`` (``info``, ``manifest``), as ``Existing.compare`` reads them:
    from its kept hash files, each version's that has none made in ``folder`` from its shards first
    (``generated``).

    Args:
      under: the append's input: only the records whose source lies below it are joined by path (no
        other is ever looked up by one, nor gone); None: every record.

    Raises:
      DatasetError: a shard is damaged; StorageError: one cannot be read.
    """
    kept = kept_hashes.listed(manifest)
    prefix = "" if under is None else printable(under.rstrip("/")) + "/"
    stamped = stamps.listed(manifest)
    generated: dict[str, str] = {}
    files: list[tuple[str, str, str | None]] = []
    sources: list[_Source] = []
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
        own = printable(root) + "/" if root else ""  # as ``_row`` names the version's records
        if own.startswith(prefix):
            strip, add = b"", _quoted(own[len(prefix):]).encode("ascii")[:-1] if own != prefix else b""
        elif prefix.startswith(own):
            strip, add = _quoted(prefix[len(own):]).encode("ascii")[:-1], b""
        else:
            continue  # no source of this version lies below the input
        entry = stamped.get(version.version)
        if entry is not None and root and printable(root) != root:
            entry = None  # its stamps name the sources otherwise than its records: none applies
        sources.append(_Source(version.version, path, expected, strip, add, _checked(output, entry), output))
    return Existing(info, manifest, _named(output, ERRORS), _named(output, SKIPPED), generated, prefix, files,
                    sources)


def _checked(output: str, entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """A version's kept stamp file's entry where its bytes are the manifest's; else None (that version's
    files are hashed), with a warning."""
    if entry is None:
        return None
    try:
        stamps.check(output, entry)
    except (ValueError, StorageError) as e:
        _LOG.warning("%s left out (%s): the files of version %d are read again to tell them unchanged",
                     join(output, entry["file"]), e, entry["version"])
        return None
    return entry


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
