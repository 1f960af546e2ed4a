"""The prefix cache with state snapshots (hybrid models): a lookup resumes only after a piece that carries a state,
and snapshots are charged to the budget (dropped shallowest first, freed with their node). Plain payloads here:
(positions, has a state at the end)."""

from __future__ import annotations

from freetoken.serve.prefix_cache import PrefixCache, Snapshots

SEQ = list(range(100, 109))  # 9 tokens; anchors after 3 and 6


def _slice(piece, start, stop):
    positions, state = piece
    return positions[start:stop], state and stop == len(positions)


def _cache(budget: int, cost: int = 4) -> PrefixCache:
    snaps = Snapshots(has_state=lambda p: p[1], drop_state=lambda p: (p[0], False), cost_tokens=cost)
    return PrefixCache(budget, _slice, snaps)


def _read(states_at):
    return lambda start, stop: (list(range(start, stop)), stop in states_at)


def test_resumes_only_where_a_state_was_kept():
    cache = _cache(100)
    cache.insert(SEQ, _read({3, 6, 9}), anchors=[3, 6])
    assert cache.cached_tokens == 9 + 3 * 4
    longer = cache.match(SEQ + [1, 2])
    assert longer.length == 9 and sum(len(p[0]) for p in longer.kv) == 9 and longer.kv[-1][1]
    edited = cache.match(SEQ[:5] + [0, 0, 0])  # KV shared to 5, the last state at 3
    assert edited.length == 3 and [p[0] for p in edited.kv] == [[0, 1, 2]]
    assert cache.match([7, 7, 7]).length == 0
    assert cache.stats.snapshot_hits == 2 and cache.stats.anchor_hits == 2 and cache.stats.reused_tokens == 12


def test_a_prefix_without_states_is_not_reused():
    cache = _cache(100)
    cache.insert(SEQ, _read({9}), anchors=[3, 6])  # only the end kept a state
    assert cache.match(SEQ[:7] + [0, 0]).length == 0 and cache.match(SEQ + [0]).length == 9


def test_snapshots_count_against_the_budget():
    """Budget 17: 9 tokens + three 4-token snapshots = 21 do not fit; the shallowest snapshot (after 3) goes, the
    sequence's end stays."""
    cache = _cache(17)
    cache.insert(SEQ, _read({3, 6, 9}), anchors=[3, 6])
    assert cache.cached_tokens == 17
    assert cache.match(SEQ + [1]).length == 9
    assert cache.match(SEQ[:5] + [0]).length == 0  # the state at 3 was dropped
    assert cache.match(SEQ[:7] + [0]).length == 6
    other = list(range(200, 205))  # 5 tokens + 1 snapshot = 9: evicts SEQ's leaf run (3 tokens + 4) and more
    cache.insert(other, _read({5}))
    assert cache.cached_tokens <= 17 and cache.match(other + [0]).length == 5
    assert cache.cached_tokens == _charged(cache)


def _charged(cache: PrefixCache) -> int:
    """Every node's tokens plus 4 per snapshot it still holds, counted from the tree."""
    out, stack = 0, list(cache.root.children.values())
    while stack:
        node = stack.pop()
        out += len(node.tokens) + 4 * node.kv[1]
        stack.extend(node.children.values())
    return out
