"""Near duplicates among the written records: pictures whose perceptual hashes (``phash``) are within a
Hamming distance of each other, grouped into connected components.

The search is exact for its threshold ``t``: the 64 bits are split into ``m``
bands; two hashes within ``t`` bits differ in at most ``t`` bands, so they agree
exactly on at least ``k = m - t`` of them (pigeonhole, as in multi-index
hashing). For each choice of ``k`` bands, the hashes are sorted by those bands'
bits (``hash & mask``), and only hashes with equal keys are compared, on all 64
bits: every pair within ``t`` is found, and no pair beyond it is kept. ``m`` is
chosen for the number of distinct hashes, to balance the number of sorts
against the pairs a key holds. Pairs join components in a union-find held in
flat arrays; memory is a few arrays of one entry per distinct hash, whatever
the number of pairs. See docs/design/duplicates.md.
"""
from __future__ import annotations

import array
import collections
import concurrent.futures
import itertools
import json
import math
import operator
import os
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, NamedTuple

import numpy as np

from beam_prep.write.images.phash import DEFAULT_DISTANCE
from beam_prep.write.images.phash import distance as hamming
from beam_prep.write.shared import hash_lines, sorted_sets, split_order
from beam_prep.write.shared.spill import SortedSpill, SpillFolder

__all__ = ["DEFAULT_DISTANCE", "NearFound", "band_keys", "band_plan", "components", "near_pairs", "report"]

_BITS = 64


# The cost model's weights, in nanoseconds: sorting one hash by a key (the key made, packed with
# its position and sorted), and comparing one pair of hashes with equal keys.
_SORT_NS, _PAIR_NS = 15.0, 3.0
_MAX_KEYS = 20_000


def band_plan(count: int, distance: int, sort_ns: float = _SORT_NS) -> tuple[int, int]:
    """``(m, k)``: the number of bands and how many of them a key holds, for ``count`` distinct
    hashes and a threshold ``distance``: the cheapest by a cost model of one sort per key and the
    pairs that equal keys hold among uniform hashes (docs/design/duplicates.md). ``sort_ns``: what
    a hash costs per key, in nanoseconds (a Beam pipeline's shuffle: far more than a sort)."""
    best: tuple[float, int, int] | None = None
    for m in range(distance + 1, _BITS + 1):
        k = m - distance
        keys = math.comb(m, k)
        if keys > _MAX_KEYS:
            break
        pairs = count * (count - 1) / 2 / 2 ** (_BITS * k / m)
        cost = keys * (count * sort_ns + pairs * _PAIR_NS)
        if best is None or cost < best[0]:
            best = (cost, m, k)
    assert best is not None
    return best[1], best[2]


def band_keys(m: int, k: int) -> list[tuple[tuple[int, int], ...]]:
    """Each choice of ``k`` of the ``m`` bands (contiguous, sizes differing by one bit at most), as
    ``(first bit, width)`` per band."""
    edges = [round(i * _BITS / m) for i in range(m + 1)]
    bands = [(edges[i], edges[i + 1] - edges[i]) for i in range(m)]
    return list(itertools.combinations(bands, k))


