"""A stable argsort that allocates nothing (hooks run without numba's reference counting): a bottom-up merge sort
of indices into caller-given buffers, equal to np.argsort(+-values, kind="mergesort")."""

from __future__ import annotations

from freetoken.placement.compiled.cache import jit



@jit
def _before(values, off, a, b, descending):
    """Whether index a sorts before index b: by value (descending or ascending), ties to the lower index."""
    va, vb = values[off + a], values[off + b]
    if va != vb:
        return va > vb if descending else va < vb
    return a < b


@jit
def stable_order(values, off, n, descending, order, tmp):
    """order[:n] = the indices 0..n-1 of values[off:off + n] sorted (ties to the lower index); tmp: scratch [>= n]."""
    for i in range(n):
        order[i] = i
    width = 1
    in_tmp = False  # which buffer holds the current runs
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j = lo, mid
            for k in range(lo, hi):
                a = (tmp[i] if in_tmp else order[i]) if i < mid else -1
                b = (tmp[j] if in_tmp else order[j]) if j < hi else -1
                if b < 0 or (a >= 0 and not _before(values, off, b, a, descending)):
                    v = a
                    i += 1
                else:
                    v = b
                    j += 1
                if in_tmp:
                    order[k] = v
                else:
                    tmp[k] = v
        in_tmp = not in_tmp
        width *= 2
    if in_tmp:
        for i in range(n):
            order[i] = tmp[i]
