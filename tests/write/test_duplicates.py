"""Exact duplicates among the written records: counted within and across splits, listed in
duplicates.jsonl, on both sinks and from WriteImageDataset; the finder's own edge cases and
its memory."""
from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
import tracemalloc

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from helpers import encode, make_tree, prepare_here, read_split, run_prepare

from beam_prep.errors import CrossSplitLeakage, OptionsError
from beam_prep.tools.sample import picture
from beam_prep.write.finish import duplicates
from beam_prep.write.plan.listing import split_for
from beam_prep.write.run.pipeline import local_runner
from beam_prep.write.run.write_image_dataset import WriteImageDataset
from beam_prep.write.shared import spill
from pipelines import inspect_output

PERCENT = 40


def _name_in(split: str, folder: str, stem: str) -> str:
    """A file name under ``folder`` that the stable hash puts in ``split``."""
    return next(f"{folder}/{stem}_{i}.jpg" for i in range(1000)
                if split_for(f"{folder}/{stem}_{i}.jpg", PERCENT) == split)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> tuple[pathlib.Path, set[tuple[str, int, str, str]]]:
    """Two labels; one image copied into its own split (twice), another copied into the other
    split. Returns the tree and the duplicates.jsonl rows expected: (sha256, copies, split, path)."""
    root = tmp_path_factory.mktemp("dups") / "tree"
    make_tree(root, {"a": 6, "b": 6}, size=(24, 20))
    originals = sorted(p.relative_to(root).as_posix() for p in root.glob("*/*.jpg"))
    in_train = [r for r in originals if split_for(r, PERCENT) == "train"]
    within, across = in_train[0], in_train[1]
    copies = {within: [_name_in("train", "b", "within"), _name_in("train", "a", "again")],
              across: [_name_in("validation", "b", "across")]}
    expected = set()
    for original, names in copies.items():
        for name in names:
            shutil.copyfile(root / original, root / name)
        sha256 = hashlib.sha256((root / original).read_bytes()).hexdigest()
        for relpath in (original, *names):
            expected.add((sha256, 1 + len(names), split_for(relpath, PERCENT), str(root / relpath)))
    return root, expected


def _rows(out: pathlib.Path) -> list[tuple[str, int, str, str]]:
    return [(r["sha256"], r["copies"], r["split"], r["path"])
            for r in map(json.loads, (out / "duplicates.jsonl").read_text().splitlines())]


@pytest.mark.parametrize("sink", ["streaming", "shuffle"])
def test_copies_within_and_across_splits_are_counted_listed_and_still_written(tree, tmp_path, sink):
    root, expected = tree
    out = tmp_path / "out"
    result = run_prepare("--input", str(root), "--output", str(out), "--image_size", "16", "--sink", sink,
                         "--validation_percent", str(PERCENT), "--direct_num_workers", "2")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    found = manifest["duplicates"]
    # 3 files of one image in train (2 extra, within), 2 of another across train and validation (1).
    assert {k: found[k] for k in ("images", "extra_copies", "within_split", "across_splits")} == \
        {"images": 2, "extra_copies": 3, "within_split": 2, "across_splits": 1}
    rows = _rows(out)
    assert set(rows) == expected and len(rows) == len(expected)
    groups = [sha for sha, *_ in rows]
    assert groups == sorted(groups, key=groups.index) and len(set(groups)) == 2  # each group's lines together
    assert found["examples"][0]["copies"] == 2  # the copy across splits comes first
    assert {(f["split"], f["path"]) for f in found["examples"][0]["files"]} == \
        {(split, path) for _, copies, split, path in expected if copies == 2}
    # Written all the same, and each line's sha256 is its record's.
    stored = {r["image/filename"].decode(): r["image/key/sha256"].decode()
              for split in manifest["splits"] for r in read_split(out, split)}
    assert len(stored) == manifest["counts"]["written"] == manifest["counts"]["listed"] == 15
    assert {(sha, str(root / name)) for name, sha in stored.items() if sha in groups} == \
        {(sha, path) for sha, _, _, path in expected}
    assert "  duplicates: 3 extra copies of 2 images, 1 across splits (written all the same; " \
           "see duplicates.jsonl)" in result.stdout.splitlines()


