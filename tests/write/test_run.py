"""The library entry point: counters, the manifest's bookkeeping, and what it refuses."""
from __future__ import annotations

import pytest
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.options.pipeline_options import PipelineOptions
from helpers import make_tree

from beam_prep.errors import DatasetError
from beam_prep.model import dataset
from beam_prep.write.finish import manifest
from beam_prep.write.images.imaging import ImageSpec
from beam_prep.write.plan import sharding, skipped
from beam_prep.write.plan.config import PrepareConfig
from beam_prep.write.plan.listing import list_tree, order_key
from beam_prep.write.plan.run_plan import RunPlan
from beam_prep.write.plan.work_files import write_work_files
from beam_prep.write.run.pipeline import run
from beam_prep.write.shared import layout
from beam_prep.write.shared.entry import FileEntry


@pytest.mark.slow  # runs a pipeline in this process
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
    plan = RunPlan(labels=["a"], num_shards={"train": 1}, listed=3, skipped=0, sink="streaming")
    shards = [("train", "train-00000-of-00001.tfrecord.gz", 1)]
    with pytest.raises(DatasetError, match="3 files listed but 1 written and 1 failed"):
        manifest.build(config, plan, shards, [(("train", "a"), 1)], [{"stage": "decode", "path": "x"}])


@pytest.mark.parametrize("num_shards,reported,missing", [
    (2, [("train", "train-00000-of-00002.tfrecord.gz", None)], "train-00001-of-00002.tfrecord.gz"),
    (0, [], "any shard file"),
])
def test_a_manifest_is_never_built_for_shards_the_writer_did_not_report(num_shards, reported, missing):
    """A runner that loses the writes' results must not get a manifest listing shards nobody wrote."""
    config = PrepareConfig(input="in", output="out", spec=ImageSpec())
    plan = RunPlan(labels=["a"], num_shards={"train": num_shards}, listed=2, skipped=0, sink="shuffle")
    with pytest.raises(DatasetError, match=f"split 'train' holds 2 records but its writer did not report {missing}"):
        manifest.build(config, plan, reported, [(("train", "a"), 2)], [])


def test_a_shard_count_the_runner_chose_lists_the_shards_it_wrote():
    config = PrepareConfig(input="in", output="out", spec=ImageSpec())
    plan = RunPlan(labels=["a"], num_shards={"train": 0}, listed=2, skipped=0, sink="shuffle")
    shards = [("train", f"train-0000{i}-of-00002.tfrecord.gz", None) for i in (1, 0)]
    built = manifest.build(config, plan, shards, [(("train", "a"), 2)], [])
    assert built["splits"]["train"]["shards"] == ["train-00000-of-00002.tfrecord.gz",
                                                  "train-00001-of-00002.tfrecord.gz"]


def test_the_manifest_is_the_dataset_model_and_reads_back_as_it():
    config = PrepareConfig(input="in", output="out", spec=ImageSpec(height=8, width=8), compression="none")
    plan = RunPlan(labels=["a", "b"], num_shards={"train": 1}, listed=3, skipped=0, sink="streaming")
    shards = [("train", "train-00000-of-00001.tfrecord", 3)]
    built = manifest.build(config, plan, shards, [(("train", "a"), 2), (("train", "b"), 1)], [])
    info = dataset.DatasetInfo.from_json(built, "out", "out/manifest.json")
    assert {k: built[k] for k in info.to_json()} == info.to_json()
    assert built["image"] == {"height": 8, "width": 8, "channels": 3, "format": "jpeg",
                              "resize_mode": "center_crop"}
    assert info.splits["train"].files == ("out/train-00000-of-00001.tfrecord",)
    assert (info.compression, info.splits["train"].shard_num_examples) == ("NONE", (3,))
    assert (dataset.COMPRESSIONS["gzip"].beam_type, dataset.COMPRESSIONS["none"].beam_type) == (
        CompressionTypes.GZIP, CompressionTypes.UNCOMPRESSED)


