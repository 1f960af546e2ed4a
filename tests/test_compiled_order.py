"""The compiled policies' non-allocating stable sort equals numpy's stable argsort on sub-ranges with ties."""

import numba
import numpy as np
import pytest

from freetoken.placement.compiled import order as compiled_order

# the policies call it from compiled code only (link-only: no Python entry); the test compiles its own
stable_order = numba.njit(compiled_order.stable_order.py_func)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 8, 17, 64, 100])
def test_stable_order_equals_mergesort_argsort(n):
    rng = np.random.default_rng(n)
    for _ in range(10):
        values = rng.integers(0, 4, n + 3).astype(np.int64)  # few distinct values: many ties
        off = int(rng.integers(0, 4))
        order, tmp = np.full(n + 2, -7, np.int64), np.empty(n + 2, np.int64)
        part = values[off:off + n]
        for descending in (True, False):
            stable_order(values, off, n, descending, order, tmp)
            want = np.argsort(-part if descending else part, kind="mergesort")
            assert np.array_equal(order[:n], want)
