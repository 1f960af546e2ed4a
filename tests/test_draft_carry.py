"""Cross-step carry (sim/carry.py, placement/carry.py): the rejected drafts of a verify step named for the next
step's calls, by hand, against a brute-force rebuild from the accepted counts, and compiled == reference."""

import numpy as np
import pytest

from freetoken.placement import DECODE, POLICIES, PREFILL, CompiledPolicy, KeyStream, Split, make_policy
from freetoken.placement.carry import LiveCarry
from freetoken.trace import RoutingTrace
from freetoken.sim.batch import Speculation
from freetoken.sim.calls import Steps, steps_stream
from freetoken.sim.carry import carry_stream, carry_tally, recorded_steps
from freetoken.sim.continuous import batched_steps
from freetoken.sim.replay import replay
from freetoken.sim.run import SimConfig, replay_setup, simulate
from freetoken.sim.speculative import speculative_steps

E = 8


def hand_trace() -> RoutingTrace:
    """6 decode rows of one sequence, 2 layers, top-1 (layer 0, layer 1)."""
    x = np.array([[1, 2], [3, 4], [5, 6], [7, 0], [1, 5], [2, 3]], np.int16)[:, :, None]
    return RoutingTrace(x, E, request=np.zeros(6, np.int32), phase=np.full(6, DECODE, np.int8))


def hand_steps() -> Steps:
    # step 0: true 0, draft 1 accepted, draft 4 rejected; step 1: true 2, drafts 3 and 5 rejected; step 2: true 3
    return Steps.of([np.array([0, 1, 4]), np.array([2, 3, 5]), np.array([3])], [DECODE] * 3, [1, 0, 0],
                    draft=[np.array([0, 1, 2]), np.array([0, 2, 2]), np.array([0])])


def test_carry_by_hand():
    carry = carry_stream(hand_trace(), hand_steps())
    per_call = [carry.keys[a:b].tolist() for a, b in zip(carry.offsets[:-1], carry.offsets[1:])]
    # step 0 carries nothing; step 1 row 4's experts (layer 0: 1, layer 1: 8 + 5); step 2 rows 3, 5 in order
    assert per_call == [[], [], [1], [13], [7, 2], [8, 11]]


@pytest.mark.parametrize("depth", [1, 2])
def test_hint_inside_the_sweep_by_hand(depth):
    """lookahead at accuracy 1: layer 0's call is told layer 1's true keys of its own step, then the keys carried
    into that call; layer 1 (the sweep's last) is told nothing, and depth 2 reaches no further in 2 layers."""
    trace, steps = hand_trace(), hand_steps()
    stream = steps_stream(trace, steps)
    pol = make_policy("lookahead", 4, 2, E, reference=True, accuracy=1.0, depth=depth,
                      future=stream.key_stream(), carry=carry_stream(trace, steps))
    told = [pol.hint.upcoming(call) for call in stream.calls()]
    # step 0 layer 1 routes rows 0, 1, 4 to 2, 4, 5 (nothing carried); step 1 layer 1: rows 2, 3, 5 -> 6, 0, 3, then
    # row 4's carried 5 (key 13); step 2 layer 1: row 3 -> 0 (key 8), then the carried 8 (told already), 11
    assert told == [[8 + 2, 8 + 4, 8 + 5], [], [8 + 6, 8 + 0, 8 + 3, 8 + 5], [], [8 + 0, 8 + 3], []]


def brute_carry(trace: RoutingTrace, steps: Steps) -> list[list[int]]:
    """Per decode group: its rejected rows from the accepted count (a verify group is [t, d drafts], the k leading
    accepted), carried into the next decode group of the same sequence; per call the keys in first-use order."""
    G, L = len(steps.phase), trace.num_layers
    out, last = [], None  # last: (sequence, rejected rows) of the previous decode group
    for g in range(G):
        rows = steps.rows[steps.offsets[g]:steps.offsets[g + 1]].tolist()
        seq = (int(trace.request[rows[0]]), int(trace.turn[rows[0]]))
        carried = last[1] if steps.phase[g] == DECODE and last is not None and last[0] == seq else []
        for layer in range(L):
            out.append(list(dict.fromkeys(layer * E + int(e) for r in carried for e in trace.experts[r, layer])))
        if steps.phase[g] == DECODE:
            last = (seq, rows[1 + int(steps.accepted[g]):])
    return out


