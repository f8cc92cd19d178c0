"""The hash files' lines: one per written record, written by the workers (``hash_line``) and read
back by every step that finds or drops duplicates (``parse``), so the format is spelled out in
one place.

A line is ``<sha256 hex>\\t<split>\\t<perceptual hash, 16 hex digits or ->\\t<path as JSON>\\t<label as
JSON>`` (the label: a name, or the sorted list of a multi-label record's; a line of an older run has
none, its label unknown: JSON escapes every tab, so the path ends at the fourth).
"""
from __future__ import annotations

import binascii
import json
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from beam_prep.errors import DatasetError
from beam_prep.write.shared.entry import printable

__all__ = ["HashLine", "columns", "fields", "hash_line", "parse"]

_SHA256_HEX = 64
_PHASH_HEX = 16
_NO_PHASH = b"-"
_NO_LABEL = b"null"
_ZERO_PHASH = b"0" * _PHASH_HEX


def hash_line(sha256_hex: str, split: str, path: str, phash: int | None = None,
              label: str | Sequence[str] | None = None) -> str:
    """A hash file's line for one written record, the path as messages show it (``printable``: a
    name that is not UTF-8 escaped). ``phash`` None (``-``): the record takes no part in the
    near-duplicate search (an image of one flat colour). ``label``: its label, or a multi-label
    record's labels (kept sorted: the same set is the same label)."""
    picture = "-" if phash is None else f"{phash:016x}"
    named = label if label is None or isinstance(label, str) else sorted(label)
    return f"{sha256_hex}\t{split}\t{picture}\t{json.dumps(printable(path))}\t{json.dumps(named)}"


class HashLine(NamedTuple):
    """A parsed hash line, its fields as the file holds them but for the perceptual hash.

    Attributes:
      sha256: the source's sha256, 64 hex digits (bytes).
      split: the record's split.
      phash: its perceptual hash; None: none (``-``).
      path: its source path, JSON-quoted (bytes, as duplicates.jsonl writes it).
      label: its label as JSON (bytes, as duplicates.jsonl writes it): a name, a list of names, or
        ``null`` (unknown: a line of an older run).
    """

    sha256: bytes
    split: bytes
    phash: int | None
    path: bytes
    label: bytes = _NO_LABEL


def parse(file: str, line: bytes) -> HashLine:
    """One line of the hash file ``file``, checked field by field.

    Raises:
      DatasetError: the line is not a hash line (naming ``file`` and the line).
    """
    parts = line.split(b"\t", 4)
    try:
        if len(parts) not in (4, 5):
            raise ValueError("not four or five fields")
        digest, split, picture, path, *named = parts
        label = named[0] if named else _NO_LABEL
        if len(digest) != _SHA256_HEX or not split or not label:
            raise ValueError("no sha256, split or label")
        binascii.unhexlify(digest)
        if picture == _NO_PHASH:
            return HashLine(digest, split, None, path, label)
        if len(picture) != _PHASH_HEX:
            raise ValueError("not a perceptual hash")
        return HashLine(digest, split, int.from_bytes(binascii.unhexlify(picture), "big"), path, label)
    except (ValueError, binascii.Error) as e:
        raise DatasetError(f"{file} holds a line that is not a record's hash: {line[:200]!r}") from e


def fields(line: bytes) -> tuple[bytes, bytes, bytes, bytes, bytes]:
    """A line ``parse`` has checked already, as its five fields (sha256, split, perceptual hash as
    hex or ``-``, path, label as JSON: ``null`` where the line has none), unchecked: for a second
    pass over lines, at a fraction of ``parse``'s cost."""
    sha256, split, picture, path, *named = line.split(b"\t", 4)
    return sha256, split, picture, path, named[0] if named else _NO_LABEL


def columns(file: str, lines: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lines of the hash file ``file``, checked as ``parse`` checks each, as three columns: each sha256's
    first 8 bytes (``uint64``, as ``int(sha256[:16], 16)``), each perceptual hash (``uint64``; 0 where
    none) and whether it has one: for the passes over a dataset's lines by the million, a few C calls a
    column rather than a ``parse`` a line.

    Raises:
      DatasetError: a line is not a hash line (``parse``'s word, naming it).
    """
    n = len(lines)
    four = [line.split(b"\t", 3) for line in lines]
    try:
        digests, splits, pictures, rests = zip(*four) if n else ((), (), (), ())
        has = [picture != _NO_PHASH for picture in pictures]
        hexes = bytes.fromhex(b"".join(digests).decode("ascii"))
        phashes = bytes.fromhex(b"".join([p if h else _ZERO_PHASH for p, h in zip(pictures, has)]).decode("ascii"))
        if (len(hexes) != n * _SHA256_HEX // 2 or len(phashes) != n * _PHASH_HEX // 2
                or {len(d) for d in digests} - {_SHA256_HEX} or {len(p) for p, h in zip(pictures, has) if h} - {_PHASH_HEX}
                or not all(splits) or any(rest.endswith(b"\t") for rest in rests)):
            raise ValueError("a line is not a hash line")
    except ValueError:  # a line of fewer fields, or a field not hex: ``parse`` names the first
        parsed = [parse(file, line) for line in lines]
        return (np.array([int(p.sha256[:16], 16) for p in parsed], dtype=np.uint64),
                np.array([p.phash or 0 for p in parsed], dtype=np.uint64),
                np.array([p.phash is not None for p in parsed], dtype=np.bool_))
    return (np.frombuffer(hexes, dtype=">u8")[::_SHA256_HEX // 16].astype(np.uint64),
            np.frombuffer(phashes, dtype=">u8").astype(np.uint64), np.array(has, dtype=np.bool_))
