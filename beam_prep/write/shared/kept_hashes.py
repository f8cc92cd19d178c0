"""The hash lines a dataset keeps: one gzip'd file a version beside its manifest (``hashes-v<N>.tsv.gz``).

The workers' hash lines (``hash_lines``: sha256, split, perceptual hash, path) are what the duplicate
steps read; a dataset keeps them so that an append checks its new images against every record
already there without reading a shard or decoding an image. Each file holds a version's records, a
line each, the path relative to that version's input (as the shards' source field is), sorted by
path, gzip'd with no time or name in its header: the same records give the same bytes. The manifest
lists them (``hash_files``: version, file, records, sha256). See docs/design/duplicates.md.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from isal import igzip

from beam_prep.errors import DatasetError
from beam_prep.io.storage import open_to_read, storage_error, write_gzip_lines
from beam_prep.write.shared import hash_lines, layout
from beam_prep.write.shared.entry import printable
from beam_prep.write.shared.spill import SortedRows, SpillFolder

__all__ = ["MANIFEST_KEY", "KeptFile", "full_path_lines", "kept_name", "listed", "read_lines", "relative_to",
           "write_rows", "write_sorted"]

MANIFEST_KEY = "hash_files"
_READ = 1 << 22


def kept_name(version: int) -> str:
    """The kept hash file of ``version`` (a name ``layout.KEPT_HASHES`` matches)."""
    return layout.KEPT_HASHES.replace("*", str(version))


class KeptFile(dict):
    """A manifest's ``hash_files`` entry: ``{"version", "file", "records", "sha256"}``."""

    @classmethod
    def of(cls, version: int, records: int, sha256: str) -> KeptFile:
        return cls(version=version, file=kept_name(version), records=records, sha256=sha256)


def listed(manifest: Mapping[str, Any]) -> dict[int, KeptFile]:
    """The kept hash files a manifest lists, by version (none in a dataset made before they were kept).

    Raises:
      DatasetError: the manifest's ``hash_files`` is not a list of entries ``KeptFile`` writes.
    """
    found: dict[int, KeptFile] = {}
    for entry in manifest.get(MANIFEST_KEY) or []:
        try:
            version, records, sha256 = int(entry["version"]), int(entry["records"]), str(entry["sha256"])
            if entry["file"] != kept_name(version) or version < 1 or records < 0 or version in found:
                raise ValueError(entry["file"])
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"the manifest's {MANIFEST_KEY} holds an entry beam-prep does not write: "
                               f"{str(entry)[:200]}") from e
        found[version] = KeptFile.of(version, records, sha256)
    return found


def relative_to(root: str | None, line: bytes) -> tuple[bytes, bytes]:
    """A workers' hash line (a full path) as a kept one (the path under ``root``, the run's input; no
    root: as given), with the JSON path it sorts by: ``(path, line)``."""
    sha256, split, picture, quoted, label = hash_lines.fields(line)
    prefix = _quoted_prefix(root)
    if prefix and quoted.startswith(prefix):
        quoted = b'"' + quoted[len(prefix):]
    return quoted, b"\t".join((sha256, split, picture, quoted, label))


def _quoted_prefix(root: str | None) -> bytes:
    """``root``'s paths' start as a hash line quotes them (``'"<root>/'``); no root: none."""
    base = (root or "").rstrip("/")
    return json.dumps(printable(base + "/")).encode()[:-1] if base else b""


def write_sorted(rows: Iterable[tuple[bytes, bytes]], target: str, version: int) -> KeptFile:
    """Writes a version's kept hash file at ``target`` (local or gs://) from ``(path, line)`` rows in any
    order (``write_rows``).

    Raises:
      StorageError: ``target`` cannot be written.
    """
    return KeptFile.of(version, *write_rows(rows, target))


def write_rows(rows: Iterable[tuple[bytes, bytes]], target: str) -> tuple[int, str]:
    """Writes the lines of ``(key, line)`` rows in any order at ``target`` (local or gs://), sorted by key
    on disk (``SortedRows``), gzip'd without a time or a name; returns how many and the file's sha256.

    Raises:
      StorageError: ``target`` cannot be written.
    """
    folder = SpillFolder(prefix="beam-prep-kept-")
    try:
        ordered = SortedRows(folder, "kept")
        for row in rows:
            ordered.append(row)
        return write_gzip_lines((line for _, line in ordered), target)
    finally:
        folder.close()


def read_lines(path: str, digest: Any = None) -> Iterator[list[bytes]]:
    """A kept hash file's lines (paths relative to its version's input), a few MB at a time; ``digest``
    (a ``hashlib`` object), if given, gets the file's raw bytes as they are read.

    Raises:
      StorageError: it cannot be read, or is not gzip.
    """
    try:
        with open_to_read(path) as raw, igzip.IGzipFile(fileobj=raw if digest is None else _Hashing(raw, digest),
                                                        mode="rb") as f:
            rest = b""
            while block := f.read(_READ):
                lines = (rest + block).split(b"\n")
                rest = lines.pop()
                yield lines
            if rest:
                yield [rest]
    except Exception as e:  # each filesystem raises its own types; a damaged file OSError or EOFError.
        raise storage_error("read", path, e) from e


class _Hashing:
    """A file read through, its bytes into ``digest``: what ``IGzipFile`` reads a kept file from."""

    def __init__(self, raw: Any, digest: Any) -> None:
        self._raw, self._digest = raw, digest

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self._digest.update(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def full_path_lines(lines: Iterable[bytes], root: str | None) -> list[bytes]:
    """Kept lines (paths under ``root``, their version's input) as workers' hash lines (``hash_lines``: the
    full path), for the duplicate search."""
    prefix = _quoted_prefix(root)
    found = []
    for line in lines:
        sha256, split, picture, quoted, label = hash_lines.fields(line)
        found.append(b"\t".join((sha256, split, picture, prefix + quoted[1:] if prefix else quoted, label)))
    return found
