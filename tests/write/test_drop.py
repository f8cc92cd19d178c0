"""--cross_split_duplicates drop's choice, from duplicates.jsonl alone: which split of a group
is kept, that a file is left out only near a file kept (a chain in a group is not), what each
file left out is named with, and skipped.jsonl's merge (the runs themselves:
test_drop_duplicates.py)."""
from __future__ import annotations

import json

from beam_prep.write.finish import drop, shrunk_splits
from beam_prep.write.plan import skipped
from beam_prep.write.shared import layout, split_order

X, Y, W, P, Q, M, N = (f"{i:x}" * 64 for i in range(1, 8))
THRESHOLD = 4


def _exact(sha256: str, split: str, path: str, copies: int) -> dict:
    return {"kind": "exact", "sha256": sha256, "copies": copies, "split": split, "label": path.split("/")[-2:][0],
            "path": path}


def _near(group: int, sha256: str, phash: int, split: str, path: str) -> dict:
    return {"kind": "near", "group": group, "distance": 0, "group_distance": 0, "sha256": sha256,
            "phash": f"{phash:016x}", "split": split, "label": path.split("/")[-2:][0], "path": path}


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
    dropping = drop.choose(str(lines_file), "/r", THRESHOLD)
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
            "near copy of an image in train": 1, "near copy of an image in validation": 1},
            "dropped_by_split": {"validation": 2, "test": 3},
            "dropped_by_class": {"validation": {"b": 2}, "test": {"c": 1, "t": 2}}}  # per split, per label
        held = {(split, sha256) for split in ("train", "validation", "test") for sha256 in (X, Y, W, P, Q, M, N)
                if dropping.holds(split, sha256)}
        assert held == {("validation", Q), ("validation", X), ("test", X), ("test", N), ("test", Y)}
    finally:
        dropping.close()


def test_the_kept_split_is_train_then_validation_or_val_then_the_others_and_test_last():
    assert drop.kept_split(["validation", "train", "test"]) == "train"
    assert drop.kept_split(["test", "validation"]) == "validation"
    assert drop.kept_split(["test", "val"]) == "val"  # a tree's `val` folder: test loses its copy
    assert drop.kept_split(["test", "extra"]) == "extra"
    assert drop.kept_split(["zeta", "test"]) == "zeta"
    assert split_order.ordered(["test", "zeta", "val", "validation", "train", "extra", "test"]) == [
        "train", "validation", "val", "extra", "zeta", "test"]
    assert split_order.pair_name("test", "val") == "val/test"


def _choose(tmp_path, lines: list[dict], distance: int = THRESHOLD) -> dict[str, dict]:
    """The rows of skipped.jsonl ``choose`` gives for ``lines``, by path."""
    lines_file = tmp_path / "duplicates.jsonl"
    lines_file.write_text("".join(json.dumps(line) + "\n" for line in lines))
    dropping = drop.choose(str(lines_file), "/r", distance)
    try:
        return {path: json.loads(line) for path, line in dropping.lines()}
    finally:
        dropping.close()


def test_a_chain_of_near_copies_loses_only_the_files_near_a_file_kept(tmp_path):
    """One group, a connected component: B is within the threshold of A (train), D of B but not
    of A, E of B and of D. B goes (near A); D stays (near only B, which is gone); E goes, named
    for D, the file kept it copies, not for B."""
    a, b, d, e = 0, 0b111, 0b111111, 0b1111111  # A-B 3 bits, B-D 3, A-D 6, D-E 1, B-E 4, A-E 7
    rows = _choose(tmp_path, [
        _near(1, P, a, "train", "/r/a/a.jpg"), _near(1, Q, b, "validation", "/r/b/b.jpg"),
        _near(1, M, d, "validation", "/r/b/d.jpg"), _near(1, N, e, "test", "/r/c/e.jpg")])
    assert rows == {
        "/r/b/b.jpg": {"path": "/r/b/b.jpg", "relpath": "b/b.jpg", "reason": "near copy of an image in train",
                       "duplicate_of": "/r/a/a.jpg", "distance": 3},
        "/r/c/e.jpg": {"path": "/r/c/e.jpg", "relpath": "c/e.jpg", "reason": "near copy of an image in validation",
                       "duplicate_of": "/r/b/d.jpg", "distance": 1}}


