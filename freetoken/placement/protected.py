"""Recognising the protected set of the previous victim() call: the evictions of one call all share it, so a
policy can keep work done for one eviction (keys set aside, counts) for the next ones of the same call."""

from __future__ import annotations


class ProtectedMemo:
    """`keys`: a frozen copy of the protected set last seen. `same(protected)` is O(1) when it is the same
    object at the same size (plan() only ever adds to it, so the size tells), else one set comparison."""

    __slots__ = ("keys", "_obj", "_len")

    def __init__(self) -> None:
        self.keys: frozenset[int] = frozenset()
        self._obj: set[int] | None = None
        self._len = -1

    def same(self, protected: set[int]) -> bool:
        """True when `protected` equals the last set seen; otherwise remember it and return False."""
        if protected is self._obj and len(protected) == self._len:
            return True
        self._obj, self._len = protected, len(protected)
        if protected == self.keys:
            return True
        self.keys = frozenset(protected)
        return False
