"""Small files on any filesystem, read as stored."""
from __future__ import annotations

import gzip

import pytest

from beam_prep.errors import StorageError
from beam_prep.io.storage import read_bytes, read_lines


def test_a_gz_file_is_read_as_stored_not_inflated(tmp_path):
    """Beam would guess GZIP from the name: a hash or listing file must come back byte for byte."""
    path = tmp_path / "lines.txt.gz"
    path.write_bytes(gzip.compress(b"a\nb\n"))
    assert read_bytes(str(path)) == path.read_bytes()


def test_read_lines_names_a_missing_file(tmp_path):
    assert read_lines(str(_written(tmp_path / "x.txt", "é\nb\n"))) == ["é", "b"]
    with pytest.raises(StorageError, match="cannot read .*missing.txt"):
        read_lines(str(tmp_path / "missing.txt"))


def _written(path, text):
    path.write_text(text, encoding="utf-8")
    return path