def near_pairs(hashes: np.ndarray, distance: int, workers: int | None = None
               ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Every pair of positions in ``hashes`` (distinct uint64 values) within ``distance`` bits, in
    batches ``(i, j)``, one batch per key; a pair may come in more than one batch.

    Args:
      hashes: distinct 64-bit hashes (uint64).
      distance: the largest Hamming distance of a pair (0 to 63).
      workers: keys searched at once, in threads (numpy lets go of the GIL while it sorts and
        compares); default: the machine's CPUs.
    """
    n = len(hashes)
    if n < 2:
        return
    m, k = band_plan(n, distance)
    index_bits = max(1, (n - 1).bit_length())
    threads = max(1, min(workers or os.cpu_count() or 1, 4))
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        pending: collections.deque[concurrent.futures.Future] = collections.deque()
        for bands in band_keys(m, k):
            pending.append(pool.submit(_pairs_of_key, hashes, distance, bands, index_bits))
            if len(pending) >= 2 * threads:  # a bounded number in flight: memory stays a few keys' arrays
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _pairs_of_key(hashes: np.ndarray, distance: int, bands: tuple[tuple[int, int], ...],
                  index_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The pairs within ``distance`` among the hashes that agree on ``bands``: the hashes sorted by
    those bands' bits, and each compared with the ones after it while their keys agree."""
    n = len(hashes)
    key_bits = sum(width for _, width in bands)
    if key_bits + index_bits <= _BITS:  # the key and the position packed in one word: one plain sort
        key = np.zeros(n, dtype=np.uint64)
        shift = 0
        for first, width in bands:
            key |= ((hashes >> np.uint64(first)) & np.uint64((1 << width) - 1)) << np.uint64(shift)
            shift += width
        packed = np.sort((key << np.uint64(index_bits)) | np.arange(n, dtype=np.uint64))
        del key
        keys = packed >> np.uint64(index_bits)
        order = (packed & np.uint64((1 << index_bits) - 1)).astype(np.int64)
        del packed
    else:
        mask = sum(((1 << width) - 1) << first for first, width in bands)
        keys = hashes & np.uint64(mask)
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
    found_i, found_j = [], []
    active = np.flatnonzero(keys[1:] == keys[:-1])  # i where the key at i equals the next one
    step = 1
    while active.size:
        a, b = order[active], order[active + step]
        close = hamming(hashes[a], hashes[b]) <= distance
        found_i.append(a[close])
        found_j.append(b[close])
        step += 1
        active = active[active + step < n]
        active = active[keys[active + step] == keys[active]]
    if not found_i:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(found_i), np.concatenate(found_j)


def _distinct_pairs(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """``first`` of each distinct ``(first, second)`` pair, in pair order: ``np.unique(np.stack([first,
    second]), axis=1)[0]``, by one sort of both (numpy's ``axis=1`` path is several times slower)."""
    order = np.lexsort((second, first))
    first, second = first[order], second[order]
    distinct = np.ones(len(first), dtype=bool)
    distinct[1:] = (first[1:] != first[:-1]) | (second[1:] != second[:-1])
    return first[distinct]


def components(count: int, pairs: Iterator[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """The connected component of each of ``count`` nodes given edges in batches: its smallest node.

    A union-find in one array: the edges, gathered up to ``_EDGES`` at a time, link the roots of
    their ends, the larger to the smaller, until they agree; pointer jumping keeps the trees flat.
    """
    parent = np.arange(count, dtype=np.int64)
    held_i: list[np.ndarray] = []
    held_j: list[np.ndarray] = []
    held = 0
    for i, j in itertools.chain(pairs, [(None, None)]):
        if i is not None and len(i):
            held_i.append(i)
            held_j.append(j)
            held += len(i)
        if held and (held >= _EDGES or i is None):
            parent = _linked(parent, np.concatenate(held_i), np.concatenate(held_j))
            held_i, held_j, held = [], [], 0
    return _flattened(parent)


_EDGES = 1 << 20


def _positions(unique: np.ndarray, pairs: Iterable[tuple[int, int]]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Pairs of hash values as pairs of their positions in ``unique`` (sorted), in batches."""
    found = np.array(list(pairs), dtype=np.uint64).reshape(-1, 2)
    for start in range(0, len(found), _EDGES):
        batch = found[start:start + _EDGES]
        yield np.searchsorted(unique, batch[:, 0]), np.searchsorted(unique, batch[:, 1])


def _linked(parent: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    while True:
        parent = _flattened(parent)
        ri, rj = parent[i], parent[j]
        apart = ri != rj
        if not apart.any():
            return parent
        low, high = np.minimum(ri, rj)[apart], np.maximum(ri, rj)[apart]
        np.minimum.at(parent, high, low)
        i, j = i[apart], j[apart]


def _flattened(parent: np.ndarray) -> np.ndarray:
    while True:
        up = parent[parent]
        if np.array_equal(up, parent):
            return parent
        parent = up


class NearFound(NamedTuple):
    """What ``report`` found: counts for the manifest (``to_json``) and its example groups."""

    groups: int
    files: int
    within_split: int
    across_splits: int
    files_across: int
    split_pairs: dict[str, int]
    distance: int
    examples: list[dict[str, Any]]
    with_earlier: int | None = None  # an append's: groups holding a record of an earlier version
    label_conflicts: int = 0  # groups whose files are under two labels or more

    def to_json(self) -> dict[str, Any]:
        found = {"distance": self.distance, "groups": self.groups, "files": self.files,
                 "within_split": self.within_split, "across_splits": self.across_splits,
                 "files_across": self.files_across, "split_pairs": self.split_pairs, "examples": self.examples,
                 "label_conflicts": self.label_conflicts}
        if self.with_earlier is not None:
            found["with_earlier"] = self.with_earlier
        return found


def report(lines: Callable[[], Iterator[tuple[str, list[bytes]]]], distance: int, out: IO[bytes],
           folder: SpillFolder, pairs: Iterable[tuple[int, int]] | None = None,
           version_of: Callable[[str], int] | None = None, version: int | None = None) -> NearFound:
    """Finds the near-duplicate groups among the hash lines and writes them to ``out``.

    A group is a connected component of records whose hashes are within ``distance``
    bits, holding two contents or more (a component of one content is an exact group,
    reported as such). Each of its files is a line of ``out``: ``kind`` near, ``group``
    (numbered from 1 in the order of the components' smallest hash), ``distance`` (its
    hash's from the group's first file's; ``group_distance``, the largest in the group),
    its sha256, perceptual hash, split and path. Leakage is counted for every pair of splits
    (``split_pairs``: the groups holding both), whatever the splits are named.

    Args:
      lines: called twice, each time gives the hash files' lines, a chunk at a time, in one
        order, as ``(file, lines)``.
      distance: the threshold.
      out: where the lines go.
      folder: a temporary folder, for the external sort of the groups' files.
      pairs: the pairs of hashes within ``distance``, found already (by the pipeline:
        ``near_beam.NearPairs``); None: found here (``near_pairs``).
      version_of: an append's: the version of each file's records (the dataset's, and the run's
        ``version``); only the groups holding a record of ``version`` are reported, each line naming
        its record's version. None: every group, no version.
      version: the version the append makes.
    """
    pictures, hashed, contents, splits, names, versions = _read(lines(), version_of)
    valid = np.flatnonzero(hashed)
    unique, inverse = np.unique(pictures[valid], return_inverse=True)
    labels = components(len(unique), near_pairs(unique, distance) if pairs is None else _positions(unique, pairs))
    group = np.full(len(pictures), -1, dtype=np.int64)
    group[valid] = labels[inverse]
    del unique, inverse, labels
    with_earlier = None if versions is None else 0
    # Components of two contents or more, and each one's splits.
    members = np.flatnonzero(group >= 0)
    if not len(members):
        return NearFound(0, 0, 0, 0, 0, {}, distance, [], with_earlier)
    by_content = _distinct_pairs(group[members], contents[members].view(np.int64))
    ids, counts = np.unique(by_content, return_counts=True)
    near_ids = ids[counts >= 2]
    del by_content, ids, counts
    if not len(near_ids):
        return NearFound(0, 0, 0, 0, 0, {}, distance, [], with_earlier)
    if versions is not None:  # an append's: the groups holding a new record, and of those, an old one too
        near_ids = near_ids[sorted_sets.isin(near_ids, group[(versions == version) & (group >= 0)])]
        with_earlier = int(np.count_nonzero(sorted_sets.isin(near_ids, group[(versions != version) & (group >= 0)])))
        if not len(near_ids):
            return NearFound(0, 0, 0, 0, 0, {}, distance, [], with_earlier)
    in_near = sorted_sets.isin(group, near_ids, among_sorted=True)
    rows = np.flatnonzero(in_near)
    order = rows[np.lexsort((rows, np.searchsorted(near_ids, group[rows])))]
    number = np.searchsorted(near_ids, group[order])  # 0-based, in the order of near_ids
    starts = np.flatnonzero(np.r_[True, number[1:] != number[:-1]])
    holds = np.zeros((len(near_ids), len(names)), dtype=bool)  # group x split: whether it has a file there
    holds[number, splits[order]] = True
    across = np.count_nonzero(holds, axis=1) >= 2
    files_across = int(np.count_nonzero(across[number]))
    # Each line goes to its group's place in the report; within a group, its files are ordered by
    # path when read back, an order neither the sink nor the hash files' order changes.
    place = np.empty(len(pictures), dtype=np.int64)
    place[order] = np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    # The lines go as they are (``_read`` checked each), split again only once their group is read back.
    spill = SortedSpill(folder, "near", max(1, len(order)))
    index = 0
    for _, chunk in lines():
        chosen = np.flatnonzero(in_near[index:index + len(chunk)])
        of = versions[index + chosen].tolist() if versions is not None else [None] * len(chosen)
        for i, at, v in zip(chosen.tolist(), place[index + chosen].tolist(), of):
            spill.add(((at << 64) // len(order), at, chunk[i], v))
        index += len(chunk)
    examples_across: list[dict[str, Any]] = []
    examples_within: list[dict[str, Any]] = []
    conflicts = 0
    for at, members in itertools.groupby(spill, key=operator.itemgetter(1)):
        g = int(number[at])
        files = sorted((*_by_path(line), v) for _, _, line, v in members)
        gaps = [hamming(phash, files[0][3]) for _, _, _, phash, _, _ in files]
        widest = max(gaps)
        mixed = len({label for _, _, _, _, label, _ in files} - {b"null"}) > 1  # a line of an older run: unknown
        conflicts += mixed
        for (path, sha256, split, phash, label, v), gap in zip(files, gaps):
            out.write(b'{"kind": "near", "group": %d, "distance": %d, "group_distance": %d, "sha256": "%s", '
                      b'"phash": "%016x", "labels_differ": %s, "split": "%s", "label": %s, "path": %s%s}\n'
                      % (g + 1, gap, widest, sha256, phash, b"true" if mixed else b"false", split, label, path,
                         b"" if v is None else b', "version": %d' % v))
        kept = examples_across if across[g] else examples_within
        if len(kept) < _EXAMPLES:
            kept.append({"group": g + 1, "distance": widest, "files": [
                {"split": split.decode(), "label": json.loads(label), "path": json.loads(path), "distance": gap,
                 **({} if v is None else {"version": v})}
                for (path, _, split, _, label, v), gap in zip(files[:_EXAMPLES], gaps)]})
    return NearFound(groups=len(near_ids), files=len(order), within_split=int(np.count_nonzero(~across)),
                     across_splits=int(np.count_nonzero(across)), files_across=files_across,
                     split_pairs=_split_pairs(holds, names), distance=distance,
                     examples=(examples_across + examples_within)[:_EXAMPLES], with_earlier=with_earlier,
                     label_conflicts=conflicts)


def _by_path(line: bytes) -> tuple[bytes, bytes, bytes, int, bytes]:
    """A near group's line, checked already: ``(path, sha256, split, perceptual hash, label)``, the
    order its group lists it in (by path; the other fields break a tie, as two sinks' lines may)."""
    sha256, split, picture, path, label = hash_lines.fields(line)
    return path, sha256, split, int(picture, 16), label


def _split_pairs(holds: np.ndarray, names: dict[bytes, int]) -> dict[str, int]:
    """Per pair of splits (``split_order.pair_name``), the groups with files in both; pairs no
    group holds are left out."""
    split = {code: name.decode() for name, code in names.items()}
    pairs = {}
    for a, b in itertools.combinations(sorted(split), 2):
        both = int(np.count_nonzero(holds[:, a] & holds[:, b]))
        if both:
            pairs[split_order.pair_name(split[a], split[b])] = both
    return split_order.sorted_pairs(pairs)


_EXAMPLES = 5


def _read(chunks: Iterator[tuple[str, list[bytes]]], version_of: Callable[[str], int] | None = None
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[bytes, int], np.ndarray | None]:
    """Per line: its perceptual hash, whether it has one (``-``: none), its sha256's first 8
    bytes and its split's code; the codes by split name; with ``version_of``, each line's version."""
    pictures, contents, splits = array.array("Q"), array.array("Q"), array.array("B")
    versions = array.array("I")
    hashed = bytearray()
    names: dict[bytes, int] = {}
    for file, chunk in chunks:
        if version_of is not None:
            versions.extend([version_of(file)] * len(chunk))
        for line in chunk:
            parsed = hash_lines.parse(file, line)
            hashed.append(parsed.phash is not None)
            pictures.append(parsed.phash or 0)
            contents.append(int(parsed.sha256[:16], 16))
            splits.append(names.setdefault(parsed.split, len(names)))
    return (np.frombuffer(pictures, dtype=np.uint64), np.frombuffer(hashed, dtype=bool),
            np.frombuffer(contents, dtype=np.uint64), np.frombuffer(splits, dtype=np.uint8), names,
            np.frombuffer(versions, dtype=np.uint32) if version_of is not None else None)
