"""Placement policies plan by plan against brute-force references written here (plain lists, no policy code).

The references restate the set-access model of freetoken.placement.policy from its definition:
hit/miss fixed at the call's start; the split picks the fetched misses; accesses apply in call order;
a fetched key takes the lowest never-used slot, else the slot of the least recent resident that is
not a key of the current call, else a staging buffer (-1). Belady is checked against an exhaustive
search over every caching / eviction choice of the same model: the true optimum.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from freetoken.placement import Belady, Call, Split, key_stream, make_policy
from freetoken.trace import RoutingTrace
from freetoken.trace.stats import expert_counts
from freetoken.sim.calls import trace_calls
from freetoken.sim.replay import replay

SPLITS = {
    "offload": Split("offload"),
    "cpu": Split("cpu"),
    "hybrid-balanced": Split("hybrid", "balanced", bp=20.0, bh=30.0, fetch_order="most_tokens"),
    "hybrid-recent": Split("hybrid", "balanced", bp=30.0, bh=20.0, fetch_order="most_recent"),
    "hybrid-max1": Split("hybrid", "max_fetch", max_fetch=1, fetch_order="lowest_id"),
}


def random_trace(seed: int, T: int = 40, L: int = 3, E: int = 6, K: int = 2, skew: float = 1.2) -> RoutingTrace:
    """Two requests, each a prefill run then a decode run; experts drawn with a skew so reuse happens."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, E + 1) ** skew
    ex = np.empty((T, L, K), np.int16)
    for t in range(T):
        for layer in range(L):
            perm = rng.permutation(E)  # a different popular set per layer
            ex[t, layer] = perm[rng.choice(E, K, replace=False, p=weights / weights.sum())]
    half = T // 2
    request = np.repeat(np.array([0, 1], np.int32), [half, T - half])
    phase = np.zeros(T, np.int8)
    phase[half // 2:half] = 1
    phase[half + (T - half) // 3:] = 1
    return RoutingTrace(ex, E, request=request, phase=phase)


# references
def ref_fetch(split: Split, experts, tokens, last_use) -> set[int]:
    """Indices of the misses to fetch, from the split's definition (integer argmin for balanced)."""
    m = len(experts)
    if split.mode == "offload":
        q = m
    elif split.mode == "cpu":
        q = 0
    elif split.rule == "balanced":
        q = min(range(m + 1), key=lambda q: (max(q / split.bp, (m - q) / split.bh), q))
    else:
        q = min(m, split.max_fetch)
    rank = {"most_tokens": lambda i: (-tokens[i], experts[i]), "most_recent": lambda i: (-last_use[i], experts[i]),
            "lowest_id": lambda i: experts[i]}[split.fetch_order]
    return set(sorted(range(m), key=rank)[:q])


class RefCache:
    """The set-access cache from its definition. pinned: slots fixed up front, nothing is ever admitted."""

    def __init__(self, capacity: int, E: int, pinned: list[int] | None = None):
        self.capacity, self.E = capacity, E
        self.admits = pinned is None
        self.stack: list[int] = [] if pinned is None else list(pinned)  # least recent first
        self.slot = {k: i for i, k in enumerate(self.stack)}
        self.fresh = len(self.stack)  # next never-used slot
        self.clock = 0
        self.last_use: dict[int, int] = {}

    def plan(self, call: Call, split: Split):
        E = self.E
        keys = [call.layer * E + e for e in call.experts]
        resident = [k in self.slot for k in keys]
        miss = [i for i, r in enumerate(resident) if not r]
        picked = ref_fetch(split, [call.experts[i] for i in miss], [call.tokens[i] for i in miss],
                           [self.last_use.get(keys[i], -1) for i in miss])
        fetched = {miss[j] for j in picked}
        hits, hit_slots, fetch, fetch_slots, cpu, evict = [], [], [], [], [], []
        for i, key in enumerate(keys):
            e = call.experts[i]
            if resident[i]:
                hits.append(e)
                hit_slots.append(self.slot[key])
                if self.admits:
                    self.stack.remove(key)
                    self.stack.append(key)
            elif i in fetched:
                fetch.append(e)
                fetch_slots.append(self._admit(key, set(keys), evict))
            else:
                cpu.append(e)
            self.last_use[key] = self.clock
            self.clock += 1
        return hits, hit_slots, fetch, fetch_slots, cpu, evict

    def _admit(self, key: int, call_keys: set[int], evict: list) -> int:
        if not self.admits:
            return -1
        if len(self.stack) < self.capacity:
            slot = self.fresh
            self.fresh += 1
        else:
            victims = [k for k in self.stack if k not in call_keys]
            if not victims:
                return -1
            out = victims[0]
            self.stack.remove(out)
            slot = self.slot.pop(out)
            evict.append((out // self.E, out % self.E))
        self.stack.append(key)
        self.slot[key] = slot
        return slot


def ref_static_layers(capacity: int, L: int, E: int) -> list[int]:
    n_cpu = L - min(L, capacity // E)  # the smallest number of CPU layers whose other layers fit
    return [layer * E + e for layer in range(n_cpu, L) for e in range(E)]


def ref_frequency(counts: np.ndarray, capacity: int, scope: str, strategy: str = "frequency") -> list[int]:
    """Brute force of the pinning rules: per layer the top capacity // L by (count desc, expert), then every
    leftover slot to the hottest remaining key (count desc, key); uniform = that on all-zero counts;
    front_loading = the first `capacity` keys."""
    L, E = counts.shape
    capacity = min(capacity, L * E)
    if strategy == "front_loading":
        return list(range(capacity))
    c = (np.zeros_like(counts) if strategy == "uniform" else counts).tolist()
    if scope == "per_layer":
        keys = [layer * E + e for layer in range(L)
                for e in sorted(range(E), key=lambda e: (-c[layer][e], e))[:capacity // L]]
        rest = sorted((-c[k // E][k % E], k) for k in range(L * E) if k not in keys)
        return keys + [k for _, k in rest[:capacity - len(keys)]]
    flat = [(-c[k // E][k % E], k) for k in range(L * E)]
    return [k for _, k in sorted(flat)[:capacity]]


def ref_reference(policy: str, capacity: int, trace: RoutingTrace, scope: str = "per_layer",
                  strategy: str = "frequency") -> RefCache:
    E = trace.num_experts
    if policy == "lru":
        return RefCache(capacity, E)
    if policy == "static_layers":
        return RefCache(capacity, E, ref_static_layers(capacity, trace.num_layers, E))
    return RefCache(capacity, E, ref_frequency(expert_counts(trace), capacity, scope, strategy))


def plan_tuple(plan):
    return plan.hits, plan.hit_slots, plan.fetch, plan.fetch_slots, plan.cpu, plan.evict


# plan by plan
CASES = [("lru", {}), ("static_layers", {}), ("frequency", {"scope": "per_layer"}), ("frequency", {"scope": "global"}),
         ("frequency", {"scope": "per_layer", "strategy": "uniform"}),
         ("frequency", {"scope": "per_layer", "strategy": "front_loading"})]


@pytest.mark.parametrize("policy, options", CASES,
                         ids=lambda x: x if isinstance(x, str) else x.get("strategy", x.get("scope", "-")))
@pytest.mark.parametrize("split_name", list(SPLITS))
def test_plans_match_reference(policy, options, split_name):
    split = SPLITS[split_name]
    for seed in range(4):
        trace = random_trace(seed)
        calls = list(trace_calls(trace, prefill_chunk=3))
        for capacity in (0, 1, 4, 6, 7, 12, 17, trace.num_keys):
            opts = dict(options)
            if policy == "frequency":
                opts["profile"] = expert_counts(trace)
            ours = replay(calls, make_policy(policy, capacity, trace.num_layers, trace.num_experts, **opts), split,
                          keep_plans=True)
            ref = ref_reference(policy, capacity, trace, options.get("scope", "per_layer"),
                                options.get("strategy", "frequency"))
            for c, (call, plan) in enumerate(zip(calls, ours.plans)):
                want = ref.plan(call, split)
                assert plan_tuple(plan) == want, (f"{policy} {options} {split_name} seed {seed} capacity {capacity} "
                                                  f"call {c} {call}")
            hits = sum(len(p.hits) for p in ours.plans)
            assert ours.total.hits == hits and ours.total.accesses == sum(len(c.experts) for c in calls)


def test_reference_sees_reuse():
    """The random traces are not degenerate: LRU hits some and misses some at a middle capacity."""
    trace = random_trace(0)
    calls = list(trace_calls(trace, prefill_chunk=3))
    ref = RefCache(7, trace.num_experts)
    hits = sum(len(ref.plan(c, SPLITS["offload"])[0]) for c in calls)
    total = sum(len(c.experts) for c in calls)
    assert 0.2 * total < hits < 0.8 * total


# belady: a bound
def belady_misses(calls, trace, capacity, bypass):
    future = key_stream(calls, trace.num_experts)
    pol = Belady(capacity, trace.num_layers, trace.num_experts, future=future, bypass=bypass)
    return replay(calls, pol, Split("offload")).total.misses


@pytest.mark.slow
def test_belady_never_worse_than_online_policies():
    """Belady starts cold; static_layers and frequency start with their pinned keys loaded for free. So the
    fair bound is: belady misses <= the policy's misses + the pinned keys the trace ever asks for (an offline
    policy can copy a pinned one, paying one miss per pinned key at its first use)."""
    for seed in range(6):
        trace = random_trace(seed + 10, T=60)
        calls = list(trace_calls(trace, prefill_chunk=4))
        accessed = set(key_stream(calls, trace.num_experts).keys.tolist())
        largest = max(len(c.experts) for c in calls)
        L, E = trace.num_layers, trace.num_experts
        for capacity in range(0, trace.num_keys + 1):
            bypass = belady_misses(calls, trace, capacity, True)
            for policy, options in CASES:
                opts = dict(options)
                if policy == "frequency":
                    opts["profile"] = expert_counts(trace)
                    warm = ref_frequency(expert_counts(trace), capacity, options["scope"],
                                         options.get("strategy", "frequency"))
                else:
                    warm = [] if policy == "lru" else ref_static_layers(capacity, L, E)
                misses = replay(calls, make_policy(policy, capacity, L, E, **opts), Split("offload")).total.misses
                allowance = len(accessed & set(warm))
                assert bypass <= misses + allowance, (f"seed {seed} capacity {capacity}", policy, options)
                if policy == "lru" and capacity >= largest:  # classic MIN against the other always-caching policy
                    assert belady_misses(calls, trace, capacity, False) <= misses, f"seed {seed} capacity {capacity}"


def optimum(calls_keys: tuple[tuple[int, ...], ...], capacity: int, bypass: bool) -> int:
    """Fewest misses over every choice: per fetched key, a free slot or any resident not in the call
    (or, with bypass, staging); without bypass, staging only when neither exists."""

    @functools.lru_cache(maxsize=None)
    def best(c: int, resident: frozenset) -> int:
        if c == len(calls_keys):
            return 0
        call = set(calls_keys[c])
        misses = [k for k in calls_keys[c] if k not in resident]
        outcomes: set[frozenset] = set()

        def choose(i: int, held: frozenset) -> None:
            if i == len(misses):
                outcomes.add(held)
                return
            x = misses[i]
            options = [held | {x}] if len(held) < capacity else [(held - {y}) | {x} for y in held if y not in call]
            if bypass or not options:
                options.append(held)
            for o in options:
                choose(i + 1, frozenset(o))

        choose(0, resident)
        return len(misses) + min(best(c + 1, s) for s in outcomes)

    return best(0, frozenset())


def tiny_cases(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        E = int(rng.integers(3, 7))
        calls = []
        for _ in range(int(rng.integers(3, 9))):
            a = int(rng.integers(1, 4))
            calls.append(Call(0, [int(e) for e in rng.choice(E, min(a, E), replace=False)], [1] * min(a, E)))
        yield E, calls, int(rng.integers(1, E))


def tiny_trace(E):
    return RoutingTrace(np.zeros((1, 1, 1), np.int16), E)  # only its shape is read


def test_belady_without_bypass_is_optimal_from_the_largest_call():
    """Classic MIN (always cache) equals the exhaustive optimum of the no-bypass model for every
    capacity >= the largest call (hundreds of random tiny traces)."""
    checked = 0
    for E, calls, capacity in tiny_cases(600):
        if capacity < max(len(c.experts) for c in calls):
            continue
        keys = tuple(tuple(c.experts) for c in calls)
        assert belady_misses(calls, tiny_trace(E), capacity, False) == optimum(keys, capacity, False), (keys, capacity)
        checked += 1
    assert checked > 150


# Counterexamples to the first rule (call-order admission, ties by key), found by the exhaustive search and
# checked by hand; the current rule (soonest-needed admission with bypass, ties by the following uses) meets each.
FORMER_COUNTEREXAMPLES = [
    # bypass, capacity >= largest call: call 1 puts 4 (never used again) in the free slot; 4 is then a key of the
    # current call and cannot make room for 3, which bypasses since resident 0 is needed sooner. Optimum: bypass 4,
    # cache 3: 1 + 2 + 1 + 0 = 4 misses (the first rule: 5).
    pytest.param(True, 2, ((0,), (4, 3), (2, 0), (3,)), 4, id="bypass-free-slot"),
    # bypass, capacity >= largest call, a tie in call-granular next use: at call 2, residents 2, 0 and miss 1 are all
    # next needed at call 3; keeping 2 and 0 (ties by key) is worse: 1 and 2 are needed again at call 4 and 0 is not.
    # Optimum: cache 1 over 0 at call 2: 1 + 2 + 1 + 1 + 0 = 5 (the first rule: 6).
    pytest.param(True, 3, ((2,), (2, 3, 0), (1, 3), (1, 2, 0), (1, 3, 2)), 5, id="bypass-call-granular-tie"),
    # bypass, capacity below a call: call 0 filled its 2 slots in call order (1, 0), 2 went to staging; optimum keeps
    # 2 (needed at call 1) and one of 0, 1 (call 2): 3 + 0 + 1 = 4 (the first rule: 5).
    pytest.param(True, 2, ((1, 0, 2), (2,), (0, 2, 1)), 4, id="bypass-overflowing-call"),
    # no bypass, capacity below a call, with a tie: at call 2, 0 and 2 are both next needed at call 3 (and again at
    # call 4); evicting 0 (ties by key) is worse, 0 is needed a third time at call 5 and 2 is not.
    # Optimum: evict 2 at call 2: 1 + 1 + 1 + 2 + 1 + 1 = 7 (the first rule: 8).
    pytest.param(False, 2, ((0,), (2,), (4,), (1, 0, 2), (0, 2, 1), (3, 0)), 7, id="min-overflowing-call"),
]

# Still not optimal: capacity below a call with a tie deeper than the TIE_DEPTH (3) uses compared. bypass, capacity 1: at call 1, 1
# and 2 are next needed at calls 2, 3 and 4 alike; 2 again at call 5, 1 never. Belady keeps 1 (a tie on all three
# uses it compares, then the lower key): 1 + 1 + 2 + 1 + 2 + 1 = 8. Keeping 2: 1 + 1 + 2 + 1 + 2 + 0 = 7.
NOT_OPTIMAL = [pytest.param(True, 1, ((1,), (2,), (2, 1, 0), (2, 1), (1, 0, 2), (2,)), 7, id="deep-tie-below-call")]


@pytest.mark.parametrize("bypass, capacity, keys, best", FORMER_COUNTEREXAMPLES + NOT_OPTIMAL)
def test_optimum_of_the_counterexamples(bypass, capacity, keys, best):
    """The exhaustive search's optimum, checked by hand in the comments above."""
    assert optimum(keys, capacity, bypass) == best


def counterexample_misses(bypass, capacity, keys):
    calls = [Call(0, list(k), [1] * len(k)) for k in keys]
    return belady_misses(calls, tiny_trace(1 + max(max(k) for k in keys)), capacity, bypass)


@pytest.mark.parametrize("bypass, capacity, keys, best", FORMER_COUNTEREXAMPLES)
def test_belady_meets_the_former_counterexamples(bypass, capacity, keys, best):
    assert counterexample_misses(bypass, capacity, keys) == best


@pytest.mark.xfail(strict=True, reason="ties are broken on the next TIE_DEPTH uses only")
@pytest.mark.parametrize("bypass, capacity, keys, best", NOT_OPTIMAL)
def test_belady_is_optimal_on_the_counterexamples(bypass, capacity, keys, best):
    assert counterexample_misses(bypass, capacity, keys) == best


def test_belady_bypass_is_optimal_from_the_largest_call():
    """With bypass (the study's bound), from the largest call up: the exhaustive optimum on every random tiny
    trace, and never above classic MIN."""
    checked = 0
    for E, calls, capacity in tiny_cases(400, seed=1):
        if capacity < max(len(c.experts) for c in calls):
            continue
        keys = tuple(tuple(c.experts) for c in calls)
        got = belady_misses(calls, tiny_trace(E), capacity, True)
        assert got == optimum(keys, capacity, True), (keys, capacity)
        assert got <= belady_misses(calls, tiny_trace(E), capacity, False), keys
        checked += 1
    assert checked > 150


def test_belady_below_the_largest_call_is_near_optimal():
    """Below the largest call (capacity < a call's experts) the rule can miss the optimum by deep ties: rare, and
    by one miss on these cases."""
    gaps = checked = 0
    for E, calls, capacity in tiny_cases(300, seed=2):
        if capacity >= max(len(c.experts) for c in calls):
            continue
        keys = tuple(tuple(c.experts) for c in calls)
        got, best = belady_misses(calls, tiny_trace(E), capacity, True), optimum(keys, capacity, True)
        assert best <= got <= best + 1, keys
        gaps += got > best
        checked += 1
    assert checked > 100 and gaps <= checked // 20


def test_optimum_search_agrees_with_min_on_sequential_streams():
    """Sanity of the search itself: with one key per call it is classic paging, where MIN is optimal."""
    rng = np.random.default_rng(3)
    for _ in range(60):
        seq = tuple((int(k),) for k in rng.integers(0, 5, int(rng.integers(4, 12))))
        capacity = int(rng.integers(1, 4))
        calls = [Call(0, list(k), [1]) for k in seq]
        for bypass in (False, True):
            assert belady_misses(calls, tiny_trace(5), capacity, bypass) == optimum(seq, capacity, bypass)


# the fair frequency rule, by hand
@pytest.mark.parametrize("strategy, scope, want", [
    ("frequency", "per_layer", [0, 4, 2]),  # layer tops 0 and 4 (tie 2/2 -> lower expert), the leftover to key 2
    ("frequency", "global", [0, 2, 4]),
    ("uniform", "per_layer", [0, 3, 1]),  # expert 0 of each layer, the leftover to the lowest key left
    ("front_loading", "per_layer", [0, 1, 2])])
def test_pinned_set_by_hand(strategy, scope, want):
    counts = np.array([[5, 1, 3], [0, 2, 2]])
    pol = make_policy("frequency", 3, 2, 3, profile=counts, scope=scope, strategy=strategy)
    assert sorted(pol.slot_of, key=pol.slot_of.__getitem__) == want
    assert ref_frequency(counts, 3, scope, strategy) == want


def test_every_slot_used():
    """Every strategy fills all capacity slots (the old per_layer rule left capacity % L empty)."""
    counts = expert_counts(random_trace(3))
    L, E = counts.shape
    for strategy in ("frequency", "uniform", "front_loading"):
        for capacity in range(L * E + 1):
            pol = make_policy("frequency", capacity, L, E, profile=counts, strategy=strategy)
            assert len(pol.slot_of) == capacity, (strategy, capacity)


def test_bad_strategy_is_one_line():
    with pytest.raises(ValueError, match="strategy 'random' is not one of frequency, uniform, front_loading"):
        make_policy("frequency", 3, 2, 3, profile=np.ones((2, 3)), strategy="random")
