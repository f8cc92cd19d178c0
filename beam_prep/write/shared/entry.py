"""A listed file, the model every stage of the writer shares: the launcher lists each file as a ``FileEntry``,
the workers turn each into a record, and the reports name it; and a path's name as the
filesystem holds it (``raw_name``) and as messages show it (``printable``).
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

__all__ = ["DEFAULT_SPLIT", "UNKNOWN_LABEL", "VALIDATION_SPLIT", "FileEntry", "printable", "raw_name", "unquoted"]

DEFAULT_SPLIT = "train"
VALIDATION_SPLIT = "validation"
UNKNOWN_LABEL = -1

_quoted = json.encoder.encode_basestring_ascii  # how json.dumps writes a str
_PLAIN = re.compile(rb'"[ !#-\[\]-~]*"')  # a JSON string of printable ASCII without an escape


def unquoted(quoted: bytes) -> Any:
    """A JSON value as the kept files and listings write a path (``_quoted``), read as ``json.loads`` reads
    it: a string without an escape is sliced out, several times as fast, for the lines an append reads by
    the million.

    Raises:
      ValueError: not JSON.
    """
    if _PLAIN.fullmatch(quoted):
        return quoted[1:-1].decode("ascii")
    return json.loads(quoted)


def raw_name(text: str) -> bytes:
    """A path's bytes as the filesystem holds them.

    Python gives an undecodable byte of a local file name as a lone surrogate
    (PEP 383); encoding it back gives the original bytes, and valid UTF-8 names
    are unchanged.
    """
    return text.encode("utf-8", "surrogateescape")


def printable(text: str) -> str:
    """A path fit for messages, JSON and logs: undecodable bytes shown as ``\\xff``."""
    return raw_name(text).decode("utf-8", "backslashreplace")


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """One listed image, carrying everything a worker needs to turn it into a record."""

    path: str
    relpath: str
    split: str
    label: str
    label_id: int  # the id stored in the record: the label's index plus --label_offset
    size: int
    # Multi-label data (--metadata's labels column): every label's name and id; ``label`` is
    # then their names joined by ";" (for reports), and ``label_id`` UNKNOWN_LABEL if any is.
    labels: tuple[str, ...] | None = None
    label_ids: tuple[int, ...] | None = None
    extra: dict[str, Any] | None = None  # --metadata's other columns: feature key -> str, int or float
    # The walk's stamp (``plan.walk.Stamp``: a local file's mtime, a gs:// object's generation): with ``size``,
    # what an append compares with its record's to take it as unchanged unread (``plan.listing.stamps``).
    stamp: str | None = None

    @property
    def counted_labels(self) -> tuple[str, ...]:
        """The labels a record of this file counts under in class_counts: one, or each of several."""
        return self.labels if self.labels is not None else (self.label,)

    def to_json(self) -> str:
        # json.dumps(vars(self)), spelled out: the launcher writes one line per listed
        # file, and this is several times as fast. ASCII escapes carry a non-UTF-8
        # name's lone surrogates through the file unchanged.
        line = (f'{{"path": {_quoted(self.path)}, "relpath": {_quoted(self.relpath)}, '
                f'"split": {_quoted(self.split)}, "label": {_quoted(self.label)}, '
                f'"label_id": {int(self.label_id)}, "size": {int(self.size)}')
        if self.labels is not None:
            line += f', "labels": {json.dumps(self.labels)}, "label_ids": {json.dumps(self.label_ids)}'
        if self.extra is not None:
            line += f', "extra": {json.dumps(self.extra)}'
        if self.stamp is not None:
            line += f', "stamp": {_quoted(self.stamp)}'
        return line + "}"

    @classmethod
    def from_json(cls, line: str) -> FileEntry:
        fields = json.loads(line)
        for key in ("labels", "label_ids"):
            if fields.get(key) is not None:
                fields[key] = tuple(fields[key])
        return cls(**fields)
