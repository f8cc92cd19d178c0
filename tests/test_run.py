"""The library entry point: counters, the manifest's bookkeeping, and what it refuses."""
from __future__ import annotations

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_prep import layout, manifest
from beam_prep.errors import DatasetError
from beam_prep.imaging import ImageSpec
from beam_prep.options import PrepareConfig
from beam_prep.listing import FileEntry, list_tree, order_key
from beam_prep.pipeline import run, write_work_files
from helpers import make_tree


def test_metrics_count_listed_written_failed_and_bytes(tmp_path):
    make_tree(tmp_path / "in", {"a": 3, "b": 2})
    (tmp_path / "in" / "a" / "bad.png").write_bytes(b"nope")
    config = PrepareConfig(input=str(tmp_path / "in"), output=str(tmp_path / "out"),
                           spec=ImageSpec(height=16, width=16))
    result = run(config, PipelineOptions(["--direct_running_mode=in_memory"]))
    counters = result.counters
    assert (counters["listed"], counters["written"], counters["failed_decode"]) == (6, 5, 1)
    assert counters["bytes_in"] == sum(p.stat().st_size for p in (tmp_path / "in").rglob("*.*"))
    assert 0 < counters["bytes_out"] < counters["bytes_in"]
    assert result.manifest["counts"] == {"listed": 6, "written": 5, "failed": 1, "skipped": 0}


def test_a_manifest_is_never_built_when_records_are_missing():
    config = PrepareConfig(input="in", output="out", spec=ImageSpec())
    plan = manifest.Plan(labels=["a"], num_shards={"train": 1}, listed=3, skipped=0, sink="streaming")
    shards = [("train", "train-00000-of-00001.tfrecord.gz", 1)]
    with pytest.raises(DatasetError, match="3 files listed but 1 written and 1 failed"):
        manifest.build(config, plan, shards, [(("train", "a"), 1)], [{"stage": "decode", "path": "x"}])


def test_files_are_dealt_to_shards_evenly_in_key_order(tmp_path):
    make_tree(tmp_path / "in", {"a": 37, "b": 26}, size=(8, 8))
    listing = list_tree(str(tmp_path / "in"))
    plan = manifest.Plan(labels=listing.labels, num_shards={"train": 4}, listed=63, skipped=0,
                         sink="streaming")
    write_work_files(listing, plan, str(tmp_path / "work"))
    shards = [[FileEntry.from_json(line).relpath for line in
               (tmp_path / "work" / layout.shard_listing_name("train", i)).read_text().splitlines()]
              for i in range(4)]
    assert sorted(len(s) for s in shards) == [15, 16, 16, 16]
    assert sorted(sum(shards, [])) == sorted(e.relpath for e in listing.entries)
    assert all(s == sorted(s, key=order_key) for s in shards)


def test_never_more_shards_than_examples():
    # 2 huge records would fill 11 shards of 150 MB by size; one worker each is plenty.
    assert layout.choose_num_shards(2, 805e6, 150, multiple_of=1) == 2
    assert layout.choose_num_shards(2, 805e6, 150, multiple_of=4) == 4
    assert layout.choose_num_shards(1000, 1e6, 150, multiple_of=1) == 7
