"""--stratify and --max_per_class in the listing: each label's validation share and cap, chosen by a
stable hash, the same on every run; and --max_failures' budget. Pure logic and listings of trees of
empty files (nothing is decoded): the fast tier."""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import pathlib

import pytest

from beam_prep.errors import OptionsError
from beam_prep.write.images.imaging import ImageSpec
from beam_prep.write.journal import resume
from beam_prep.write.plan.config import PrepareConfig
from beam_prep.write.plan.failure_budget import exceeded, parse_max_failures
from beam_prep.write.plan.listing import list_tree
from beam_prep.write.plan.selection import SKIP_OVER_CAP, Placed, thresholds, validation_count
from beam_prep.write.shared import layout
from beam_prep.write.shared.hashing import split_and_cap_hashes, stable_hash

SIZES = {"one": 1, "two": 2, "three": 3, "dozen": 12, "fifty": 50, "many": 101}


@pytest.fixture
def tree(tmp_path) -> pathlib.Path:
    """Labels of 1 to 101 empty files with image names: listing never opens them."""
    root = tmp_path / "tree"
    for label, n in SIZES.items():
        (root / label).mkdir(parents=True)
        for i in range(n):
            (root / label / f"{label}_{i}.jpg").write_bytes(b"x" * (i + 1))
    return root


def splits_by_file(root: pathlib.Path, **options) -> dict[str, str]:
    with list_tree(str(root), **options) as listing:
        return {e.relpath: e.split for e in listing.entries()}


def per_label(splits: dict[str, str]) -> dict[str, collections.Counter]:
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for relpath, split in splits.items():
        counts[relpath.split("/")[0]][split] += 1
    return counts


@pytest.mark.parametrize("relpath,split_hash,cap_hash", [
    ("cat/1.jpg", 578668867960451635, 13742128484145179214),
    ("raw/bad\udcff.jpg", 15493024407272098372, 4650171441374723537),  # byte 0xff
])
def test_the_cap_hash_is_a_known_value_beside_the_split_hash(relpath, split_hash, cap_hash):
    """Pinned as test_listing pins the split hash: a file's cap must hold on every run and release."""
    assert split_and_cap_hashes(relpath) == (split_hash, cap_hash)
    assert stable_hash(relpath, "split") == split_hash


@pytest.mark.parametrize("files,percent,expected", [
    (1, 50, 0),  # a label of one file keeps it for training
    (2, 50, 1), (2, 90, 1),  # at least one training image
    (2, 25, 1),  # 0.5 rounds up
    (3, 10, 0), (3, 20, 1),
    (12, 25, 3), (12, 10, 1),
    (50, 25, 13), (101, 25, 25), (101, 10, 10),
    (7, 99.5, 6), (0, 10, 0),
])
def test_validation_count_is_the_rounded_share_with_a_training_image_kept(files, percent, expected):
    assert validation_count(files, percent) == expected


@pytest.mark.parametrize("percent", [10, 25, 50])
def test_stratified_every_label_is_within_one_image_of_its_share(tree, percent):
    counts = per_label(splits_by_file(tree, validation_percent=percent, stratify=True))
    for label, n in SIZES.items():
        validation = counts[label]["validation"]
        assert validation + counts[label]["train"] == n
        if n == 1:
            assert validation == 0, "a label of one file gives no validation image"
            continue
        assert counts[label]["train"] >= 1
        assert abs(validation - n * percent / 100) <= 0.5 + (validation == n - 1), (label, validation)


def test_stratified_validation_files_are_each_labels_lowest_split_hashes(tree):
    """The files chosen are a stable function of the paths: the k of lowest split hash, so a
    rerun, a resume and another machine all choose them."""
    splits = splits_by_file(tree, validation_percent=25, stratify=True)
    for label, n in SIZES.items():
        ranked = sorted((p for p in splits if p.startswith(f"{label}/")), key=lambda p: stable_hash(p, "split"))
        k = validation_count(n, 25)
        assert [splits[p] for p in ranked] == ["validation"] * k + ["train"] * (n - k), label


def test_stratified_is_the_same_on_a_rerun_and_moves_few_files(tree):
    first = splits_by_file(tree, validation_percent=25, stratify=True)
    assert splits_by_file(tree, validation_percent=25, stratify=True) == first
    hashed = splits_by_file(tree, validation_percent=25)
    moved = sum(first[p] != hashed[p] for p in first)
    # Each label moves only the files between its hash threshold and its share (about sqrt(n) at most).
    assert 0 < moved <= sum(math.ceil(math.sqrt(n)) for n in SIZES.values())


