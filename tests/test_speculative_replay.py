"""Speculative decoding in the replay (sim.speculative): verify calls of d + 1 tokens, drafts accepted with
probability a in order, by hand, against a brute-force re-draw and against the closed-form expectation."""

import subprocess
import sys

import numpy as np
import pytest

from freetoken.placement import Split, make_call, make_policy
from freetoken.trace import DECODE, PREFILL, RoutingTrace
from freetoken.sim.batch import Speculation
from freetoken.sim.replay import replay
from freetoken.sim.run import SimConfig, simulate
from freetoken.sim.calls import steps_stream
from freetoken.sim.speculative import draft_rows, speculative_steps


def trace_of(experts, request, phase, num_experts=8) -> RoutingTrace:
    return RoutingTrace(np.asarray(experts, np.int16), num_experts, request=np.asarray(request, np.int32),
                        phase=np.asarray(phase, np.int8))


def random_trace(tokens=40, layers=3, experts=8, k=2, requests=2, prefill=4, seed=1) -> RoutingTrace:
    rng = np.random.default_rng(seed)
    x = np.stack([np.stack([rng.choice(experts, k, replace=False) for _ in range(layers)]) for _ in range(tokens)])
    per = tokens // requests
    request = np.repeat(np.arange(requests), per)
    phase = np.tile(np.r_[np.full(prefill, PREFILL), np.full(per - prefill, DECODE)], requests)
    return trace_of(x, request, phase, experts)


def test_full_acceptance_verifies_consecutive_groups_by_hand():
    # one sequence of 5 decode tokens, d = 2, a = 1: steps [0 1 2] (2 accepted), [3 4 x] (1 accepted: the draft
    # past the end is another token, never the current one 3)
    t = random_trace(tokens=5, requests=1, prefill=0)
    steps, acc = draft_rows(0, 5, Speculation(2, 1.0), np.random.default_rng(0))
    assert [s.tolist()[:2] for s in steps] == [[0, 1], [3, 4]] and steps[0].tolist() == [0, 1, 2]
    assert acc == [2, 1] and steps[1][2] in (0, 1, 2, 4)
    got = speculative_steps(t, Speculation(2, 1.0), 8, seed=0)
    assert got.verify_steps == 2 and got.decode_tokens == 5


def test_verify_call_is_the_union_of_its_rows():
    t = random_trace()
    steps = speculative_steps(t, Speculation(3, 0.7), 3, seed=5)
    calls = list(steps_stream(t, steps).calls())
    assert len(calls) == len(steps.phase) * t.num_layers
    for g in range(len(steps.phase)):
        rows = steps.rows[steps.offsets[g]:steps.offsets[g + 1]]
        for layer in range(t.num_layers):
            want = make_call(layer, t.experts[rows, layer], int(steps.phase[g]), int(t.request[rows[0]]))
            got = calls[g * t.num_layers + layer]
            assert (got.layer, got.experts, got.tokens, got.phase, got.request) == \
                (want.layer, want.experts, want.tokens, want.phase, want.request)
    # prefill chunks of 3 over the 4 prefill tokens of each request: [0 1 2] [3], then the decode steps
    assert steps.rows[:4].tolist() == [0, 1, 2, 3] and steps.phase[:2].tolist() == [PREFILL, PREFILL]


def test_zero_acceptance_drafts_other_tokens_of_the_sequence():
    steps, acc = draft_rows(10, 16, Speculation(3, 0.0), np.random.default_rng(2))
    assert acc == [0] * 6 and [s[0] for s in steps] == list(range(10, 16))
    for s in steps:
        t = s[0]
        assert all(10 <= r < 16 and r != (t + j if t + j < 16 else t) for j, r in enumerate(s[1:].tolist(), 1))


def brute_accepted(lo, hi, d, a, seed):
    """An independent re-draw: per step the same two draws, k = the leading drafts with u < a inside the sequence."""
    rng, t, out = np.random.default_rng(seed), lo, []
    while t < hi:
        u = rng.random(d)
        rng.integers(0, max(hi - lo - 1, 1), size=d)
        k = 0
        while k < d and t + k + 1 < hi and u[k] < a:
            k += 1
        out.append(k)
        t += k + 1
    return out


@pytest.mark.parametrize("d,a,seed", [(1, 0.6, 0), (3, 0.8, 7), (4, 0.5, 3)])
def test_accepted_counts_equal_a_brute_force_redraw(d, a, seed):
    _, acc = draft_rows(100, 400, Speculation(d, a), np.random.default_rng(seed))
    assert acc == brute_accepted(100, 400, d, a, seed)
    assert sum(k + 1 for k in acc) == 300  # every token produced once


def test_mean_accepted_matches_the_closed_form():
    # E[k] = a + a^2 + ... + a^d on a long sequence (the end effect is one step in 20,000)
    d, a = 3, 0.6
    _, acc = draft_rows(0, 60_000, Speculation(d, a), np.random.default_rng(11))
    want = sum(a ** j for j in range(1, d + 1))  # 1.176
    sd = np.std(acc) / np.sqrt(len(acc))
    assert abs(np.mean(acc) - want) < 4 * sd


