"""``sorted_sets`` against numpy's own ``unique`` and ``isin``, the oracle it stands in for."""
from __future__ import annotations

import numpy as np
import pytest

from beam_prep.write.shared import sorted_sets


@pytest.mark.parametrize("dtype", [np.uint64, np.int64])
@pytest.mark.parametrize("size, among", [(0, 0), (0, 5), (5, 0), (1, 1), (1000, 300), (20000, 200)])
def test_same_as_numpy(dtype, size, among):
    rng = np.random.default_rng(size + among)
    for high in (50, 2**63):  # many repeats; spread over the range, as hashes are
        values = rng.integers(0, high, size, dtype=np.int64).astype(dtype)
        others = np.concatenate([rng.integers(0, high, among, dtype=np.int64).astype(dtype), values[:among // 2]])
        distinct = sorted_sets.unique(values)
        assert distinct.dtype == dtype
        np.testing.assert_array_equal(distinct, np.unique(values))
        np.testing.assert_array_equal(sorted_sets.isin(values, others), np.isin(values, others))
        np.testing.assert_array_equal(sorted_sets.isin(values, np.unique(others), among_sorted=True),
                                      np.isin(values, others))


def test_extremes():
    """The largest value sorts last: a search past the end finds nothing there, rather than wrapping."""
    top = np.array([2**64 - 1, 0, 2**64 - 1], dtype=np.uint64)
    np.testing.assert_array_equal(sorted_sets.unique(top), [0, 2**64 - 1])
    np.testing.assert_array_equal(sorted_sets.isin(top, np.array([5], dtype=np.uint64)), [False, False, False])
    np.testing.assert_array_equal(sorted_sets.isin(np.array([7, 0], dtype=np.uint64), top), [False, True])
