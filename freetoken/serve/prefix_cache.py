"""Prefix cache: the KV of earlier requests, reused for the longest common token prefix of a new one.

A radix tree over token ids (sglang-style). Each edge holds a run of tokens and the KV of those positions; the
payload is opaque to the tree, cut along its token axis by `slice_kv(kv, start, stop)`. Causal attention makes the
KV of position i a function of tokens[0..i] alone, so any common prefix is reusable to the token.

Anchors are message boundaries. Inserted runs are split at them, so a node is (at most) one message: eviction drops
whole message tails, least recently used leaf first, and a conversation edited mid-context still shares every
node before the edit, so it re-prefills from the nearest anchor before the edit (or later), never from zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

SliceKV = Callable[[Any, int, int], Any]


@dataclass(frozen=True, slots=True)
class Snapshots:
    """Hybrid models: payloads may carry a recurrent-state snapshot at their end, the only places a sequence can
    restart from. Each snapshot is charged cost_tokens (its bytes in KV-token units) against the budget."""

    has_state: Callable[[Any], bool]
    drop_state: Callable[[Any], Any]  # the payload without its snapshot
    cost_tokens: int
ReadKV = Callable[[int, int], Any]  # (start, stop) -> KV payload of those absolute positions


def _slice_first_axis(kv, start: int, stop: int):
    return kv[start:stop]


@dataclass(eq=False, slots=True)
class _Node:
    tokens: tuple[int, ...]  # the run on the edge from the parent
    kv: Any
    parent: "_Node | None"
    depth: int  # tokens from the root to the end of this run
    last_use: int = 0
    anchored: bool = False  # the run ends on an anchor (a message boundary)
    extra: int = 0  # budget tokens charged beyond the run's own (a state snapshot)
    children: dict[int, "_Node"] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    length: int  # leading tokens whose KV is reused
    kv: list  # payload pieces covering positions [0, length), in order
    anchor: int  # deepest anchor at or before `length` (0 if none)


@dataclass(slots=True)
class PrefixStats:
    lookups: int = 0
    hit_lookups: int = 0  # lookups that reused at least one token
    anchor_hits: int = 0  # lookups whose reuse reached at least one anchor (a message boundary)
    reused_tokens: int = 0  # prompt tokens served from the cache
    computed_tokens: int = 0  # prompt tokens that had to be prefilled
    inserted_tokens: int = 0
    evicted_tokens: int = 0
    snapshot_hits: int = 0  # lookups that resumed from a snapshot of recurrent state (hybrid models)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


class PrefixCache:
    """budget_tokens: most token positions of KV kept (the KV budget); 0 disables caching.
    snapshots: for models whose state cannot be cut at any token (recurrent layers): a match stops after the deepest
    payload with a state snapshot, and snapshots count against the budget (dropped, shallowest first, to fit)."""

    def __init__(self, budget_tokens: int, slice_kv: SliceKV = _slice_first_axis, snapshots: Snapshots | None = None):
        if budget_tokens < 0:
            raise ValueError(f"prefix cache budget_tokens must be >= 0, got {budget_tokens}")
        self.budget_tokens = budget_tokens
        self.slice_kv = slice_kv
        self.snapshots = snapshots
        self.root = _Node((), None, None, 0)
        self.cached_tokens = 0
        self.stats = PrefixStats()
        self._clock = 0

    # lookup
    def match(self, tokens: Sequence[int], max_length: int | None = None) -> PrefixMatch:
        """Longest cached prefix of `tokens`, at most max_length (default len - 1: the last prompt token must be
        computed to get the logits of the next one). Counts the lookup in `stats`."""
        limit = len(tokens) - 1 if max_length is None else min(max_length, len(tokens))
        self._clock += 1
        node, pieces, length, anchor = self.root, [], 0, 0
        resume = (0, 0)  # (length, pieces) of the deepest restart point, with snapshots
        while length < limit:
            child = node.children.get(tokens[length])
            if child is None:
                break
            k = _common_length(child.tokens, tokens, length, limit)
            child.last_use = self._clock
            length += k
            if k < len(child.tokens):
                pieces.append(self.slice_kv(child.kv, 0, k))
                break
            pieces.append(child.kv)
            anchor = child.depth if child.anchored else anchor
            if self.snapshots is not None and self.snapshots.has_state(child.kv):
                resume = (length, len(pieces))
            node = child
        if self.snapshots is not None:
            length, pieces = resume[0], pieces[:resume[1]]
            anchor = min(anchor, length)
            self.stats.snapshot_hits += length > 0
        self.stats.lookups += 1
        self.stats.hit_lookups += length > 0
        self.stats.anchor_hits += anchor > 0
        self.stats.reused_tokens += length
        self.stats.computed_tokens += len(tokens) - length
        return PrefixMatch(length, pieces, anchor)

    # insertion
    def insert(self, tokens: Sequence[int], read_kv: ReadKV, anchors: Iterable[int] = ()) -> int:
        """Caches the KV of `tokens`; read_kv(start, stop) is asked only for positions not cached yet.

        anchors: token offsets of message boundaries; every one becomes a node boundary. Returns how many new
        positions were stored: a tail that does not fit the budget, after evicting other leaves, is dropped
        (a prefix is worth more than a suffix).
        """
        tokens = tuple(tokens)
        cuts = sorted({a for a in anchors if 0 < a <= len(tokens)})
        self._clock += 1
        node, path = self.root, {self.root}
        while node.depth < len(tokens):  # walk the cached part, cutting runs where the new sequence needs it
            child = node.children.get(tokens[node.depth])
            if child is None:
                break
            k = _common_length(child.tokens, tokens, node.depth, len(tokens))
            cut = next((c - node.depth for c in cuts if node.depth < c < child.depth), len(child.tokens))
            if min(k, cut) < len(child.tokens):
                child = self._split(child, min(k, cut))
            child.last_use = self._clock
            child.anchored |= child.depth in cuts
            node = child
            path.add(node)
        depth = node.depth
        self._evict(self.cached_tokens + len(tokens) - depth - self.budget_tokens, keep=path)
        stop_at = min(len(tokens), depth + max(0, self.budget_tokens - self.cached_tokens))
        new = []
        for stop in [c for c in cuts if depth < c < stop_at] + [stop_at]:
            if stop <= node.depth:
                continue
            start = node.depth
            child = _Node(tokens[start:stop], read_kv(start, stop), node, stop, self._clock, stop in cuts)
            if self.snapshots is not None and self.snapshots.has_state(child.kv):
                child.extra = self.snapshots.cost_tokens
            node.children[tokens[start]] = child
            self.cached_tokens += stop - start + child.extra
            node = child
            new.append(child)
        self._fit_snapshots(path | set(new), new)
        self.stats.inserted_tokens += stop_at - depth
        return stop_at - depth

    def _fit_snapshots(self, keep: set[_Node], new: list[_Node]) -> None:
        """Over budget with the new nodes' snapshots: evict other leaves, then drop new snapshots, shallowest
        first (the sequence's end, where a next turn resumes, goes last)."""
        self._evict(self.cached_tokens - self.budget_tokens, keep=keep)
        for node in new:
            if self.cached_tokens <= self.budget_tokens:
                break
            if node.extra:
                node.kv = self.snapshots.drop_state(node.kv)
                self.cached_tokens -= node.extra
                node.extra = 0

    # eviction
    def evict(self, n_tokens: int) -> int:
        """Frees at least n_tokens (whole leaves, least recently used first) if that many are cached."""
        return self._evict(n_tokens, keep=set())

    def clear(self) -> None:
        self._evict(self.cached_tokens, keep=set())

    # introspection (tests, /health)
    def summary(self) -> dict:
        return {**self.stats.to_dict(), "cached_tokens": self.cached_tokens, "budget_tokens": self.budget_tokens}

    def sequences(self) -> list[tuple[int, ...]]:
        """Every root-to-leaf token path now cached."""
        out, stack = [], [(c, ()) for c in self.root.children.values()]
        while stack:
            node, prefix = stack.pop()
            prefix = prefix + node.tokens
            if not node.children:
                out.append(prefix)
            stack.extend((c, prefix) for c in node.children.values())
        return out

    def node_runs(self) -> list[tuple[int, int]]:
        """(start, stop) depths of every cached node, for checking where runs were cut."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append((node.depth - len(node.tokens), node.depth))
            stack.extend(node.children.values())
        return sorted(out)

    # internals
    def _split(self, node: _Node, k: int) -> _Node:
        """Cuts node's run after k tokens; returns the new upper node (not anchored unless marked later)."""
        upper = _Node(node.tokens[:k], self.slice_kv(node.kv, 0, k), node.parent, node.depth - len(node.tokens) + k,
                      node.last_use)
        node.parent.children[node.tokens[0]] = upper
        node.kv = self.slice_kv(node.kv, k, len(node.tokens))
        node.tokens = node.tokens[k:]
        node.parent = upper
        upper.children[node.tokens[0]] = node
        return upper

    def _evict(self, n_tokens: int, keep: set[_Node]) -> int:
        freed = 0
        while freed < n_tokens:
            leaves = [n for n in self._leaves() if n not in keep]
            if not leaves:
                break
            victim = min(leaves, key=lambda n: n.last_use)
            del victim.parent.children[victim.tokens[0]]
            freed += len(victim.tokens) + victim.extra
            self.cached_tokens -= len(victim.tokens) + victim.extra
        self.stats.evicted_tokens += freed
        return freed

    def _leaves(self) -> list[_Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                out.append(node)
        return out


def _common_length(run: tuple[int, ...], tokens: Sequence[int], start: int, stop: int) -> int:
    """How many leading tokens of `run` equal tokens[start:stop]."""
    n = min(len(run), stop - start)
    k = 0
    while k < n and run[k] == tokens[start + k]:
        k += 1
    return k
