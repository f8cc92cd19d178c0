"""The near-duplicate search as Beam transforms, for runs finished by a pipeline step (the shuffle
sink, distributed runners, ``WriteImageDataset``): band keys -> GroupByKey -> the pairs within the
threshold.

The same pigeonhole as the launcher's search (``near``): a pair within ``t``
bits agrees on ``k`` of ``m`` bands; each distinct hash is keyed by every
choice of ``k`` bands and their bits, and each group compares its hashes on all
64 bits. A pair is emitted by one key only, the first (in the order of
``near.band_keys``) whose bands it agrees on, so the pairs come once. Both find
exactly the pairs within ``t`` among the same distinct hashes, so their
connected components, the groups, are the same. ``m`` and ``k`` weigh a key
emitted through the shuffle far above a pair compared in a group.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np
from apache_beam import coders

from beam_prep.write.finish import near
from beam_prep.write.images.phash import distance as hamming
from beam_prep.write.shared import hash_lines, sorted_sets

__all__ = ["NearPairs"]

# A key emitted and shuffled costs about a microsecond of a worker's time; a pair compared, a few ns.
_EMIT_NS = 1000.0
_BLOCK = 2048  # hashes of a group compared with all others at once


class NearPairs(beam.PTransform):
    """Hash files' paths -> every pair ``(a, b)``, ``a < b``, of distinct perceptual hashes within
    ``distance`` bits, each once.

    Args:
      distance: the threshold, in bits.
      count: about how many distinct hashes there are (the files listed): it chooses the bands.
    """

    def __init__(self, distance: int, count: int) -> None:
        super().__init__()
        self._distance = distance
        m, k = near.band_plan(max(2, count), distance, sort_ns=_EMIT_NS)
        self._keys = near.band_keys(m, k)

    def expand(self, paths: beam.PCollection) -> beam.PCollection:
        return (paths
                | "ReadHashLines" >> beam.io.ReadAllFromText(coder=coders.BytesCoder(), with_filename=True)
                | "Pictures" >> beam.FlatMap(_picture)
                | "DistinctPictures" >> beam.Distinct()
                | "BandKeys" >> beam.FlatMap(_band_keys, self._keys)
                | "GroupByBands" >> beam.GroupByKey()
                | "PairsWithin" >> beam.FlatMap(_pairs_within, self._keys, self._distance))


def _picture(file_and_line: tuple[str, bytes]) -> Iterator[int]:
    """A hash line's perceptual hash, if it has one (``hash_lines``)."""
    picture = hash_lines.parse(*file_and_line).phash
    if picture is not None:
        yield picture


def _band_keys(picture: int, keys: list[tuple[tuple[int, int], ...]]) -> Iterator[tuple[tuple[int, int], int]]:
    for index, bands in enumerate(keys):
        value = 0
        for first, width in bands:
            value = (value << width) | ((picture >> first) & ((1 << width) - 1))
        yield (index, value), picture


def _pairs_within(group: tuple[tuple[int, int], Iterable[int]], keys: list[tuple[tuple[int, int], ...]],
                  distance: int) -> Iterator[tuple[int, int]]:
    """The group's pairs within ``distance`` whose first agreeing key is this one."""
    key, pictures = group
    hashes = sorted_sets.unique(np.fromiter(pictures, dtype=np.uint64))
    if len(hashes) < 2:
        return
    bands = keys[key[0]]
    all_bands = sorted({band for chosen in keys for band in chosen})
    last = all_bands.index(bands[-1])
    before = all_bands[:last + 1]  # the bands up to this key's last: they must agree on its bands only
    for start in range(0, len(hashes), _BLOCK):  # blocks of the upper triangle: memory stays small
        rows = hashes[start:start + _BLOCK]
        for column in range(start, len(hashes), _BLOCK):
            columns = hashes[column:column + _BLOCK]
            a, b = np.nonzero(hamming(rows[:, None], columns[None, :]) <= distance)
            keep = a + start < b + column
            a, b = rows[a[keep]], columns[b[keep]]
            differ = a ^ b
            agreeing = np.zeros(len(a), dtype=np.int64)
            for first, width in before:
                agreeing += ((differ >> np.uint64(first)) & np.uint64((1 << width) - 1)) == 0
            first_key = agreeing == len(bands)  # this key's bands agree (the group says so), no earlier one
            yield from zip(a[first_key].tolist(), b[first_key].tolist())
