"""Near duplicates: the banded search is exact for its threshold (against every pair compared), the
groups are connected components, and the report lists and counts them within and across splits."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from beam_prep.errors import DatasetError
from beam_prep.write.finish import duplicates, near
from beam_prep.write.shared import hash_lines


def _brute(hashes: np.ndarray, distance: int) -> set[tuple[int, int]]:
    d = np.bitwise_count(hashes[:, None] ^ hashes[None, :])
    return {(i, j) for i, j in zip(*np.nonzero(d <= distance)) if i < j}


@pytest.mark.parametrize("distance", [0, 2, 6, 10, 16])
def test_the_banded_search_finds_exactly_the_pairs_within_the_distance(distance):
    rng = np.random.default_rng(distance)
    base = rng.integers(0, 2**63, size=600, dtype=np.uint64) << np.uint64(1)
    flips = [sum(1 << int(b) for b in rng.choice(64, rng.integers(0, distance + 4), replace=False))
             for _ in range(600)]
    hashes = np.unique(np.concatenate([base, base ^ np.array(flips, dtype=np.uint64)]))
    found = {(min(a, b), max(a, b)) for i, j in near.near_pairs(hashes, distance)
             for a, b in zip(i.tolist(), j.tolist())}
    expected = _brute(hashes, distance)
    assert found == expected
    assert distance == 0 or len(expected) > 100  # the test has pairs to find


def test_components_join_chains_and_keep_the_rest_apart():
    edges = iter([(np.array([0, 5]), np.array([1, 6])), (np.array([1]), np.array([2])),
                  (np.array([6]), np.array([5]))])
    assert near.components(8, edges).tolist() == [0, 0, 0, 3, 4, 5, 5, 7]


def _line(content: str, split: str, picture: int | None, path: str) -> str:
    return duplicates.hash_line(hashlib.sha256(content.encode()).hexdigest(), split, path, picture)


def test_near_groups_are_listed_with_their_distance_and_counted_within_and_across_splits(tmp_path):
    a, b = 0x0123456789ABCDEF, 0xF0E1D2C3B4A59687
    rows = [
        _line("a", "train", a, "/t/a.jpg"),
        _line("a-small", "validation", a ^ 0b11, "/v/a_small.jpg"),  # 2 bits away, other split: leakage
        _line("a-crop", "train", a ^ 0b11 ^ (0b1111 << 40), "/t/a_crop.jpg"),  # 4 from a-small, 6 from a
        _line("b", "train", b, "/t/b.jpg"),
        _line("b-again", "train", b, "/t/b_again.jpg"),  # same picture, other bytes: near, within train
        _line("b", "train", b, "/t/b_copy.jpg"),  # exact copy of b: exact group, and in b's near group
        _line("far", "validation", a ^ ((1 << 20) - 1), "/v/far.jpg"),  # 20 bits away: alone
        _line("flat", "train", None, "/t/flat.jpg"),
        _line("flat2", "validation", None, "/v/flat.jpg"),  # no hash: in no near group
    ]
    path = tmp_path / "hashes.txt"
    path.write_text("".join(r + "\n" for r in rows))
    found = duplicates.find([str(path)], len(rows), distance=4)
    try:
        with open(found.lines_file) as f:
            lines = [json.loads(line) for line in f]
    finally:
        found.close()
    assert found.images == 1 and found.across_splits == 0
    nearby = [(r["group"], r["path"], r["split"], r["distance"], r["group_distance"])
              for r in lines if r["kind"] == "near"]
    assert nearby == [(1, "/t/a.jpg", "train", 0, 6), (1, "/t/a_crop.jpg", "train", 6, 6),
                      (1, "/v/a_small.jpg", "validation", 2, 6),  # a group's files by path
                      (2, "/t/b.jpg", "train", 0, 0), (2, "/t/b_again.jpg", "train", 0, 0),
                      (2, "/t/b_copy.jpg", "train", 0, 0)]
    assert [r["path"] for r in lines if r["kind"] == "exact"] == ["/t/b.jpg", "/t/b_copy.jpg"]
    assert found.near == {"distance": 4, "groups": 2, "files": 6, "within_split": 1, "across_splits": 1,
                          "files_across": 3, "split_pairs": {"train/validation": 1},
                          "examples": found.near["examples"], "label_conflicts": 0}
    assert found.near["examples"][0]["files"][2] == {"split": "validation", "label": None, "path": "/v/a_small.jpg",
                                                     "distance": 2}


@pytest.mark.parametrize("bad", ["zz" * 8, "0123", "-x"])
def test_a_hash_line_whose_perceptual_hash_is_not_one_is_refused_naming_its_file(tmp_path, bad):
    """The near search reads the lines through the one parser: a damaged hash is a DatasetError
    naming the file and the line, not a ValueError from int()."""
    good = _line("a", "train", 1, "/t/a.jpg")
    path = tmp_path / "hashes.txt"
    path.write_text(good + "\n" + good.replace(f"{1:016x}", bad) + "\n")
    with pytest.raises(DatasetError, match=f"{path} holds a line that is not a record's hash"):
        duplicates.find([str(path)], 2, distance=4)


def test_the_one_parser_reads_what_hash_line_writes_and_refuses_the_rest():
    line = duplicates.hash_line("ab" * 32, "val", "/r/val/é.jpg", 0xFFFF_0000_0000_0001).encode()
    assert hash_lines.parse("f", line) == hash_lines.HashLine(b"ab" * 32, b"val", 0xFFFF_0000_0000_0001,
                                                             b'"/r/val/\\u00e9.jpg"')
    assert hash_lines.parse("f", duplicates.hash_line("cd" * 32, "test", "/x").encode()).phash is None
    for bad in [b"", b"ab" * 32 + b"\ttrain", b"zz" * 32 + b"\ttrain\t-\t\"/x\"", b"ab" * 32 + b"\t\t-\t\"/x\"",
                b"ab" * 31 + b"\ttrain\t-\t\"/x\""]:
        with pytest.raises(DatasetError, match="f holds a line that is not a record's hash"):
            hash_lines.parse("f", bad)


def test_no_hashes_no_near_groups(tmp_path):
    path = tmp_path / "hashes.txt"
    path.write_text(_line("flat", "train", None, "/t/flat.jpg") + "\n")
    found = duplicates.find([str(path)], 1)
    found.close()
    assert found.near["groups"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("distance", [4, 10])
def test_the_beam_transforms_find_each_pair_the_launcher_finds_once(tmp_path, distance):
    """NearPairs on the DirectRunner against the launcher's search over the same hash files: the
    same pairs, each once, so the same groups."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from beam_prep.write.finish.near_beam import NearPairs

    rng = np.random.default_rng(distance)
    base = rng.integers(0, 2**63, size=150, dtype=np.uint64) << np.uint64(1)
    flips = [sum(1 << int(b) for b in rng.choice(64, rng.integers(0, distance + 4), replace=False))
             for _ in range(150)]
    hashes = np.concatenate([base, base ^ np.array(flips, dtype=np.uint64), base[:10]])  # and exact copies
    files = []
    for part in range(2):
        path = tmp_path / f"hashes-{part}.txt"
        path.write_text("".join(_line(f"{part}-{i}", "train", int(h), f"/{part}/{i}.jpg") + "\n"
                                for i, h in enumerate(hashes[part::2])) + _line("flat", "train", None, "/f.jpg") + "\n")
        files.append(str(path))
    unique = np.unique(hashes)
    expected = [(int(unique[min(a, b)]), int(unique[max(a, b)])) for a, b in _brute(unique, distance)]
    with beam.Pipeline() as p:
        pairs = p | beam.Create(files) | NearPairs(distance, count=len(unique))
        assert_that(pairs, equal_to(expected))  # each once: a repeated pair would fail equal_to
    assert len(expected) > 20