def test_max_per_class_keeps_each_labels_lowest_cap_hashes_and_skips_the_rest(tree):
    with list_tree(str(tree), max_per_class=10) as listing:
        kept = {e.relpath for e in listing.entries()}
        skipped = listing.skipped
        assert listing.listed == sum(min(n, 10) for n in SIZES.values())
        assert listing.skipped_by_reason() == {SKIP_OVER_CAP: sum(max(n - 10, 0) for n in SIZES.values())}
        assert listing.total_bytes == sum(int(p.rsplit("_", 1)[1][:-4]) + 1 for p in kept)
    assert set(skipped.values()) == {SKIP_OVER_CAP}
    for label, n in SIZES.items():
        ranked = sorted((f"{label}/{label}_{i}.jpg" for i in range(n)), key=lambda p: split_and_cap_hashes(p)[1])
        assert {p for p in kept if p.startswith(f"{label}/")} == set(ranked[:10])
        assert {p for p in skipped if p.startswith(f"{label}/")} == set(ranked[10:])


def test_max_per_class_keeps_the_hashed_splits_of_the_files_it_keeps(tree):
    capped_splits = splits_by_file(tree, validation_percent=30, max_per_class=10)
    whole = splits_by_file(tree, validation_percent=30)
    assert all(whole[p] == split for p, split in capped_splits.items())


def test_capped_and_stratified_shares_the_kept_files(tree):
    with list_tree(str(tree), validation_percent=25, stratify=True, max_per_class=10) as listing:
        splits = {e.relpath: e.split for e in listing.entries()}
        assert listing.split_counts() == {"validation": sum(validation_count(min(n, 10), 25) for n in SIZES.values()),
                                          "train": sum(min(n, 10) - validation_count(min(n, 10), 25)
                                                       for n in SIZES.values())}
    assert set(splits) == set(splits_by_file(tree, max_per_class=10))
    for label, n in SIZES.items():
        assert per_label(splits)[label]["validation"] == validation_count(min(n, 10), 25)
    assert splits_by_file(tree, validation_percent=25, stratify=True, max_per_class=10) == splits


def test_split_folders_keep_their_splits_and_a_cap_counts_a_label_across_them(tmp_path):
    for split, n in (("train", 8), ("validation", 4)):
        (tmp_path / split / "cat").mkdir(parents=True)
        for i in range(n):
            (tmp_path / split / "cat" / f"{i}.jpg").write_bytes(b"x")
    with list_tree(str(tmp_path), max_per_class=6) as listing:
        assert listing.listed == 6
        kept = {e.relpath: e.split for e in listing.entries()}
    assert all(relpath.split("/")[0] == split for relpath, split in kept.items())
    with pytest.raises(OptionsError, match="already has split folders"):  # --stratify needs a percent
        list_tree(str(tmp_path), validation_percent=10, stratify=True)


def test_labels_file_labels_missing_ones_are_capped_and_counted_as_unknown(tree):
    with list_tree(str(tree), labels=["many", "fifty"], max_per_class=5, validation_percent=40,
                   stratify=True) as listing:
        assert listing.unknown_labels == 1 + 2 + 3 + 5
        assert sum(listing.split_counts().values()) == 10
        assert listing.split_counts()["validation"] == 4


def test_a_table_is_stratified_and_capped_by_its_labels(tmp_path):
    root = tmp_path / "flat"
    root.mkdir()
    rows = []
    for i in range(30):
        (root / f"{i}.jpg").write_bytes(b"x")
        rows.append(f"{i}.jpg,{'cat' if i < 20 else 'dog'}\n")
    table = tmp_path / "table.csv"
    table.write_text("file_name,label\n" + "".join(rows))
    with list_tree(str(root), metadata=str(table), validation_percent=20, stratify=True,
                   max_per_class=15) as listing:
        counts = collections.Counter((e.label, e.split) for e in listing.entries())
        assert listing.skipped_by_reason() == {SKIP_OVER_CAP: 5}
    assert counts == {("cat", "validation"): 3, ("cat", "train"): 12, ("dog", "validation"): 2, ("dog", "train"): 8}


def test_a_multi_label_table_is_refused(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"x")
    table = tmp_path / "table.csv"
    table.write_text("file_name,labels\na.jpg,cat;dog\n")
    with pytest.raises(OptionsError, match=r"--max_per_class works per label, and --metadata .* gives images "
                                           r"several \(a labels column\): drop --max_per_class"):
        list_tree(str(tmp_path), metadata=str(table), max_per_class=3)
    with pytest.raises(OptionsError, match="--stratify works per label"):
        list_tree(str(tmp_path), metadata=str(table), validation_percent=10, stratify=True)


