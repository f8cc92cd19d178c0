"""beam_prep's own TFRecord framing is TensorFlow's format, byte for byte."""
from __future__ import annotations

import io
import random

import pytest

from beam_prep.io import tfrecord

_RANDOM = random.Random(0)
RECORDS = [b"", b"x", b"\x00" * 7, _RANDOM.randbytes(300), _RANDOM.randbytes(20_000), _RANDOM.randbytes(70_001)]


def test_framing_matches_beams_byte_for_byte():
    from apache_beam.io.tfrecordio import _TFRecordUtil

    for data in RECORDS:
        beams = io.BytesIO()
        _TFRecordUtil.write_record(beams, data)
        assert tfrecord.frame(data) == beams.getvalue()
        assert _TFRecordUtil.read_record(io.BytesIO(tfrecord.frame(data))) == data


def test_masked_crc32c_of_known_values():
    # CRC32C("123456789") = 0xE3069283, the check value of the Castagnoli polynomial.
    crc = 0xE3069283
    assert tfrecord.masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % 2**32


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_tensorflow_reads_what_write_record_writes(tmp_path, compression):
    import tensorflow as tf


    path = str(tmp_path / "shard")
    with tfrecord.shard_writer(path, compression) as f:
        for data in RECORDS:
            tfrecord.write_record(f, data)
    tf_compression = "GZIP" if compression == "gzip" else ""
    assert [r.numpy() for r in tf.data.TFRecordDataset(path, compression_type=tf_compression)] == RECORDS


def test_tensorflows_writer_writes_the_same_bytes(tmp_path):
    import tensorflow as tf

    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for data in RECORDS:
            w.write(data)
    with open(path, "rb") as f:
        assert f.read() == b"".join(tfrecord.frame(data) for data in RECORDS)


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_count_records_counts_by_the_framing_and_names_a_damaged_file(tmp_path, compression):
    import gzip

    from beam_prep.errors import DatasetError

    path = tmp_path / "shard"
    with tfrecord.shard_writer(str(path), compression) as f:
        for data in RECORDS:
            tfrecord.write_record(f, data)
    assert tfrecord.count_records(str(path), compression) == len(RECORDS)

    framed = b"".join(tfrecord.frame(data) for data in RECORDS)
    pack = gzip.compress if compression == "gzip" else bytes
    cut, bad_length = tmp_path / "cut", tmp_path / "bad_length"
    cut.write_bytes(pack(framed[:-10]))  # the last record's payload cut short
    bad_length.write_bytes(pack(framed[:1] + bytes([framed[1] ^ 1]) + framed[2:]))  # length no longer matches its CRC
    with pytest.raises(DatasetError, match=rf"{cut}: record {len(RECORDS) - 1} is cut short"):
        tfrecord.count_records(str(cut), compression)
    with pytest.raises(DatasetError, match=rf"{bad_length}: record 0 has a damaged length"):
        tfrecord.count_records(str(bad_length), compression)


def test_read_records_gives_each_record_back_and_names_damaged_data(tmp_path):
    from beam_prep.errors import DatasetError

    path = tmp_path / "shard"
    with tfrecord.shard_writer(str(path), "gzip") as f:
        for data in RECORDS:
            tfrecord.write_record(f, data)
    assert list(tfrecord.read_records(str(path), "gzip")) == RECORDS
    framed = bytearray(b"".join(tfrecord.frame(data) for data in RECORDS[:4]))
    framed[-10] ^= 1  # a byte of the last record's data: its length still checks, its data no longer
    damaged = tmp_path / "damaged"
    damaged.write_bytes(bytes(framed))
    with pytest.raises(DatasetError, match=rf"{damaged}: record 3 is damaged \(its CRC does not match\)"):
        list(tfrecord.read_records(str(damaged), "none"))
    assert tfrecord.count_records(str(damaged), "none") == 4  # counting reads the lengths' CRCs alone
