"""Small files on any filesystem, read as stored."""
from __future__ import annotations

import gzip
import random

import pytest
from small_disk import small_disk

from beam_prep.errors import StorageError
from beam_prep.io.array_record import shard_records
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


@pytest.mark.slow  # mounts a tmpfs
def test_an_array_record_shard_that_finds_no_room_says_what_to_do(tmp_path):
    """ArrayRecord's C++ writer says a full disk in its text alone (a RuntimeError: ``write() failed: No
    space left on device; writing ...; at byte 65536``): the line is the one every format gives, with
    its advice."""
    pytest.importorskip("array_record", reason="the array_record library is not installed")
    with small_disk(tmp_path / "disk", size="64k") as disk, pytest.raises(StorageError) as raised, \
            shard_records(str(disk / "train-00000-of-00001.array_record")) as write:
        for i in range(40):
            write(random.Random(i).randbytes(4000))  # incompressible: 160 KB
    assert str(raised.value) == (f"cannot write {disk}/train-00000-of-00001.array_record: [Errno 28] No space left "
                                 "on device; free space on that disk, or write elsewhere")
