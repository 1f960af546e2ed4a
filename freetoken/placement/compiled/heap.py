"""An indexed binary heap of keys for the compiled policies: heap[0 .. n) holds keys, pos[key] is a key's index in it
(-1 or another negative mark: not on it), and keys are ordered by (a[key], b[key], key), ascending, or with a and b
descending when `desc` (the key stays ascending: ties go to the lower key). belady keeps its residents by next use
(a, b = the next use and the two after, desc: the furthest first); layer_sweep by z (a = b = z, the least first).

The heap's size lives in a caller's int array, size[at], so a policy keeps it in its own state tuple.
"""

from __future__ import annotations

from freetoken.placement.compiled.cache import jit


@jit
def before(a, b, desc, x, y):
    """Key x sorts before key y."""
    if a[x] != a[y]:
        return a[x] > a[y] if desc else a[x] < a[y]
    if b[x] != b[y]:
        return b[x] > b[y] if desc else b[x] < b[y]
    return x < y


@jit
def sift(heap, pos, n, a, b, desc, i):
    """Move heap[i] to its place in heap[:n]: up past the parents it sorts before, else down past the children that
    sort before it (a key that rose needs no step down)."""
    key = heap[i]
    child = 2 * i + 1  # (up: stays past n, so the down loop does not run)
    while i > 0:
        parent = (i - 1) >> 1
        if not before(a, b, desc, key, heap[parent]):
            break
        heap[i] = heap[parent]
        pos[heap[i]] = i
        i, child = parent, n
    while child < n:
        if child + 1 < n and before(a, b, desc, heap[child + 1], heap[child]):
            child += 1
        if not before(a, b, desc, heap[child], key):
            break
        heap[i] = heap[child]
        pos[heap[i]] = i
        i, child = child, 2 * child + 1
    heap[i] = key
    pos[key] = i


@jit
def refile(heap, pos, size, at, a, b, desc, key):
    """Put `key` on the heap, or move it to its place after its a / b changed."""
    i = pos[key]
    if i < 0:
        i = size[at]
        heap[i] = key
        size[at] += 1
    sift(heap, pos, size[at], a, b, desc, i)


@jit
def remove_at(heap, pos, size, at, a, b, desc, i):
    """Take the key at index i off the heap (its pos is the caller's to mark)."""
    size[at] -= 1
    n = size[at]
    if i == n:
        return
    heap[i] = heap[n]  # the last key fills the hole, then finds its place
    sift(heap, pos, n, a, b, desc, i)


@jit
def remove_key(heap, pos, size, at, a, b, desc, key):
    """Take `key` off the heap if it is on it (pos >= 0); its pos becomes -1 either way (a resident that left)."""
    i = pos[key]
    pos[key] = -1
    if i >= 0:
        remove_at(heap, pos, size, at, a, b, desc, i)


@jit
def pop(heap, pos, size, at, a, b, desc):
    """Take the first key off the heap and return it (its pos is the caller's to mark)."""
    key = heap[0]
    size[at] -= 1
    n = size[at]
    if n > 0:
        heap[0] = heap[n]
        sift(heap, pos, n, a, b, desc, 0)
    return key


# a frontier heap of keys by (z, key), no positions kept: the sweeps' walk reads their residents' heap in order
@jit
def front_up(front, i, z):
    """Sift front[i] up the frontier heap (by z, then key)."""
    key = front[i]
    while i > 0:
        parent = (i - 1) >> 1
        q = front[parent]
        if z[key] > z[q] or (z[key] == z[q] and key > q):
            break
        front[i] = q
        i = parent
    front[i] = key


@jit
def front_down(front, n, z):
    """Sift front[0] down the frontier heap front[:n]."""
    if n == 0:
        return
    key = front[0]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        c = front[child]
        if child + 1 < n:
            d = front[child + 1]
            if z[d] < z[c] or (z[d] == z[c] and d < c):
                child, c = child + 1, d
        if z[key] < z[c] or (z[key] == z[c] and key < c):
            break
        front[i] = c
        i = child
    front[i] = key