def test_thresholds_and_placing_as_pure_functions():
    paths = [f"c/{i}" for i in range(5)] + ["d/0", "d/1"]
    hashes = {p: stable_hash(p, "x") for p in paths}
    ids = {"c": 0, "d": 1}
    ranked = sorted((h, ids[p[0]]) for p, h in hashes.items())
    first_c = sorted((p for p in paths if p[0] == "c"), key=hashes.get)[:2]
    found, chosen = thresholds(ranked, [2, 0])
    assert found == {0: hashes[first_c[1]]} and chosen == {0: 2}
    # RankedRows in, ListedRows out: (order_key, relpath, cap_hash, split hash, label, size, labels, extra, stamp)
    rows = [(i, p, None, hashes[p], p[0], 1, None, None, "7") for i, p in enumerate(paths)]
    placed = {relpath: split for _, relpath, split, *_ in Placed(rows, None, {"c": found[0]})}
    assert {p for p, split in placed.items() if split == "validation"} == set(first_c)
    assert len(placed) == len(paths)
    kept = list(Placed([(0, p, hashes[p], "train", p[0], 1, None, None, "7") for p in paths],
                       {"c": (hashes[first_c[1]], first_c[1])}, None))
    assert {row[1] for row in kept} == set(first_c) | {"d/0", "d/1"}
    assert {row for row in kept if row[1] == "d/0"} == {(0, "d/0", "train", "d", 1, None, None, "7")}


def test_a_tie_at_the_threshold_puts_both_in_validation_and_is_counted():
    found, chosen = thresholds([(5, 0), (7, 0), (7, 0), (9, 0)], [2])
    assert found == {0: 7} and chosen == {0: 3}


@pytest.mark.parametrize("text,spelled", [("0", "0"), ("10", "10"), (" 007 ", "7"), ("2.5%", "2.5%"),
                                          ("100%", "100%"), ("0%", "0%"), (".5%", "0.5%")])
def test_max_failures_takes_a_count_or_a_percent(text, spelled):
    assert parse_max_failures(text) == spelled


@pytest.mark.parametrize("text", ["-1", "abc", "150%", "2.5", "", "10%%", "-5%", "1e3"])
def test_a_bad_max_failures_says_what_to_give(text):
    with pytest.raises(OptionsError) as e:
        parse_max_failures(text)
    assert str(e.value) == ("--max_failures must be a number of files (0 or more, e.g. 10) or a percent of the "
                            f"files listed from 0% to 100% (e.g. 2.5%), not {text!r}")


@pytest.mark.parametrize("budget,failed,listed,over", [
    (None, 99, 100, False), ("0", 0, 100, False), ("0", 1, 100, True), ("3", 3, 100, False), ("3", 4, 100, True),
    ("10%", 3, 30, False), ("10%", 4, 30, True), ("2.5%", 1, 40, False), ("2.5%", 2, 40, True),
    ("0%", 1, 1000, True), ("100%", 5, 5, False),
])
def test_the_budget_is_exceeded_only_past_it(budget, failed, listed, over):
    message = exceeded(budget, {"failed": failed, "listed": listed}, "OUT")
    assert (message is not None) == over


def test_the_budget_line_says_how_many_of_how_many_and_where_they_are():
    assert exceeded("10%", {"failed": 4, "listed": 30}, "/data/out") == (
        "4 files of 30 failed (13.3%), more than --max_failures 10% allows: the dataset was written "
        "all the same; see /data/out/errors.jsonl")
    assert exceeded("0", {"failed": 1, "listed": 1200}, "out").startswith("1 file of 1,200 failed (0.0833%)")


def test_a_resumed_run_needs_the_same_stratify_and_cap_but_not_the_same_budget(tmp_path):
    out = tmp_path / "out"
    config = PrepareConfig(input=str(tmp_path / "in"), output=str(out), spec=ImageSpec(), validation_percent=10,
                           stratify=True, max_per_class=5, max_failures="3")
    run_id = "20260101T000000Z-0123abcd"
    (out / ".beam-prep" / run_id).mkdir(parents=True)
    resume.write_run_record(layout.run_folder(str(out), run_id), resume.RunRecord(
        run_id, resume.record_options(config, None), False, {"run_id": run_id}))
    def options(**changed):
        return resume.record_options(dataclasses.replace(config, **changed), None)

    assert resume.find_resumable(str(out), [run_id], options()).run_id == run_id
    assert resume.find_resumable(str(out), [run_id], options(max_failures="10%")).run_id == run_id
    with pytest.raises(OptionsError, match="started with --max_per_class 5 where this run has 6"):
        resume.find_resumable(str(out), [run_id], options(max_per_class=6))
    with pytest.raises(OptionsError, match="started with --stratify true where this run has false"):
        resume.find_resumable(str(out), [run_id], options(stratify=False))
    assert json.loads((out / ".beam-prep" / run_id / "run.json").read_text())["options"]["stratify"] is True