def random_trace(tokens=80, layers=3, k=2, requests=2, prefill=5, seed=1) -> RoutingTrace:
    rng = np.random.default_rng(seed)
    x = np.stack([np.stack([rng.choice(E, k, replace=False) for _ in range(layers)]) for _ in range(tokens)])
    per = tokens // requests
    phase = np.tile(np.r_[np.full(prefill, PREFILL), np.full(per - prefill, DECODE)], requests)
    return RoutingTrace(x.astype(np.int16), E, request=np.repeat(np.arange(requests), per).astype(np.int32),
                        phase=phase.astype(np.int8))


@pytest.mark.parametrize("a,seed", [(0.0, 0), (0.6, 3), (1.0, 5)])
def test_carry_equals_the_rejected_rows_of_the_step_before(a, seed):
    trace = random_trace()
    steps = speculative_steps(trace, Speculation(3, a), 4, seed=seed)
    carry = carry_stream(trace, steps)
    got = [carry.keys[lo:hi].tolist() for lo, hi in zip(carry.offsets[:-1], carry.offsets[1:])]
    want = brute_carry(trace, steps)
    assert got == want
    assert (sum(map(len, want)) > 0) == (a < 1)  # a = 1 rejects only drafts past the end, in a last step
    # the hint a policy reads: the next 2 calls' true keys (accuracy 1) inside the sweep, then those calls' carry
    stream = steps_stream(trace, steps)
    truth = stream.key_stream()
    pol = make_policy("hinted_sweep", 6, 3, E, reference=True, accuracy=1.0, depth=2, carry=carry, future=truth)
    calls = list(stream.calls())
    for c, call in enumerate(calls):
        inside = [c + j for j in (1, 2) if call.layer + j < 3]
        told = [k for n in inside for k in truth.keys[truth.offsets[n]:truth.offsets[n + 1]].tolist()]
        told += [k for n in inside for k in want[n]]
        assert pol.hint.upcoming(call) == list(dict.fromkeys(told)), c


def test_carry_tally_by_hand():
    # step 1 (true 2: 5 / 6, drafts 3: 7 / 0 and 5: 2 / 3) carried row 4 (1 / 5): layer 0 keys {5, 7, 2} none named,
    # layer 1 keys {14, 8, 11} none; step 2 (row 3: 7 / 0) carried rows 3, 5: layer 0 {7} named, layer 1 {8} named
    assert carry_tally(hand_trace(), hand_steps()) == (8, 2)


def test_recorded_steps_rebuild_a_drafted_runs_forwards():
    """A trace whose draft field marks the verify calls: its forwards are the replay's groups, codes and all, so
    the carry of a recorded run is the carry of those groups."""
    trace, steps = hand_trace(), hand_steps()
    recorded = RoutingTrace(trace.experts[steps.rows], E, request=np.zeros(7, np.int32),
                            phase=np.full(7, DECODE, np.int8), draft=steps.draft)
    got = recorded_steps(recorded, 4)
    assert [got.rows[a:b].tolist() for a, b in zip(got.offsets[:-1], got.offsets[1:])] == [[0, 1, 2], [3, 4, 5], [6]]
    assert got.draft.tolist() == steps.draft.tolist() and got.accepted.tolist() == [1, 0, 0]
    assert carry_tally(recorded, got) == carry_tally(trace, steps)


def test_batched_carry_keeps_the_sequences_it_continues():
    trace = random_trace(tokens=120, requests=3, prefill=4)
    steps = batched_steps(trace, 2, 4, Speculation(2, 0.5), seed=2)
    carry = carry_stream(trace, steps)
    seq = trace.request
    prev = None
    for g in range(len(steps.phase)):
        lo, hi = steps.offsets[g], steps.offsets[g + 1]
        rows, codes = steps.rows[lo:hi], steps.draft[lo:hi]
        if steps.phase[g] == PREFILL:
            assert (codes == 0).all()
            want = []
        else:  # blocks of [t, 2 drafts]: codes 0, then accepted 1s, then rejected 2s; their accepted sum
            blocks = codes.reshape(-1, 3)
            assert (blocks[:, 0] == 0).all() and (np.diff(blocks[:, 1:], axis=1) >= 0).all()
            assert int((blocks == 1).sum()) == steps.accepted[g]
            want = [r for r in (prev if prev is not None else []) if seq[r] in set(seq[rows].tolist())]
            prev = rows[codes == 2].tolist()
        for layer in range(3):
            c = g * 3 + layer
            assert carry.keys[carry.offsets[c]:carry.offsets[c + 1]].tolist() == \
                list(dict.fromkeys(layer * E + int(e) for r in want for e in trace.experts[r, layer]))