@pytest.mark.parametrize("policy", ["lru", "lookahead"])
def test_simulate_replays_the_verify_calls(policy):
    t = random_trace(tokens=60, layers=4, requests=2, prefill=6)
    config = SimConfig(policy, Split("offload"), fraction=0.25, prefill_chunk=4, draft_depth=2, acceptance=0.7,
                       draft_seed=3)
    got = simulate(t, config).total
    stream, _ = config.speculative_stream(t)
    options = {"future": stream.key_stream()} if policy == "lookahead" else {}
    ref = make_policy(policy, config.slots_for(4, 8), 4, 8, reference=True, **options)
    want = replay(stream.calls(), ref, Split("offload")).total
    assert (got.misses, got.prefetched, got.accesses) == (want.misses, want.prefetched, want.accesses)
    plain = simulate(t, SimConfig(policy, Split("offload"), fraction=0.25, prefill_chunk=4)).total
    exact = simulate(t, SimConfig(policy, Split("offload"), fraction=0.25, prefill_chunk=4, draft_depth=2)).total
    assert exact.accesses < plain.accesses  # a = 1: verify calls share the experts their tokens have in common


@pytest.mark.parametrize("flags,message", [
    (["--draft-depth", "-1"], "--draft-depth must be >= 0"),
    (["--draft-depth", "2", "--acceptance", "1.5"], "--acceptance must lie in [0, 1]"),
    (["--acceptance", "0.5"], "--acceptance needs --draft-depth"),
])
def test_cli_rejects_bad_speculation_flags_in_one_line(flags, message):
    r = subprocess.run([sys.executable, "-m", "freetoken.cli", "sim", *flags], capture_output=True, text=True)
    assert r.returncode != 0 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_batched_verify_steps_by_hand():
    """2 sequences of 1 prefill + 4 decode tokens, batch 2, drafts of 1 always right: after both prefills, each
    step verifies both sequences' token and draft in one group, and the steps make every decode token once."""
    from freetoken.sim.continuous import batched_steps

    t = trace_of(np.zeros((10, 1, 1)), [0] * 5 + [1] * 5, [PREFILL] + [DECODE] * 4 + [PREFILL] + [DECODE] * 4)
    steps = batched_steps(t, 2, 8, Speculation(1, 1.0))
    groups = [steps.rows[a:b].tolist() for a, b in zip(steps.offsets[:-1], steps.offsets[1:])]
    assert groups == [[0], [5], [1, 2, 6, 7], [3, 4, 8, 9]]
    assert steps.accepted.tolist() == [0, 0, 2, 2] and steps.produced.tolist() == [0, 0, 4, 4]
    assert steps.decode_tokens == 8


@pytest.mark.parametrize("a", [0.0, 0.6, 1.0])
def test_batch_with_drafts_replays_its_calls_and_makes_every_token(a):
    """batch + drafts: simulate() = a reference replay of the stream it builds; every decode row is made once."""
    from freetoken.sim.continuous import batched_steps

    t = random_trace(tokens=90, layers=3, requests=3, prefill=5)
    config = SimConfig("lru", Split("offload"), fraction=0.25, prefill_chunk=4, batch=2, draft_depth=2,
                       acceptance=a, draft_seed=1)
    steps = batched_steps(t, 2, 4, Speculation(2, a), seed=1)
    assert steps.decode_tokens == int((t.phase == DECODE).sum())
    got = simulate(t, config).total
    ref = make_policy("lru", config.slots_for(3, 8), 3, 8, reference=True)
    want = replay(steps_stream(t, steps).calls(), ref, Split("offload")).total
    assert (got.misses, got.accesses) == (want.misses, want.accesses)
    plain = simulate(t, SimConfig("lru", Split("offload"), fraction=0.25, prefill_chunk=4, batch=2)).total
    assert got.accesses != plain.accesses  # the drafts change the calls


@pytest.mark.parametrize("batch", [1, 3])
def test_interpreted_replay_counts_every_token_of_a_verify_call(batch):
    # a verify (or batched) decode call routes several tokens: the interpreted replay's token columns are the
    # (token, expert) pairs of its rows, counted here from the trace, and equal the compiled replay's
    t = random_trace(tokens=60, layers=3, experts=8, k=2, requests=3, prefill=4, seed=7)
    config = SimConfig(policy="lru", capacity=7, split=Split(), prefill_chunk=3, draft_depth=2, acceptance=0.5,
                       batch=batch)
    from freetoken.sim.run import call_stream

    stream = call_stream(t, config)[0]
    calls = list(stream.calls())
    ref = replay(calls, make_policy("lru", 7, t.num_layers, t.num_experts, reference=True), config.split,
                 keep_plans=True)
    fast = simulate(t, config)
    multi = 0
    for c, (call, plan) in enumerate(zip(calls, ref.plans)):
        per = dict(zip(call.experts, call.tokens))
        assert ref.log.tokens[c] == sum(call.tokens)
        assert ref.log.hit_tokens[c] == sum(per[e] for e in plan.hits)
        assert ref.log.fetch_tokens[c] == sum(per[e] for e in plan.fetch)
        multi += call.phase == DECODE and sum(call.tokens) > len(call.experts)
    assert multi > 0  # verify calls where an expert serves several of the step's tokens
    for name in ("tokens", "hit_tokens", "fetch_tokens", "cpu_tokens", "hits", "fetched"):
        assert np.array_equal(getattr(ref.log, name), getattr(fast.log, name)), name
