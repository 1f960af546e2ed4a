"""The prefix tree against brute force: longest common prefixes computed naively over the stored sequences.

The KV payload is a list with one entry per position, entry i = the tuple tokens[:i + 1] (what the KV of a causal
model at position i depends on), so a reused piece is right exactly when it equals the query's own prefixes.
"""

from __future__ import annotations

import random

import pytest

from freetoken.serve.prefix_cache import PrefixCache


def naive_lcp(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def kv_of(tokens):
    """read_kv for a sequence; records which ranges were asked for."""
    asked = []

    def read(start, stop):
        asked.append((start, stop))
        return [tuple(tokens[: i + 1]) for i in range(start, stop)]

    return read, asked


def flat(pieces):
    return [x for p in pieces for x in p]


def insert(cache, tokens, anchors=()):
    read, asked = kv_of(tokens)
    added = cache.insert(tokens, read, anchors)
    return added, asked


def random_conversations(rng, n, vocab=4):
    """Sequences sharing prefixes often (small vocab, branching off earlier sequences)."""
    seqs = []
    for _ in range(n):
        if seqs and rng.random() < 0.7:
            base = rng.choice(seqs)
            seq = list(base[: rng.randint(0, len(base))])
        else:
            seq = []
        seq += [rng.randrange(vocab) for _ in range(rng.randint(1, 12))]
        seqs.append(seq)
    return seqs


@pytest.mark.parametrize("seed", range(5))
def test_match_equals_naive_lcp_without_eviction(seed):
    rng = random.Random(seed)
    cache = PrefixCache(budget_tokens=10**9)
    stored = []
    for seq in random_conversations(rng, 60):
        query = seq if rng.random() < 0.5 else seq[: rng.randint(1, len(seq))] + [rng.randrange(4)]
        expect = min(max((naive_lcp(s, query) for s in stored), default=0), len(query) - 1)
        m = cache.match(query)
        assert m.length == expect
        assert flat(m.kv) == [tuple(query[: i + 1]) for i in range(expect)]
        anchors = sorted(rng.sample(range(1, len(seq) + 1), k=min(2, len(seq))))
        added, asked = insert(cache, seq, anchors)
        # only the uncached tail is read from the engine, in contiguous pieces starting where the cache ended
        shared = max((naive_lcp(s, seq) for s in stored), default=0)
        assert added == len(seq) - shared
        assert sum(b - a for a, b in asked) == added
        if asked:
            assert asked[0][0] == shared and asked[-1][1] == len(seq)
        stored.append(seq)
    # the tree holds exactly the distinct tokens of the union of prefixes
    assert cache.cached_tokens == len({tuple(s[: i + 1]) for s in stored for i in range(len(s))})


@pytest.mark.parametrize("seed", range(5))
def test_eviction_keeps_budget_and_matches_what_remains(seed):
    rng = random.Random(100 + seed)
    budget = 25
    cache = PrefixCache(budget_tokens=budget)
    inserted = []
    for seq in random_conversations(rng, 80):
        insert(cache, seq, anchors=range(3, len(seq), 3))
        inserted.append(seq)
        assert cache.cached_tokens <= budget
        remaining = cache.sequences()
        # what is cached is a prefix of something inserted, and counted right
        for r in remaining:
            assert any(list(r) == s[: len(r)] for s in inserted)
        assert cache.cached_tokens == len({r[: i + 1] for r in remaining for i in range(len(r))})
        query = rng.choice(inserted)[: rng.randint(1, 12)] + [rng.randrange(4)]
        expect = min(max((naive_lcp(r, query) for r in remaining), default=0), len(query) - 1)
        m = cache.match(query)
        assert m.length == expect
        assert flat(m.kv) == [tuple(query[: i + 1]) for i in range(expect)]


def test_lru_leaf_goes_first_and_the_inserted_prefix_survives():
    cache = PrefixCache(budget_tokens=10)
    insert(cache, [1, 1, 1, 1, 1, 1])
    insert(cache, [2, 2, 2, 2])
    cache.match([2, 2, 2, 2, 9])  # touch B: A is now least recent
    added, _ = insert(cache, [3, 3, 3, 3, 3])  # needs 5 more: A (6 tokens) goes
    assert added == 5
    assert sorted(cache.sequences()) == [(2, 2, 2, 2), (3, 3, 3, 3, 3)]
    assert cache.stats.evicted_tokens == 6
    # a sequence longer than the whole budget keeps its prefix, not its tail
    added, _ = insert(cache, list(range(100, 120)))
    assert added == 10 and cache.sequences() == [tuple(range(100, 110))]


def test_anchors_cut_runs_and_an_edit_reuses_every_message_before_it():
    # three "messages": [0, 4), [4, 9), [9, 13)
    conv = [7, 7, 7, 7, 1, 2, 3, 4, 5, 8, 8, 8, 8]
    cache = PrefixCache(budget_tokens=100)
    insert(cache, conv, anchors=[4, 9, 13])
    assert cache.node_runs() == [(0, 4), (4, 9), (9, 13)]
    edited = conv[:6] + [99] + conv[7:]  # edit inside the second message, at offset 6
    m = cache.match(edited)
    assert m.length == 6 and m.anchor == 4  # re-prefill starts at the edit, after the nearest anchor before it
    assert flat(m.kv) == [tuple(edited[: i + 1]) for i in range(6)]
    added, asked = insert(cache, edited, anchors=[4, 9, 13])
    assert added == 7 and asked == [(6, 9), (9, 13)]
    # the second message's run was cut at the edit; the shared part is counted once
    assert cache.node_runs() == [(0, 4), (4, 6), (6, 9), (6, 9), (9, 13), (9, 13)]
    assert cache.cached_tokens == 4 + 2 + 3 + 4 + 3 + 4
    # eviction under pressure drops a whole message tail, least recent first
    cache.match(edited)
    cache.budget_tokens = cache.cached_tokens
    insert(cache, [5, 5, 5, 5], anchors=[4])
    assert sorted(cache.sequences()) == sorted([tuple(conv[:9]), tuple(edited), (5, 5, 5, 5)])


def test_anchor_inside_a_cached_run_becomes_a_boundary():
    cache = PrefixCache(budget_tokens=100)
    insert(cache, [1, 2, 3, 4, 5, 6])
    m = cache.match([1, 2, 3, 4, 5, 6, 7])
    assert m.length == 6 and m.anchor == 0
    insert(cache, [1, 2, 3, 4, 5, 6, 7, 8], anchors=[3, 8])
    assert cache.node_runs() == [(0, 3), (3, 6), (6, 8)]
    assert cache.match([1, 2, 3, 4, 0]).anchor == 3


def test_counters_of_reused_and_computed_tokens():
    cache = PrefixCache(budget_tokens=100)
    first = list(range(10))
    cache.match(first)
    insert(cache, first + [50, 51])  # prompt + generated tokens
    second = first + [50, 51, 60, 61, 62]
    m = cache.match(second)
    assert m.length == 12
    s = cache.stats
    assert (s.lookups, s.hit_lookups, s.reused_tokens, s.computed_tokens) == (2, 1, 12, 10 + 3)
    # an identical prompt still leaves its last token to compute
    assert cache.match(first + [50, 51]).length == 11


def test_budget_validation():
    with pytest.raises(ValueError, match="budget_tokens"):
        PrefixCache(-1)
