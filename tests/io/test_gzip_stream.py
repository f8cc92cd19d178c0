"""``gzip_stream``: a standard GZIP file, read back by zlib, Python's gzip and TensorFlow, whose
JPEG stretches are stored and whose compressible ones are deflated."""
from __future__ import annotations

import gzip
import io
import random
import zlib

import numpy as np
import pytest
from PIL import Image

from beam_prep.io import tfrecord
from beam_prep.io.gzip_stream import CHUNK, MIN_SAVING, SKIP_AFTER_STORED, GzipStream

_RANDOM = random.Random(0)


def written(data: bytes, cut: int | None = None) -> bytes:
    """``data`` through a ``GzipStream``, in writes of ``cut`` bytes (or one)."""
    out = io.BytesIO()
    with GzipStream(out, tfrecord.GZIP_LEVEL) as f:
        step = cut or max(len(data), 1)
        for start in range(0, len(data), step):
            f.write(data[start:start + step])
    return out.getvalue()


def jpegs(count: int) -> list[bytes]:
    """JPEGs of a smooth picture with noise, as photographs are: deflate hardly shrinks them."""
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 255, 224)
    images = []
    for _ in range(count):
        base = (ramp[None, :, None] * rng.uniform(0.3, 1, 3) + ramp[:, None, None] * rng.uniform(0, 0.7, 3))
        pixels = np.clip(base + rng.normal(0, 12, (224, 224, 3)), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "JPEG", quality=90)
        images.append(buf.getvalue())
    return images


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17])
@pytest.mark.parametrize("kind", ["zeros", "random", "alternating"])
def test_every_size_and_kind_reads_back_with_zlib_and_gzip(size, kind):
    if kind == "zeros":
        data = bytes(size)
    elif kind == "random":
        data = _RANDOM.randbytes(size)
    else:  # incompressible and compressible stretches in turn, across chunk boundaries
        data = b"".join(_RANDOM.randbytes(5000) if i % 2 else bytes(5000) for i in range(size // 5000 + 1))[:size]
    out = written(data, cut=7919)
    assert gzip.decompress(out) == data
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    assert inflate.decompress(out) == data and inflate.eof and not inflate.unused_data
    assert out == written(data)  # the same bytes however the writes are cut


def test_jpeg_records_are_stored_and_tensorflow_reads_them(tmp_path):
    import tensorflow as tf

    records = jpegs(40)
    framed = b"".join(tfrecord.frame(r) for r in records)
    assert len(zlib.compress(framed, 6)) < len(framed)  # deflate shrinks them a little ...
    assert len(zlib.compress(framed, 6)) > len(framed) * (1 - MIN_SAVING)  # ... too little to pay
    path = tmp_path / "shard.tfrecord.gz"
    with tfrecord.shard_writer(str(path), "gzip") as f:
        for r in records:
            tfrecord.write_record(f, r)
    data = path.read_bytes()
    assert len(framed) <= len(data) <= len(framed) * 1.001  # stored: block headers and the trailer only
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(path), compression_type="GZIP")] == records


def test_compressible_records_are_deflated_and_tries_resume_after_a_stored_stretch():
    pixels = bytes(range(256)) * (CHUNK // 64)  # raw-pixel-like: repeats
    assert len(written(pixels)) < len(pixels) * 0.1
    noise = _RANDOM.randbytes(CHUNK)
    data = noise + pixels * 4  # one stored chunk, then SKIP_AFTER_STORED stored untried, then deflated
    out = written(data)
    assert gzip.decompress(out) == data
    untried = (1 + SKIP_AFTER_STORED) * CHUNK
    assert untried < len(data) // 2
    assert len(out) < untried + (len(data) - untried) * 0.1


def test_a_closed_stream_refuses_writes():
    out = io.BytesIO()
    stream = GzipStream(out, tfrecord.GZIP_LEVEL)
    stream.close()
    stream.close()  # a second close writes nothing more
    assert gzip.decompress(out.getvalue()) == b""
    with pytest.raises(ValueError, match="closed"):
        stream.write(b"x")