def test_distinct_pairs_are_numpys_unique_columns():
    rng = np.random.default_rng(7)
    for n in (0, 1, 2, 50, 5000):
        for high in (3, 2**62):
            groups, contents = rng.integers(0, n // 5 + 1, n), rng.integers(0, high, n)
            contents[: n // 2] = contents[n // 2: n // 2 * 2]  # repeats
            np.testing.assert_array_equal(near._distinct_pairs(groups, contents),
                                          np.unique(np.stack([groups, contents]), axis=1)[0])


@pytest.mark.parametrize("damage", [
    [],  # every line good
    [b"ab" * 32 + b"\ttrain\ta\t\"/x\"\t\"c\"", b"ab" * 32 + b"\ttrain\t-0123456789abcde\t\"/y\"\t\"c\""],  # lengths that add up
    [b"ab" * 32 + b"\ttrain\t0123456789abcd-e\t\"/x\"\t\"c\""],
    [b"ab" * 32 + b"\ttrain\t-\t\"/x\"\t"],  # an empty label
    [b"ab" * 32 + b"\t\t-\t\"/x\"\t\"c\""],  # no split
    [b"ab" * 31 + b"\ttrain\t-\t\"/x\"\t\"c\""],
    [b"ab" * 32 + b"\ttrain\t-"],
])
def test_columns_reads_the_lines_parse_reads_and_refuses_the_others(damage):
    rng = np.random.default_rng(len(damage))
    good = [duplicates.hash_line(rng.bytes(32).hex(), "train", f"/t/{i}.jpg",
                                 None if i % 3 == 0 else int(rng.integers(0, 2 ** 63)), "c").encode() for i in range(50)]
    lines = good[:20] + damage + good[20:]
    if damage:
        with pytest.raises(DatasetError, match="f holds a line that is not a record's hash"):
            hash_lines.columns("f", lines)
        return
    prefixes, phashes, has = hash_lines.columns("f", lines)
    parsed = [hash_lines.parse("f", line) for line in lines]
    assert prefixes.tolist() == [int(p.sha256[:16], 16) for p in parsed]
    assert phashes.tolist() == [p.phash or 0 for p in parsed]
    assert has.tolist() == [p.phash is not None for p in parsed]