def test_each_shards_sha256_and_size_are_listed_only_where_every_shard_of_the_split_has_them():
    config = PrepareConfig(input="in", output="out", spec=ImageSpec())
    plan = RunPlan(labels=["a"], num_shards={"train": 2, "validation": 2}, listed=4, skipped=0, sink="shuffle")
    names = {split: [f"{split}-0000{i}-of-00002.tfrecord.gz" for i in (0, 1)] for split in plan.num_shards}
    shards = [("train", names["train"][1], 1, 20, "b" * 64), ("train", names["train"][0], 1, 10, "a" * 64),
              ("validation", names["validation"][0], 1, 30, "c" * 64), ("validation", names["validation"][1], 1)]
    built = manifest.build(config, plan, shards, [(("train", "a"), 2), (("validation", "a"), 2)], [])
    train, validation = built["splits"]["train"], built["splits"]["validation"]
    assert (train["shard_bytes"], train["shard_sha256"]) == ([10, 20], ["a" * 64, "b" * 64])  # in shards' order
    assert "shard_sha256" not in validation and "shard_bytes" not in validation  # one shard's is not known
    info = dataset.DatasetInfo.from_json(built, "out", "out/manifest.json")
    assert info.splits["train"].shard_sha256 == ("a" * 64, "b" * 64) and info.splits["validation"].shard_sha256 is None
    train["shard_sha256"].pop()
    with pytest.raises(DatasetError, match="split 'train' lists 2 shards but 1 shard_sha256"):
        dataset.DatasetInfo.from_json(built, "out", "out/manifest.json")


def test_files_are_dealt_to_shards_evenly_in_key_order(tmp_path):
    make_tree(tmp_path / "in", {"a": 37, "b": 26}, size=(8, 8))
    listing = list_tree(str(tmp_path / "in"))
    plan = RunPlan(labels=listing.labels, num_shards={"train": 4}, listed=63, skipped=0,
                         sink="streaming")
    write_work_files(listing, plan, str(tmp_path / "work"))
    shards = [[FileEntry.from_json(line).relpath for line in
               (tmp_path / "work" / layout.shard_listing_name("train", i)).read_text().splitlines()]
              for i in range(4)]
    assert sorted(len(s) for s in shards) == [15, 16, 16, 16]
    assert sorted(e for s in shards for e in s) == sorted(e.relpath for e in listing.entries())
    assert all(s == sorted(s, key=order_key) for s in shards)


def test_the_skipped_files_publish_only_when_their_count_is_the_plans(tmp_path):
    """skipped.jsonl goes from the run's folder into the dataset as the launcher wrote it, and a
    count other than the plan's stops the manifest step before anything is published."""
    make_tree(tmp_path / "in", {"a": 2}, size=(8, 8))
    (tmp_path / "in" / "a" / "notes.txt").write_text("x")
    (tmp_path / "in" / "loose.jpg").write_text("x")
    listing = list_tree(str(tmp_path / "in"))
    plan = RunPlan(labels=listing.labels, num_shards={"train": 1}, listed=2, skipped=2, sink="streaming")
    work, out = tmp_path / "work", tmp_path / "out"
    write_work_files(listing, plan, str(work))
    skipped.check(str(work), plan.skipped)
    out.mkdir()
    skipped.publish(str(work), str(out), plan.skipped)
    assert (out / layout.SKIPPED).read_bytes() == (work / layout.SKIPPED).read_bytes()
    assert (out / layout.SKIPPED).read_text().splitlines() == [
        skipped.line(str(tmp_path / "in"), "a/notes.txt", "not an image file"),
        skipped.line(str(tmp_path / "in"), "loose.jpg", "image outside the label folders")]
    with pytest.raises(DatasetError, match="names 2 skipped files but the listing skipped 3"):
        skipped.check(str(work), 3)


def test_never_more_shards_than_examples():
    # 2 huge records would fill 11 shards of 150 MB by size; one worker each is plenty.
    assert sharding.choose_num_shards(2, 805e6, 150, multiple_of=1) == 2
    # Rounding up to the workers stops at the examples: a shard with no record helps nobody.
    assert sharding.choose_num_shards(2, 805e6, 150, multiple_of=4) == 2
    assert sharding.choose_num_shards(1, 1e3, 150, multiple_of=2) == 1
    assert sharding.choose_num_shards(6, 1e3, 150, multiple_of=4) == 4
    assert sharding.choose_num_shards(1000, 1e6, 150, multiple_of=1) == 7


# A 224 px JPEG record as estimated_record_bytes makes it (23 KB): 5,000 of them are 113 MB, one shard by size.
JPEG_224 = 224 * 224 * 3 * 0.15