def test_a_copy_of_a_file_left_out_is_named_for_the_file_kept(tmp_path):
    """Q in validation is near P in train, and copied in test: the copy in test goes with it, named
    as a near copy of P (kept), not as a copy of Q (left out)."""
    rows = _choose(tmp_path, [
        _exact(Q, "test", "/r/c/q.jpg", 2), _exact(Q, "validation", "/r/b/q.jpg", 2),
        _near(1, P, 0, "train", "/r/a/p.jpg"), _near(1, Q, 0b11, "test", "/r/c/q.jpg"),
        _near(1, Q, 0b11, "validation", "/r/b/q.jpg")])
    assert {path: (row["reason"], row["duplicate_of"], row.get("distance")) for path, row in rows.items()} == {
        "/r/b/q.jpg": ("near copy of an image in train", "/r/a/p.jpg", 2),
        "/r/c/q.jpg": ("near copy of an image in train", "/r/a/p.jpg", 2)}


def test_val_and_test_keep_val(tmp_path):
    """Split folders named val and test: test loses its copies, exact and near, to val."""
    rows = _choose(tmp_path, [
        _exact(X, "test", "/r/test/a/x.jpg", 2), _exact(X, "val", "/r/val/a/x.jpg", 2),
        _near(1, M, 0, "val", "/r/val/a/m.jpg"), _near(1, N, 0b11, "test", "/r/test/a/n.jpg")])
    assert {path: (row["reason"], row["duplicate_of"]) for path, row in rows.items()} == {
        "/r/test/a/n.jpg": ("near copy of an image in val", "/r/val/a/m.jpg"),
        "/r/test/a/x.jpg": ("copy of an image in val", "/r/val/a/x.jpg")}


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
    dropping = drop.choose(str(lines_file), "", THRESHOLD)
    try:
        assert [(row["path"], row["relpath"]) for row in (json.loads(line) for _, line in dropping.lines())] == [
            ("/data/b.jpg", "/data/b.jpg"), ("c.jpg", "c.jpg")]
    finally:
        dropping.close()


def test_a_split_the_drop_left_far_below_its_plan_is_said_with_the_classes_that_lost_most():
    """116 validation files planned at 10%, 54 left out as copies of training images: 62 written, 5.8%."""
    manifest = {"splits": {"train": {"num_examples": 1000, "class_counts": {"cats": 500, "dogs": 500}},
                           "validation": {"num_examples": 62, "class_counts": {"cats": 57, "dogs": 5}}},
                "duplicates": {"dropped_by_split": {"validation": 54},
                               "dropped_by_class": {"validation": {"cats": 4, "dogs": 50}}}}
    said = shrunk_splits.messages(manifest, 10)
    assert said == [
        "validation came out at 62 records of the 116 planned (5.8% of the records, not the 10% asked): 54 copied "
        "an image of an earlier split and were left out (--cross_split_duplicates drop, each in skipped.jsonl); "
        "classes that lost most of theirs: dogs 50 of 55. To keep its share, remove the earlier split's copies "
        "(duplicates.jsonl names both), or raise --validation_percent, and run again"]
    # A few left out of a large split, no class losing most of its own: nothing to say.
    manifest["splits"]["validation"] = {"num_examples": 112, "class_counts": {"cats": 56, "dogs": 56}}
    manifest["duplicates"] = {"dropped_by_split": {"validation": 4},
                              "dropped_by_class": {"validation": {"cats": 2, "dogs": 2}}}
    assert shrunk_splits.messages(manifest, 10) == []
    # One class losing all of its validation images is named even when the split barely shrank.
    manifest["duplicates"] = {"dropped_by_split": {"validation": 7},
                              "dropped_by_class": {"validation": {"cats": 2, "dogs": 2, "emus": 3}}}
    assert "emus 3 of 3" in shrunk_splits.messages(manifest, 10)[0]
    assert shrunk_splits.messages({**manifest, "duplicates": {}}, 10) == []
