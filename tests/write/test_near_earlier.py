"""``near_earlier.matching``: the dataset's records an append's new ones copy or are near, found by band keys
over hashes on disk, are exactly those a comparison of every pair finds."""
from __future__ import annotations

import gzip

import numpy as np
import pytest

from beam_prep.write.finish import near_earlier
from beam_prep.write.images.phash import distance as hamming
from beam_prep.write.shared import hash_lines
from beam_prep.write.shared.spill import SpillFolder


def kept_file(path, rows) -> None:
    path.write_bytes(gzip.compress(b"".join(
        hash_lines.hash_line(sha, split, name, phash).encode() + b"\n" for sha, split, phash, name in rows)))


@pytest.mark.parametrize("held", [1 << 16, 3000], ids=["lines held for the second pass", "read again"])
@pytest.mark.parametrize("distance", [0, 3, 6, 10])
def test_it_finds_every_old_record_within_the_distance_of_a_new_one_and_no_other(tmp_path, monkeypatch, distance,
                                                                                  held):
    monkeypatch.setattr(near_earlier, "_CHUNK", 1000)  # several chunks
    monkeypatch.setattr(near_earlier, "_HELD", held)  # every line held between the passes, or only the first file's
    rng = np.random.default_rng(distance)
    old = rng.integers(0, 2**63, size=5000, dtype=np.int64).astype(np.uint64)
    new = rng.integers(0, 2**63, size=40, dtype=np.int64).astype(np.uint64)
    for i in range(0, 40, 4):  # planted near copies, some within the distance and some beyond
        flips = rng.choice(64, size=int(rng.integers(0, 12)), replace=False)
        old[i * 100] = new[i] ^ np.uint64(sum(1 << int(b) for b in flips))
    shas = [rng.bytes(32).hex() for _ in range(len(old))]
    shas[77] = "f" * 64  # a new record's bytes: found whatever its picture
    rows = [(sha, "train" if i % 3 else "validation", None if i == 5 else int(p), f"a/{i}.jpg")
            for i, (sha, p) in enumerate(zip(shas, old.tolist()))]
    kept_file(tmp_path / "v1.gz", rows[:3000])
    kept_file(tmp_path / "v2.gz", rows[3000:])
    new_lines = [hash_lines.hash_line("f" * 64 if i == 0 else rng.bytes(32).hex(), "train", f"/new/{i}.jpg",
                                      int(p)).encode() for i, p in enumerate(new.tolist())]
    folder = SpillFolder()
    written = near_earlier.matching([(str(tmp_path / "v1.gz"), "/one", 1), (str(tmp_path / "v2.gz"), "/two", 2)],
                                    iter([("run", new_lines)]), distance, folder)
    found = {}
    for path, version, count in written:
        lines = open(path, "rb").read().splitlines()
        assert len(lines) == count
        for line in lines:
            parsed = hash_lines.parse(path, line)
            found[parsed.path.decode()] = version
    close = np.flatnonzero((hamming(old[:, None], new[None, :]) <= distance).any(axis=1))
    expected = {f'"/{"one" if i < 3000 else "two"}/a/{i}.jpg"': 1 if i < 3000 else 2
                for i in {*close.tolist(), 77} if i != 5}
    assert found == expected
    folder.close()
