"""duplicates.jsonl read for the report: every group and pair across splits counted exactly, what is kept
capped, in one pass over a file of any size (the million-record case, by its cap)."""
from __future__ import annotations

import json

import pytest

from beam_prep.errors import DatasetError
from beam_prep.tools.report.leaks import read_leaks


def exact(sha: str, files: list[tuple[str, str]]) -> list[str]:
    return [json.dumps({"kind": "exact", "sha256": sha, "copies": len(files), "split": s, "path": p}) for s, p in files]


def near(group: int, files: list[tuple[str, str, str]]) -> list[str]:
    first = int(files[0][2], 16)
    distances = [(int(h, 16) ^ first).bit_count() for _, _, h in files]
    return [json.dumps({"kind": "near", "group": group, "distance": d, "group_distance": max(distances),
                        "sha256": f"{group}{i}", "phash": h, "split": s, "path": p})
            for i, ((s, p, h), d) in enumerate(zip(files, distances))]


def test_pairs_are_every_two_files_of_a_group_in_two_splits_with_their_distance():
    lines = (exact("aa", [("train", "t1"), ("validation", "v1"), ("train", "t2")])
             + exact("bb", [("train", "t3"), ("train", "t4")])
             + near(1, [("train", "t5", "00000000000000ff"), ("validation", "v5", "000000000000000f"),
                        ("test", "x5", "0000000000000000")]))
    leaks = read_leaks(lines, "duplicates.jsonl", max_groups=10, max_pairs=10)
    assert (leaks.exact_groups, leaks.near_groups, leaks.groups_across) == (2, 1, 2)
    shown = {(p.a.path, p.b.path, p.distance) for p in leaks.pairs}
    assert shown == {("t1", "v1", 0), ("v1", "t2", 0), ("t5", "v5", 4), ("t5", "x5", 8), ("v5", "x5", 4)}
    assert leaks.pair_count == 5
    assert [g.key for g in leaks.groups][:2] == ["aa", "1"]  # across splits first, the closest first


def test_a_million_records_are_counted_exactly_and_shown_up_to_the_caps():
    """Many groups, and one group of 2,000 copies half in each split (a million pairs): counts exact,
    what is kept no more than the caps, the closest kept."""
    lines = []
    for g in range(5000):
        lines += exact(f"{g:06d}", [("train", f"t{g}"), ("validation", f"v{g}")])
    lines += exact("big", [("train" if i % 2 else "validation", f"b{i}") for i in range(2000)])
    lines += near(1, [("train", "n1", "0000000000000000"), ("validation", "n2", "0000000000000003")])
    leaks = read_leaks(iter(lines), "duplicates.jsonl", max_groups=7, max_pairs=11)
    assert leaks.pair_count == 5000 + 1000 * 1000 + 1
    assert leaks.groups_across == leaks.group_count == 5002
    assert len(leaks.pairs) == 11 and len(leaks.groups) == 7
    assert all(p.distance == 0 for p in leaks.pairs)  # the exact copies are closer than the near pair


def test_no_file_and_an_empty_file_differ():
    assert not read_leaks(None, "d", 1, 1).exists
    empty = read_leaks([], "d", 1, 1)
    assert empty.exists and empty.group_count == 0 and empty.pairs == ()


def test_a_line_that_is_not_a_duplicates_line_is_named():
    with pytest.raises(DatasetError, match=r"^out/duplicates.jsonl line 2 is not a duplicate's line"):
        read_leaks([*exact("aa", [("train", "a")]), '{"kind": "exact"}'], "out/duplicates.jsonl", 1, 1)
