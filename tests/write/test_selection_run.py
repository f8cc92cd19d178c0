"""--stratify, --max_per_class and --max_failures through the command, as a user runs it: each
record in the split the listing chose, the capped files named in skipped.jsonl, the counts adding
up, and a failure budget that fails the command after the dataset is written. Two runs in all."""
from __future__ import annotations

import json
import pathlib
import tarfile

import pytest
from helpers import encode, make_tree, run_prepare

from beam_prep.tools.sample import picture
from beam_prep.write.plan.listing import list_tree
from beam_prep.write.plan.selection import SKIP_OVER_CAP, validation_count

pytestmark = pytest.mark.slow

SIZES = {"a": 1, "b": 2, "c": 3, "d": 12, "e": 50, "f": 101}
BROKEN = {"broken/truncated_0.jpg", "broken/truncated_1.jpg", "broken/garbage_0.jpg", "broken/garbage_1.jpg"}
CAP = 40
PERCENT = 25
FLAGS = ("--validation_percent", str(PERCENT), "--stratify", "--max_per_class", str(CAP), "--image_size", "16",
         "--file_format", "webdataset", "--num_shards", "1", "--direct_num_workers", "2")


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("selection") / "tree"
    make_tree(root, SIZES, size=(24, 16))
    (root / "broken").mkdir()
    for i in range(2):
        whole = encode(picture(500 + i, 64, 48))
        (root / "broken" / f"truncated_{i}.jpg").write_bytes(whole[:len(whole) // 3])
        (root / "broken" / f"garbage_{i}.jpg").write_bytes(b"not an image at all " * (i + 1))
    return root


@pytest.fixture(scope="module")
def runs(tree, tmp_path_factory) -> dict[str, tuple[pathlib.Path, object]]:
    """Over its budget of 3 failures (exit 1), then the same selection within a budget of 5% (exit 0)."""
    work = tmp_path_factory.mktemp("selection_out")
    done = {}
    for name, budget in (("over", "3"), ("within", "5%")):
        out = work / name
        done[name] = out, run_prepare("--input", str(tree), "--output", str(out), *FLAGS, "--max_failures", budget)
    return done


def records_by_split(out: pathlib.Path) -> dict[str, set[str]]:
    """Each split's records' file names, read from the tar shards (each sample's json names its file)."""
    manifest = json.loads((out / "manifest.json").read_text())
    found = {}
    for split, info in manifest["splits"].items():
        names = set()
        for shard in info["shards"]:
            with tarfile.open(out / shard) as tar:
                for member in tar.getmembers():
                    if member.name.endswith(".json"):
                        names.add(json.loads(tar.extractfile(member).read())["filename"])
        found[split] = names
    return found


def test_over_the_budget_the_dataset_is_written_and_the_command_fails_with_one_line(runs):
    out, result = runs["over"]
    assert result.returncode == 1, result.stderr
    listed = sum(min(n, CAP) for n in SIZES.values()) + len(BROKEN)
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: 4 files of {listed} failed ({100 * 4 / listed:.3g}%), more than --max_failures 3 allows: the "
        f"dataset was written all the same; see {out}/errors.jsonl")
    assert result.stdout.startswith(f"beam-prep: {listed - 4:,} of {listed:,} images written"), result.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert {json.loads(line)["relpath"] for line in (out / "errors.jsonl").read_text().splitlines()} == BROKEN
    assert manifest["options"]["max_failures"] == "3"


def test_within_the_budget_the_command_succeeds(runs):
    out, result = runs["within"]
    assert result.returncode == 0, result.stderr
    assert "max_failures" not in result.stderr
    assert json.loads((out / "manifest.json").read_text())["options"]["max_failures"] == "5%"


def test_counts_add_up_and_the_capped_files_are_named(runs, tree):
    out, _ = runs["over"]
    manifest = json.loads((out / "manifest.json").read_text())
    over_cap = sum(max(n - CAP, 0) for n in SIZES.values())
    counts = manifest["counts"]
    assert counts == {"listed": sum(min(n, CAP) for n in SIZES.values()) + len(BROKEN),
                      "written": sum(min(n, CAP) for n in SIZES.values()), "failed": 4, "skipped": over_cap}
    assert manifest["skipped_by_reason"] == {SKIP_OVER_CAP: over_cap}
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert {row["reason"] for row in skipped} == {SKIP_OVER_CAP}
    written = set().union(*records_by_split(out).values())
    on_disk = {p.relative_to(tree).as_posix() for p in tree.glob("*/*.jpg")}
    assert {row["relpath"] for row in skipped} | written | BROKEN == on_disk
    assert not {row["relpath"] for row in skipped} & written
    assert (manifest["options"]["stratify"], manifest["options"]["max_per_class"]) == (True, CAP)


def test_every_label_gets_its_share_of_validation_and_each_record_is_in_the_listings_split(runs, tree):
    out, _ = runs["over"]
    manifest = json.loads((out / "manifest.json").read_text())
    for label, n in SIZES.items():
        validation = manifest["splits"]["validation"]["class_counts"][label]
        assert validation == validation_count(min(n, CAP), PERCENT), label
        assert validation + manifest["splits"]["train"]["class_counts"][label] == min(n, CAP)
    with list_tree(str(tree), validation_percent=PERCENT, stratify=True, max_per_class=CAP) as listing:
        chosen = {split: {e.relpath for e in listing.entries() if e.split == split and e.relpath not in BROKEN}
                  for split in ("train", "validation")}
    assert records_by_split(out) == chosen


def test_a_rerun_puts_every_file_in_the_same_split(runs):
    assert records_by_split(runs["over"][0]) == records_by_split(runs["within"][0])


def test_a_stratified_validation_shrunk_by_the_drop_is_said_with_its_counts(tmp_path):
    """One class of 8 byte-identical files, another of 8 photos: --stratify gives each 2 of 8 for
    validation (25%); the drop leaves out both of the first class's, as copies of its training files."""
    root, out = tmp_path / "tree", tmp_path / "out"
    make_tree(root, {"photos": 8}, size=(24, 16))
    (root / "copies").mkdir()
    for i in range(8):
        (root / "copies" / f"same_{i}.jpg").write_bytes((root / "photos" / "img_000.jpg").read_bytes())
    flags = ("--input", str(root), "--image_size", "16", "--validation_percent", "25", "--stratify",
             "--direct_running_mode", "in_memory")
    result = run_prepare(*flags, "--output", str(out), "--cross_split_duplicates", "drop")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    validation = manifest["splits"]["validation"]
    assert (validation["num_examples"], validation["class_counts"]) == (2, {"copies": 0, "photos": 2})
    assert manifest["duplicates"]["dropped_by_split"] == {"validation": 2}
    assert manifest["duplicates"]["dropped_by_class"] == {"validation": {"copies": 2}}
    assert ("warning: validation came out at 2 records of the 4 planned (14.3% of the records, not the 25% asked): "
            "2 copied an image of an earlier split and were left out") in result.stderr
    assert "classes that lost most of theirs: copies 2 of 2." in result.stderr
    # Reported, not dropped: validation keeps its plan, and nothing is said of it.
    kept = run_prepare(*flags, "--output", str(tmp_path / "kept"))
    assert kept.returncode == 0 and "came out at" not in kept.stderr, kept.stderr
