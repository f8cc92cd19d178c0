"""The sources' stamps a dataset keeps: one gzip'd file a version beside its manifest (``stamps-v<N>.tsv.gz``).

An append must tell which listed files the dataset holds unchanged. Reading each to hash it costs
as much as the dataset grows; as rsync and make do, a file whose size and stamp (``plan.walk.Stamp``:
a local file's modification time, a gs:// object's generation) are those the listing saw when its
record was made is taken as unchanged unread (``--append_check stat``). A line a file the run
listed: ``<size>\\t<stamp>\\t<path as JSON>``, the path relative to the version's input, sorted by
path, gzip'd as the kept hash files are (``finish.kept_hashes``). The launcher writes the run's (``Writer``)
into its folder with the listings; the publication moves it beside the manifest, which lists it
(``stamp_files``: version, file, lines, sha256). The file is a shortcut: a file without a line (no
stamp: neither local nor gs://), or of a version without a stamp file (made before them, or by
``WriteImageDataset``), is hashed, and so is every file of a version whose stamp file's bytes are
not the manifest's. See docs/reference/manifest.md.
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from isal import isal_zlib

from beam_prep.io.storage import join, open_to_read, storage_error, write_gzip_lines
from beam_prep.write.shared import layout
from beam_prep.write.shared.entry import FileEntry, printable
from beam_prep.write.shared.spill import SortedRows, SpillFolder

__all__ = ["MANIFEST_KEY", "RUN_FILE", "Writer", "blocks", "check", "kept_name", "listed", "stage"]

_LOG = logging.getLogger(__name__)
MANIFEST_KEY = "stamp_files"
RUN_FILE = "stamps.tsv.gz"  # the run's, in its folder until published
_READ = 1 << 20
_quoted = json.encoder.encode_basestring_ascii  # as json.dumps writes a str


def kept_name(version: int) -> str:
    """The kept stamp file of ``version`` (a name ``layout.KEPT_STAMPS`` matches)."""
    return layout.KEPT_STAMPS.replace("*", str(version))


class Writer:
    """The run's stamp file, a line per listed file that has a stamp, sorted on disk as they come.

    Raises:
      StorageError: the spill or the file cannot be written.
    """

    def __init__(self) -> None:
        self._folder = SpillFolder(prefix="beam-prep-stamps-")
        self._rows = SortedRows(self._folder, "stamps")

    def add(self, entry: FileEntry) -> None:
        if entry.stamp is not None:
            quoted = _quoted(printable(entry.relpath)).encode()
            self._rows.append((quoted, b"%d\t%s\t%s" % (entry.size, entry.stamp.encode(), quoted)))

    def close(self, work: str) -> None:
        """Writes the file into the run's folder ``work`` (empty where no file had a stamp: every run that
        lists keeps one, whatever its files' times), and removes the spill."""
        try:
            write_gzip_lines((line for _, line in self._rows), join(work, RUN_FILE))
        finally:
            self._folder.close()


def stage(work: str, folder: str, version: int) -> dict[str, Any] | None:
    """Copies the run's stamp file from its folder ``work`` into the staging ``folder`` as version
    ``version``'s; returns its manifest entry, or None where the run's folder has none (``WriteImageDataset``'s
    run, which lists no tree, or a run folder an earlier beam-prep wrote, resumed).

    Raises:
      StorageError: it cannot be read or written.
    """
    from apache_beam.io.filesystems import FileSystems

    source, name = join(work, RUN_FILE), kept_name(version)
    if not FileSystems.exists(source):
        return None
    lines, digest = write_gzip_lines(_lines(source), join(folder, name))
    return {"version": version, "file": name, "lines": lines, "sha256": digest}


def listed(manifest: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """The kept stamp files a manifest lists, by version; an entry beam-prep does not write is left out
    (its version's files are then hashed), with a warning."""
    found: dict[int, dict[str, Any]] = {}
    entries = manifest.get(MANIFEST_KEY) or []
    for entry in entries if isinstance(entries, list) else [entries]:
        try:
            version, lines, sha256 = int(entry["version"]), int(entry["lines"]), str(entry["sha256"])
            if entry["file"] != kept_name(version) or version < 1 or lines < 0 or version in found:
                raise ValueError(entry["file"])
        except (KeyError, TypeError, ValueError):
            _LOG.warning("the manifest's %s holds an entry beam-prep does not write, left out (its files are "
                         "read again): %s", MANIFEST_KEY, str(entry)[:200])
            continue
        found[version] = {"version": version, "file": kept_name(version), "lines": lines, "sha256": sha256}
    return found


def check(output: str, entry: Mapping[str, Any]) -> None:
    """That a kept stamp file's bytes are those the manifest lists (``listed``'s ``entry``): read, not inflated.

    Raises:
      ValueError: they are not; StorageError: the file cannot be read.
    """
    path = join(output, entry["file"])
    digest = hashlib.sha256()
    try:
        with open_to_read(path) as f:
            while block := f.read(_READ):
                digest.update(block)
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("read", path, e) from e
    if digest.hexdigest() != entry["sha256"]:
        raise ValueError(f"its sha256 is {digest.hexdigest()}, not the manifest's {entry['sha256']}")


def blocks(output: str, entry: Mapping[str, Any]) -> Iterator[list[list[bytes]]]:
    """A kept stamp file's lines, a block at a time, each as its fields ``[size, stamp, path as JSON]`` as the
    file holds them (the path relative to its version's input), in the file's order (by path).

    Raises:
      ValueError: a line is not a stamp line (its fields are checked as they are used). StorageError: the
        file cannot be read, or is not gzip.
    """
    for lines in _blocks(join(output, entry["file"])):
        fields = [line.split(b"\t", 2) for line in lines]
        if min(map(len, fields)) < 3:
            bad = next(line for line, three in zip(lines, fields) if len(three) != 3)
            raise ValueError(f"not a stamp line: {bad[:200]!r}")
        yield fields


def _lines(path: str, digest: Any = None) -> Iterator[bytes]:
    """A gzip'd file's lines, its raw bytes hashed into ``digest`` as they are read.

    Raises:
      StorageError: it cannot be read, or is not gzip (cut short included).
    """
    for lines in _blocks(path, digest):
        yield from lines


def _blocks(path: str, digest: Any = None) -> Iterator[list[bytes]]:
    """``_lines``, a block at a time."""
    inflate, rest = isal_zlib.decompressobj(16 + isal_zlib.MAX_WBITS), b""
    try:
        with open_to_read(path) as f:
            while block := f.read(_READ):
                if digest is not None:
                    digest.update(block)
                lines = (rest + inflate.decompress(block)).split(b"\n")
                rest = lines.pop()
                if lines:
                    yield lines
        if not inflate.eof or rest:
            raise EOFError("cut short")
    except Exception as e:  # each filesystem raises its own types; a damaged file isal_zlib.error or EOFError.
        raise storage_error("read", path, e) from e
