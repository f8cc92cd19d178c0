"""--cross_split_duplicates drop's choice, from duplicates.jsonl alone: which split of a group
is kept, what each file left out is named with, and skipped.jsonl's merge (the runs themselves:
test_drop_duplicates.py)."""
from __future__ import annotations

import json

from beam_prep.write.finish import drop
from beam_prep.write.plan import skipped
from beam_prep.write.shared import layout

X, Y, W, P, Q, M, N = (f"{i:x}" * 64 for i in range(1, 8))


def _exact(sha256: str, split: str, path: str, copies: int) -> dict:
    return {"kind": "exact", "sha256": sha256, "copies": copies, "split": split, "path": path}


def _near(group: int, sha256: str, phash: int, split: str, path: str) -> dict:
    return {"kind": "near", "group": group, "distance": 0, "group_distance": 0, "sha256": sha256,
            "phash": f"{phash:016x}", "split": split, "path": path}


LINES = [
    _exact(X, "test", "/r/c/x3.jpg", 3), _exact(X, "train", "/r/a/x.jpg", 3), _exact(X, "validation", "/r/b/x2.jpg", 3),
    _exact(Y, "test", "/r/t/y.jpg", 2), _exact(Y, "validation", "/r/v/y.jpg", 2),
    _exact(W, "train", "/r/a/w.jpg", 2), _exact(W, "train", "/r/a/w2.jpg", 2),  # within a split: kept
    _near(1, P, 0b1111, "train", "/r/a/p.jpg"), _near(1, X, 0b0000, "train", "/r/a/x.jpg"),
    _near(1, Q, 0b0001, "validation", "/r/b/q.jpg"), _near(1, X, 0b0000, "validation", "/r/b/x2.jpg"),
    _near(2, M, 0, "validation", "/r/v/m.jpg"), _near(2, N, 0b111, "test", "/r/t/n.jpg"),
]


def test_a_group_keeps_train_else_validation_and_names_each_file_left_out_once(tmp_path):
    lines_file = tmp_path / "duplicates.jsonl"
    lines_file.write_text("".join(json.dumps(line) + "\n" for line in LINES))
    dropping = drop.choose(str(lines_file), "/r")
    try:
        rows = [(path, json.loads(line)) for path, line in dropping.lines()]
        assert [path for path, _ in rows] == ["/r/b/q.jpg", "/r/b/x2.jpg", "/r/c/x3.jpg", "/r/t/n.jpg", "/r/t/y.jpg"]
        assert [row for _, row in rows] == [
            {"path": "/r/b/q.jpg", "relpath": "b/q.jpg", "reason": "near copy of an image in train",
             "duplicate_of": "/r/a/x.jpg", "distance": 1},  # the closest train file
            {"path": "/r/b/x2.jpg", "relpath": "b/x2.jpg", "reason": "copy of an image in train",
             "duplicate_of": "/r/a/x.jpg"},  # in an exact and a near group: named for its exact copy
            {"path": "/r/c/x3.jpg", "relpath": "c/x3.jpg", "reason": "copy of an image in train",
             "duplicate_of": "/r/a/x.jpg"},
            {"path": "/r/t/n.jpg", "relpath": "t/n.jpg", "reason": "near copy of an image in validation",
             "duplicate_of": "/r/v/m.jpg", "distance": 3},
            {"path": "/r/t/y.jpg", "relpath": "t/y.jpg", "reason": "copy of an image in validation",
             "duplicate_of": "/r/v/y.jpg"}]
        assert dropping.to_json() == {"dropped": 5, "dropped_by_reason": {
            "copy of an image in train": 2, "copy of an image in validation": 1,
            "near copy of an image in train": 1, "near copy of an image in validation": 1}}
        held = {(split, sha256) for split in ("train", "validation", "test") for sha256 in (X, Y, W, P, Q, M, N)
                if dropping.holds(split, sha256)}
        assert held == {("validation", Q), ("validation", X), ("test", X), ("test", N), ("test", Y)}
    finally:
        dropping.close()


def test_the_kept_split_is_train_then_validation_then_the_first_by_name():
    assert drop.kept_split(["validation", "train", "test"]) == "train"
    assert drop.kept_split(["test", "validation"]) == "validation"
    assert drop.kept_split(["test", "extra"]) == "extra"


def test_skipped_jsonl_merges_the_files_left_out_by_path(tmp_path):
    work, output = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    output.mkdir()
    listed = [skipped.line("/r", "a/notes.txt", "not an image file"), skipped.line("/r", "c/.DS_Store", "hidden")]
    (work / layout.SKIPPED).write_text("".join(line + "\n" for line in listed))
    added = [("/r/b/x.jpg", skipped.line("/r", "b/x.jpg", "copy of an image in train", duplicate_of="/r/a/x.jpg"))]
    skipped.publish(str(work), str(output), 2, added)
    assert (output / layout.SKIPPED).read_text().splitlines() == [listed[0], added[0][1], listed[1]]
    skipped.publish(str(work), str(tmp_path), 0, added)  # nothing skipped by the listing
    assert (tmp_path / layout.SKIPPED).read_text().splitlines() == [added[0][1]]


def test_without_a_root_each_file_is_named_as_given(tmp_path):
    """WriteImageDataset's elements have no --input: a path, absolute or not, is both path and relpath."""
    lines_file = tmp_path / "duplicates.jsonl"
    lines_file.write_text("".join(json.dumps(line) + "\n" for line in [
        _exact(X, "train", "/data/a.jpg", 3), _exact(X, "validation", "/data/b.jpg", 3),
        _exact(X, "validation", "c.jpg", 3)]))
    dropping = drop.choose(str(lines_file), "")
    try:
        assert [(row["path"], row["relpath"]) for row in (json.loads(line) for _, line in dropping.lines())] == [
            ("/data/b.jpg", "/data/b.jpg"), ("c.jpg", "c.jpg")]
    finally:
        dropping.close()