def test_a_resumable_runs_shards_each_hold_a_small_share_of_it():
    """A stop keeps only whole shards, and each local worker writes one at a time: a plan of
    about two shards of 150 MB kept nothing of a run stopped halfway. Shards now hold at most
    1/SHARDS_PER_WORKER of a worker's share of the run."""
    cap = sharding.max_shard_images(5000, 2)
    assert cap == 157  # 5,000 / (16 shards x 2 workers), rounded up
    assert sharding.choose_num_shards(5000, JPEG_224, 150, multiple_of=2) == 2  # not resumable: by size
    assert sharding.choose_num_shards(5000, JPEG_224, 150, multiple_of=2, max_images=cap) == 32
    # The run's validation split gets shards of the same size, not as many.
    assert sharding.choose_num_shards(500, JPEG_224, 150, multiple_of=2, max_images=cap) == 4
    # More workers, more shards, so that each still has 16 to write...
    assert sharding.choose_num_shards(50_000, JPEG_224, 150, 8, sharding.max_shard_images(50_000, 8)) == 128
    # ...but none of fewer than MIN_RESUMABLE_SHARD_IMAGES: a small run is done again in seconds.
    assert sharding.max_shard_images(5000, 16) == sharding.MIN_RESUMABLE_SHARD_IMAGES == 32
    assert sharding.choose_num_shards(5000, JPEG_224, 150, 16, sharding.max_shard_images(5000, 16)) == 160
    assert sharding.choose_num_shards(100, JPEG_224, 150, 2, sharding.max_shard_images(100, 2)) == 4
    assert sharding.choose_num_shards(40, JPEG_224, 150, 2, sharding.max_shard_images(40, 2)) == 2


def test_a_large_tree_keeps_shards_near_the_target_size():
    """Where the target size already makes shards small enough, the plan is the size's."""
    images, workers = 2_000_000, 16  # 45 GB of 224 px JPEGs
    by_size = sharding.choose_num_shards(images, JPEG_224, 150, workers)
    assert by_size == 304  # 302 by size, rounded up to the workers: 148 MB each
    cap = sharding.max_shard_images(images, workers)
    assert sharding.choose_num_shards(images, JPEG_224, 150, workers, max_images=cap) == by_size


@pytest.mark.parametrize("sink", ["streaming", "shuffle"])
def test_only_a_resumable_run_plans_shards_for_stopping(tmp_path, sink):
    """The plan takes the whole run's images (both splits) and the local workers; the shuffle
    sink keeps nothing of a stopped run, so its shards stay near the target size."""
    from beam_prep.write.run.pipeline import plan_run as plan

    make_tree(tmp_path / "in", {"a": 700, "b": 500}, size=(8, 8))
    config = PrepareConfig(input=str(tmp_path / "in"), output=str(tmp_path / "out"),
                           spec=ImageSpec(height=224, width=224), sink=sink, validation_percent=10)
    listing, planned = plan(config, PipelineOptions(["--direct_num_workers=2",
                                                     "--direct_running_mode=multi_processing"]))
    listing.close()
    if sink == "shuffle":
        assert planned.num_shards == {"train": 1, "validation": 1}
        return
    largest = {split: -(-planned.split_counts[split] // n) for split, n in planned.num_shards.items()}
    assert max(largest.values()) <= sharding.max_shard_images(1200, 2) == 38, planned
    assert all(n % 2 == 0 for n in planned.num_shards.values()) and sum(planned.num_shards.values()) >= 32


SHARD_COUNTS = {"train": 12, "validation": 3, "test": 1}


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_beams_sink_names_shards_as_shard_name_does(tmp_path, compression):
    """The shuffle sink's files (Beam's WriteToTFRecord with SHARD_TEMPLATE) are the names the
    manifest lists and publish moves (shard_name)."""
    import apache_beam as beam
    from apache_beam.io.tfrecordio import WriteToTFRecord

    suffix, compression_type, _ = layout.COMPRESSIONS[compression]
    with beam.Pipeline(runner="BundleBasedDirectRunner") as p:
        for split, count in SHARD_COUNTS.items():
            _ = (p
                 | f"Records[{split}]" >> beam.Create([b"%d" % i for i in range(2 * count)])
                 | f"Write[{split}]" >> WriteToTFRecord(str(tmp_path / split), file_name_suffix=suffix,
                                                        num_shards=count, shard_name_template=layout.SHARD_TEMPLATE,
                                                        compression_type=compression_type))
    expected = [layout.shard_name(split, i, count, suffix)
                for split, count in SHARD_COUNTS.items() for i in range(count)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(expected)
    (tmp_path / "train-notes.txt").write_text("not a shard")
    assert [path.rsplit("/", 1)[-1] for path in layout.existing_dataset_files(str(tmp_path))] == sorted(expected)


def test_shard_names_for_any_index_and_count():
    """Beam's formatting of SHARD_TEMPLATE, for counts past its five digits too."""
    from apache_beam.coders import BytesCoder
    from apache_beam.io.filebasedsink import FileBasedSink

    sink = FileBasedSink("out/train", BytesCoder(), file_name_suffix=".tfrecord.gz",
                         shard_name_template=layout.SHARD_TEMPLATE)
    for index, count in [(0, 1), (7, 16), (99_999, 100_000), (123_456, 200_000)]:
        assert sink._get_final_name(index, count) == "out/" + layout.shard_name("train", index, count, ".tfrecord.gz")
    assert layout.shard_name("train", 3, 16, ".tfrecord.gz") == "train-00003-of-00016.tfrecord.gz"