CASES = [("lookahead", {"accuracy": 0.7, "depth": 1}), ("lookahead", {"accuracy": 1.0, "depth": 2, "scan": 4}),
         ("hinted_sweep", {"accuracy": 0.8, "depth": 1, "min_confidence": 0.3}),
         ("hinted_sweep", {"accuracy": 0.9, "depth": 2, "min_confidence": 0.5})]


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("policy, options", CASES, ids=lambda x: x if isinstance(x, str) else
                         "-".join(map(str, x.values())))
def test_compiled_equals_reference_with_the_carry(policy, options, batch):
    trace = random_trace(tokens=120, layers=4, requests=3, prefill=6, seed=4)
    hits = 0
    for fraction in (0.2, 0.4):
        config = SimConfig(policy, Split("offload"), fraction=fraction, prefill_chunk=4, batch=batch, draft_depth=3,
                           acceptance=0.6, draft_seed=1, options={**options, "carry": "drafts"})
        resolved, stream, compiled = replay_setup(trace, config)
        assert isinstance(compiled, CompiledPolicy) and isinstance(resolved.options["carry"], KeyStream)
        calls = list(stream.calls())
        ref = make_policy(policy, config.slots_for(4, E), 4, E, reference=True, future=stream.key_stream(),
                          **resolved.options)
        want = replay(calls, ref, Split("offload"), keep_plans=True)
        for c, call in enumerate(calls):
            assert compiled.plan(call, Split("offload")) == want.plans[c], c
        got = simulate(trace, config).log  # the stream replay (the interpreted one counts a decode call as 1 token)
        for column in ("layer", "experts", "hits", "fetched", "cpu", "evictions", "prefetched"):
            assert np.array_equal(getattr(got, column), getattr(want.log, column)), column
        plain = replay(calls, make_policy(policy, config.slots_for(4, E), 4, E, reference=True,
                                          future=stream.key_stream(), **options), Split("offload"), keep_plans=True)
        assert want.plans != plain.plans  # the carry changes decisions
        hits += want.total.hits
    assert hits > 0


@pytest.mark.parametrize("fields, message", [
    (dict(options={"carry": "draft"}, draft_depth=2), "options: carry must be 'drafts'"),
    (dict(options={"carry": "drafts"}), "options: carry=drafts carries the rejected drafts across the step boundary; "
                                         "it needs draft_depth > 0"),
    (dict(policy="lru", options={"carry": "drafts"}, draft_depth=2), "options: lru takes no option carry"),
])
def test_bad_carry_is_one_line_naming_the_option(fields, message):
    fields = {"policy": "hinted_sweep", "split": Split("offload"), "fraction": 0.3, **fields}
    with pytest.raises(ValueError) as e:
        simulate(random_trace(), SimConfig(**fields))
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("reference", [True, False])
def test_an_unbuilt_carry_outside_the_simulator_is_one_line(reference):
    """carry="drafts" is the simulator's to build; a policy built elsewhere (the engine) with it says so."""
    future = KeyStream(np.array([0, 9], np.int64), np.array([0, 1, 2], np.int64))
    with pytest.raises(ValueError) as e:
        make_policy("hinted_sweep", 2, 2, E, reference=reference, future=future, carry="drafts")
    assert "carry must be the carried keys per call" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="a live carry runs in the interpreted class"):
        CompiledPolicy(POLICIES["lookahead"], 2, 2, E, future=future, carry=LiveCarry(2))
    assert not isinstance(make_policy("lookahead", 2, 2, E, future=future, carry=LiveCarry(2)), CompiledPolicy)
    with pytest.raises(ValueError, match="the carry holds 1 calls, the future 2"):
        make_policy("lookahead", 2, 2, E, future=future, carry=KeyStream(np.zeros(0, np.int64), np.zeros(2, np.int64)))