def test_inspect_shows_the_copies_across_splits_first(tree, tmp_path, capsys):
    root, expected = tree
    out = tmp_path / "out"
    prepare_here("--input", str(root), "--output", str(out), "--image_size", "16", "--validation_percent", str(PERCENT))
    assert inspect_output.main([str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index(f"duplicates: 3 extra copies of 2 images (2 within a split, 1 across splits: "
                     f"train/validation 1; every one in {out}/duplicates.jsonl)")
    across = sorted((split, path) for _, copies, split, path in expected if copies == 2)
    sha256 = next(sha for sha, copies, _, _ in expected if copies == 2)
    # Hash files are read in name order (train's shards before validation's), each in record order.
    assert lines[at + 1] == f"  {sha256[:12]} (2 files): " + ", ".join(f"{s} {p}" for s, p in across)
    assert lines[at + 2].startswith("  ") and "(3 files)" in lines[at + 2]
    assert inspect_output.main([str(out), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["duplicates"]
    assert shown == json.loads((out / "manifest.json").read_text())["duplicates"]


def test_a_dataset_without_copies_says_none(tmp_path):
    make_tree(tmp_path / "in", {"a": 3}, size=(24, 20))
    result = run_prepare("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--image_size", "16",
                         "--direct_running_mode", "in_memory")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["duplicates"] == {"images": 0, "extra_copies": 0, "within_split": 0, "across_splits": 0,
                                      "split_pairs": {}, "examples": [],
                                      "label_conflicts": {"images": 0, "files": 0, "examples": []}, "near": {
                                          "distance": 6, "groups": 0, "files": 0, "within_split": 0,
                                          "across_splits": 0, "files_across": 0, "split_pairs": {},
                                          "examples": [], "label_conflicts": 0}}
    assert (tmp_path / "out" / "duplicates.jsonl").read_text() == ""
    assert "duplicates" not in result.stdout


def _write_elements(out: pathlib.Path, elements: list, **options) -> None:
    pipeline_options = PipelineOptions([], direct_running_mode="in_memory")
    with beam.Pipeline(runner=local_runner(pipeline_options), options=pipeline_options) as p:
        _ = (p | beam.Create(elements)
             | WriteImageDataset(str(out), ["cat", "dog"], image_size=16, splits=["train", "validation"],
                                 num_shards=1, **options))


def test_write_image_dataset_reports_copies_among_its_elements_drops_or_fails_on_those_across_splits(tmp_path):
    image = encode(picture(7, 24, 20), "PNG")
    other = encode(picture(8, 24, 20), "PNG")
    elements = [(image, "cat", "train", "x/1.png"), (image, "dog", "validation", "x/2.png"),
                (image, "cat", "train", "x/3.png"), (other, "cat", "train", "x/4.png")]
    _write_elements(tmp_path / "out", elements)
    found = json.loads((tmp_path / "out" / "manifest.json").read_text())["duplicates"]
    assert {k: found[k] for k in ("images", "extra_copies", "within_split", "across_splits")} == \
        {"images": 1, "extra_copies": 2, "within_split": 1, "across_splits": 1}
    sha256 = hashlib.sha256(image).hexdigest()
    assert sorted(_rows(tmp_path / "out")) == sorted(
        [(sha256, 3, "train", "x/1.png"), (sha256, 3, "validation", "x/2.png"), (sha256, 3, "train", "x/3.png")])

    # drop: the validation copy is left out and named, the counts add up.
    _write_elements(tmp_path / "dropped", elements, cross_split_duplicates="drop")
    manifest = json.loads((tmp_path / "dropped" / "manifest.json").read_text())
    assert (manifest["counts"]["written"], manifest["counts"]["dropped"], manifest["splits"]["validation"]
            ["num_examples"]) == (3, 1, 0)
    (skipped,) = [json.loads(line) for line in (tmp_path / "dropped" / "skipped.jsonl").read_text().splitlines()]
    assert (skipped["path"], skipped["reason"]) == ("x/2.png", "copy of an image in train")

    # fail: the job fails once the dataset is written, naming why; without a copy across splits it does not.
    with pytest.raises(CrossSplitLeakage, match=r"--cross_split_duplicates fail: 1 group of copies across splits"):
        _write_elements(tmp_path / "failed", elements, cross_split_duplicates="fail")
    assert json.loads((tmp_path / "failed" / "manifest.json").read_text())["counts"]["written"] == 4
    _write_elements(tmp_path / "clean", elements[:1] + elements[2:], cross_split_duplicates="fail")
    with pytest.raises(OptionsError, match="cross_split_duplicates must be one of report, fail, drop"):
        WriteImageDataset(str(tmp_path / "x"), ["cat"], cross_split_duplicates="remove")


# The finder itself, on hash files written here.

def _write(path: pathlib.Path, rows: list[tuple[str, str, str]]) -> str:
    path.write_text("".join(duplicates.hash_line(*row) + "\n" for row in rows))
    return str(path)


def test_a_prefix_two_contents_share_is_no_copy_and_their_own_copies_still_count(tmp_path):
    same_prefix = "0123456789abcdef"
    x, y = same_prefix + "0" * 48, same_prefix + "1" * 48
    files = [_write(tmp_path / "h1", [(x, "train", "/x"), (y, "train", "/y1")]),
             _write(tmp_path / "h2", [(y, "validation", "/y2")])]
    found = duplicates.find(files, 10)
    try:
        assert found.to_json()["extra_copies"] == 1 and found.across_splits == 1 and found.images == 1
        lines = [json.loads(line) for line in open(found.lines_file)]
        assert [(r["sha256"], r["path"]) for r in lines] == [(y, "/y1"), (y, "/y2")]
    finally:
        found.close()


def test_a_group_larger_than_a_sort_bucket_comes_back_whole_and_in_file_order(tmp_path, monkeypatch):
    monkeypatch.setattr(spill, "_BUCKET_ROWS", 4)  # many buckets, each far smaller than the group
    monkeypatch.setattr(spill, "_BUFFERED_ROWS", 3)
    big, small = hashlib.sha256(b"big").hexdigest(), hashlib.sha256(b"small").hexdigest()
    rows = [(big, "train", f"/big/{i:03d}") for i in range(50)] + [(small, "test", "/s1"), (small, "test", "/s2")]
    rows += [(hashlib.sha256(str(i).encode()).hexdigest(), "train", f"/u{i}") for i in range(30)]
    found = duplicates.find([_write(tmp_path / "h", rows)], len(rows))
    try:
        lines = [json.loads(line) for line in open(found.lines_file)]
        assert [r["path"] for r in lines if r["sha256"] == big] == [f"/big/{i:03d}" for i in range(50)]
        assert {r["copies"] for r in lines if r["sha256"] == big} == {50}
        assert (found.images, found.extra_copies, found.within_split, found.across_splits) == (2, 50, 50, 0)
        assert [len(e["files"]) for e in found.examples] == [duplicates.EXAMPLES, 2]
    finally:
        found.close()


def test_more_lines_than_records_listed_is_an_error(tmp_path):
    sha = hashlib.sha256(b"x").hexdigest()
    with pytest.raises(Exception, match="more than 1 records"):
        duplicates.find([_write(tmp_path / "h", [(sha, "train", "/a"), (sha, "train", "/b")])], 1)


def _peak_bytes(tmp_path: pathlib.Path, records: int) -> int:
    """Peak bytes allocated while finding copies among ``records`` lines, every record one of a pair
    (the most candidates there can be)."""
    rng = np.random.default_rng(records)
    path = tmp_path / f"h{records}"
    with open(path, "w") as f:
        for i in range(records // 2):
            digest = rng.bytes(32).hex()
            f.write(duplicates.hash_line(digest, "train", f"/a/{i:07d}.jpg") + "\n")
            f.write(duplicates.hash_line(digest, "validation", f"/b/{i:07d}.jpg") + "\n")
    tracemalloc.start()
    try:
        found = duplicates.find([str(path)], records)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found.images == records // 2 and found.across_splits == records // 2
    found.close()
    return peak


def test_memory_grows_by_at_most_40_bytes_a_record(tmp_path, monkeypatch):
    """The README's bound, where it is hardest: every record has a copy. What grows from 20,000
    to 60,000 records is what the records cost; the read buffer and the sort's buckets do not
    grow with them, and are made small here so that they do not hide it."""
    monkeypatch.setattr(duplicates, "_READ_BYTES", 1 << 14)
    monkeypatch.setattr(spill, "_BUCKET_ROWS", 4096)
    monkeypatch.setattr(spill, "_BUFFERED_ROWS", 256)
    small, large = _peak_bytes(tmp_path, 20_000), _peak_bytes(tmp_path, 60_000)
    assert (large - small) / 40_000 <= 40, (small, large)


# The same image under two labels: a contradiction, told apart from harmless copies.

def test_the_same_bytes_under_two_labels_are_a_conflict_and_each_row_names_its_label(tmp_path):
    conflict, harmless, older = "a" * 64, "b" * 64, "c" * 64
    files = [_write(tmp_path / "h1", [(conflict, "train", "/t/cat/x.jpg", None, "cat"),
                                      (harmless, "train", "/t/cat/y.jpg", None, "cat"),
                                      (older, "train", "/t/cat/z.jpg", None, "cat")]),
             _write(tmp_path / "h2", [(conflict, "validation", "/t/dog/x.jpg", None, "dog"),
                                      (harmless, "validation", "/t/cat/y2.jpg", None, "cat"),
                                      (conflict, "train", "/t/tags/x.jpg", None, ["dog", "cat"])])]
    # A line of an older run has no label: it contradicts nothing.
    (tmp_path / "h3").write_text(f"{older}\tvalidation\t-\t\"/t/dog/z.jpg\"\n")
    found = duplicates.find([*files, str(tmp_path / "h3")], 10, None)
    try:
        rows = [json.loads(line) for line in pathlib.Path(found.lines_file).read_text().splitlines()]
    finally:
        found.close()
    assert {(r["sha256"][0], r["label"] if not isinstance(r["label"], list) else tuple(r["label"]),
             r["labels_differ"]) for r in rows} == {
        ("a", "cat", True), ("a", "dog", True), ("a", ("cat", "dog"), True),
        ("b", "cat", False), ("c", "cat", False), ("c", None, False)}
    assert (found.images, found.extra_copies, found.label_conflicts, found.conflicting_files) == (3, 4, 1, 3)
    assert found.to_json()["label_conflicts"] == {"images": 1, "files": 3, "examples": [
        {"sha256": conflict, "copies": 3, "files": [
            {"split": "train", "label": "cat", "path": "/t/cat/x.jpg"},
            {"split": "validation", "label": "dog", "path": "/t/dog/x.jpg"},
            {"split": "train", "label": ["cat", "dog"], "path": "/t/tags/x.jpg"}]}]}


def test_a_copy_under_another_label_is_flagged_apart_from_harmless_copies(tmp_path, capsys):
    """Real copies: one image filed under cat and under dog, another twice under cat. The summary,
    the warning, the manifest, inspect, duplicates.jsonl and the leakage sheet tell them apart."""
    root, out = tmp_path / "in", tmp_path / "out"
    make_tree(root, {"cat": 5, "dog": 5}, size=(24, 20))
    shutil.copyfile(root / "cat" / "img_000.jpg", root / "dog" / "same_as_cat.jpg")
    shutil.copyfile(root / "cat" / "img_001.jpg", root / "cat" / "again.jpg")
    result = run_prepare("--input", str(root), "--output", str(out), "--image_size", "16",
                         "--direct_running_mode", "in_memory")
    assert result.returncode == 0, result.stderr
    cat, dog = str(root / "cat" / "img_000.jpg"), str(root / "dog" / "same_as_cat.jpg")
    assert "  same image under different labels: 1 image (2 files) (see the warning; " \
           "\"labels_differ\": true in duplicates.jsonl)" in result.stdout.splitlines()
    assert f"same image under different labels: 1 image with the same bytes filed under two labels or more " \
           f"(e.g. {cat} (cat) = {dog} (dog))" in result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["duplicates"]["images"], manifest["duplicates"]["label_conflicts"]["images"],
            manifest["duplicates"]["label_conflicts"]["files"]) == (2, 1, 2)
    rows = [json.loads(line) for line in (out / "duplicates.jsonl").read_text().splitlines()]
    assert sorted((r["path"], r["label"], r["labels_differ"]) for r in rows if r["kind"] == "exact") == sorted([
        (cat, "cat", True), (dog, "dog", True),
        (str(root / "cat" / "img_001.jpg"), "cat", False), (str(root / "cat" / "again.jpg"), "cat", False)])
    assert inspect_output.main([str(out)]) == 0
    shown = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(shown) if line.startswith("same image under different labels: 1 image"))
    assert shown[at + 1].endswith(f"(2 files): {cat} (cat), {dog} (dog)")
    from beam_prep.tools import leakage_sheet

    sheet = leakage_sheet.make_leakage_sheet(str(out), cell=40)  # one split: no leak, yet a contradiction
    assert sheet is not None and len(sheet.rows) == 1 and sheet.rows[0][0].endswith("labels differ")
    assert sorted(path for _, path in sheet.rows[0][1]) == sorted([cat, dog])
