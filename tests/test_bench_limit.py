"""The writer benchmark's record limit (b″): the per-image work every record needs, in one process."""
from __future__ import annotations

import gzip

from helpers import make_tree

from beam_prep.write.images.imaging import ImageSpec
from beam_prep.write.shared.entry import FileEntry
from beam_prep.write.shared.shard_formats import shard_format
from benchmarks import limit


def test_the_record_pass_writes_a_record_an_image_and_a_damaged_one_none(tmp_path):
    make_tree(tmp_path / "tree", {"a": 4}, size=(40, 30))
    files = sorted((tmp_path / "tree").rglob("*.jpg"))
    (tmp_path / "tree" / "a" / "cut.jpg").write_bytes(files[0].read_bytes()[:100])  # reported, never written
    entries = [FileEntry(str(p), p.name, "train", "a", 0, p.stat().st_size)
               for p in [*files, tmp_path / "tree" / "a" / "cut.jpg"]]
    spec, fmt = ImageSpec(height=16, width=16), shard_format("tfrecord")
    limit._write_records(entries, spec, fmt, str(tmp_path / "shard.tfrecord.gz"))
    gzip.decompress((tmp_path / "shard.tfrecord.gz").read_bytes())  # one GZIP stream, whole
    payloads = list(fmt.read(str(tmp_path / "shard.tfrecord.gz"), "gzip"))
    assert [fmt.source(p)[1] for p in payloads] == [p.name for p in files]
    seconds, cpu_seconds = limit._record_pass(files, spec)
    assert seconds > 0 and cpu_seconds > 0
