"""Model-free drafting (n-gram prompt lookup) with greedy verification: the output is plain greedy decoding's token
for token, the acceptance rate equals a brute-force replay of the drafter over the plain output, and the verify
calls (d + 1 tokens' routing) are recorded so a replay of them makes the live Plans."""

from __future__ import annotations

import numpy as np
import pytest

from freetoken.engine import CacheConfig, Engine, SamplingParams
from freetoken.engine.draft import DraftConfig, accepted_prefix, ngram_draft
from freetoken.placement import DECODE, Split, make_call, make_policy
from freetoken.placement.router_hint import RecordedHint
from freetoken.sim.calls import trace_calls
from freetoken.sim.replay import replay
from freetoken.trace import load, save
from freetoken.trace.stats import draft_acceptance, forward_spans

from .conftest import PROMPT

GREEDY = SamplingParams(greedy=True)
REPEATING = [3, 17, 5, 99, 3, 17, 5, 99, 3, 17]  # a prompt the n-gram lookup finds matches in
NEW_TOKENS = 24


def test_ngram_draft_by_hand():
    ctx = [1, 2, 3, 4, 1, 2, 3, 9, 1, 2]
    assert ngram_draft(ctx, 3, max_ngram=3) == [3, 9, 1]  # suffix [1, 2]: latest earlier match at 4 -> 3, 9, 1
    assert ngram_draft(ctx, 2, max_ngram=1) == [3, 9]  # suffix [2]: latest earlier match at 5
    assert ngram_draft([5, 6, 7], 3) == []  # nothing recurs
    assert ngram_draft([7, 7], 4) == [7]  # what follows the match, up to the context's end
    assert accepted_prefix([4, 5, 6], [4, 5, 1, 0]) == 2 and accepted_prefix([4], [3, 0]) == 0
    with pytest.raises(ValueError, match="draft depth"):
        DraftConfig(depth=0)


def plain_and_drafted(ckpt, prompt, depth, cache=None):
    cache = cache or CacheConfig("lru", capacity=5)
    plain = Engine(ckpt, cache, kernels="host", device="cpu", prefill_chunk=3, keep_plans=True)
    want = list(plain.generate(prompt, GREEDY, max_tokens=NEW_TOKENS, stop_token_ids=[]))
    drafted = Engine(ckpt, cache, kernels="host", device="cpu", prefill_chunk=3, keep_plans=True)
    got = list(drafted.generate(prompt, GREEDY, max_tokens=NEW_TOKENS, stop_token_ids=[],
                                draft=DraftConfig(depth=depth)))
    return want, got, plain, drafted


def brute_force_acceptance(prompt, out, depth):
    """(verify steps, drafted, accepted) of the drafter run over the plain greedy output, step by step."""
    steps = drafted = accepted = 0
    n = 1  # tokens of `out` produced
    while n < len(out):
        proposal = ngram_draft(prompt + out[:n], min(depth, len(out) - n - 1))
        kept = accepted_prefix(proposal, out[n:])
        steps, drafted, accepted = steps + 1, drafted + len(proposal), accepted + kept
        n += kept + 1
    return steps, drafted, accepted


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("depth", [1, 3, 5])
def test_drafted_output_is_plain_greedy(family, depth, hf_models, checkpoints):
    want, got, _, drafted = plain_and_drafted(checkpoints[family], REPEATING, depth)
    assert got == want
    st = drafted.draft_stats
    assert (st.verify_steps, st.drafted, st.accepted) == brute_force_acceptance(REPEATING, want, depth)
    assert st.drafted > 0 and drafted.stats.decode_tokens == NEW_TOKENS - 1
    assert len(drafted.trace().token) == len(REPEATING) + st.verify_steps + st.drafted


def test_drafted_output_matches_hf_greedy(hf_models, checkpoints):
    ref = hf_models["qwen3_moe"]
    engine = Engine(checkpoints["qwen3_moe"], CacheConfig("lru", capacity=5), kernels="host", device="cpu")
    n = len(ref.tokens) - len(PROMPT)
    got = list(engine.generate(PROMPT, GREEDY, max_tokens=n, stop_token_ids=[], draft=DraftConfig(depth=3)))
    assert PROMPT + got == ref.tokens


def test_stop_token_inside_an_accepted_draft_ends_like_plain(checkpoints):
    ckpt = checkpoints["qwen3_moe"]
    want, got, plain, drafted = plain_and_drafted(ckpt, REPEATING, 4)
    assert drafted.draft_stats.accepted > 0
    stop = want[len(want) // 2]
    kv_plain, kv_draft = plain.new_kv(), drafted.new_kv()
    a = list(plain.generate(REPEATING, GREEDY, max_tokens=NEW_TOKENS, stop_token_ids=[stop], kv=kv_plain))
    b = list(drafted.generate(REPEATING, GREEDY, max_tokens=NEW_TOKENS, stop_token_ids=[stop], kv=kv_draft,
                              draft=DraftConfig(depth=4)))
    assert a == b and a[-1] == stop
    assert kv_draft.tokens == kv_plain.tokens  # the KV cache holds what plain decoding's holds


def test_draft_needs_greedy(checkpoints):
    engine = Engine(checkpoints["qwen3_moe"], CacheConfig("lru", capacity=5), kernels="host", device="cpu")
    with pytest.raises(ValueError, match="use greedy sampling"):
        engine.generate(PROMPT, SamplingParams(temperature=0.7), max_tokens=4, draft=DraftConfig())
    # a penalty over the tokens so far would count the verify rows' rejected choices too
    for field, value in (("repetition_penalty", 1.3), ("presence_penalty", 0.5), ("frequency_penalty", 0.5)):
        with pytest.raises(ValueError, match="without repetition, presence or frequency penalties"):
            engine.generate(PROMPT, SamplingParams(greedy=True, **{field: value}), max_tokens=4, draft=DraftConfig())


@pytest.mark.parametrize("policy", ["lru", "lookahead"])
def test_verify_calls_are_recorded_and_replay_to_the_live_plans(policy, checkpoints, tmp_path):
    """The trace marks each verify call (a decode token 0 and its drafts 1 / 2); the calls rebuilt from it, the
    prompt's prefill chunks (the simulator's builder) then one call per verify span, replay to the live Plans (with
    lookahead: the router hint over the verify call's d + 1 tokens, replayed from the trace); the recorded
    acceptance is the engine's; accepted tokens route as in plain decoding."""
    split = Split("hybrid", bp=2.0, bh=1.0)
    opts = {"hint": "router"} if policy == "lookahead" else {}
    want, got, plain, drafted = plain_and_drafted(checkpoints["qwen3_moe"], REPEATING, 3,
                                                  CacheConfig(policy, capacity=5, split=split, options=opts))
    trace = load(save(drafted.trace(), tmp_path / "draft.safetensors"))
    assert draft_acceptance(trace) == pytest.approx(drafted.draft_stats.acceptance)
    assert (trace.draft[trace.phase == 0] == 0).all() and (trace.draft == 2).any()
    kept = trace.draft != 2  # the tokens plain decoding also processed
    np.testing.assert_array_equal(trace.experts[kept], plain.trace().experts)
    calls = list(trace_calls(trace.select(trace.phase == 0), 3))
    spans = [(lo, hi) for lo, hi in forward_spans(trace, 3) if trace.phase[lo] == DECODE]
    assert len(spans) == drafted.draft_stats.verify_steps and spans[-1][1] == trace.num_tokens
    assert [int(trace.draft[lo]) for lo, _ in spans] == [0] * len(spans)
    for lo, hi in spans:
        calls += [make_call(l, trace.experts[lo:hi, l], DECODE) for l in range(trace.num_layers)]
    hint = {"hint": RecordedHint(trace, 3)} if policy == "lookahead" else {}
    sim = replay(calls, make_policy(policy, 5, trace.num_layers, trace.num_experts, **hint), split, keep_plans=True)
    assert sim.plans == drafted.cache.plans
    assert max(hi - lo for lo, hi in spans) > 1  # multi-token verify calls
    if policy == "lookahead":
        assert drafted.counters.prefetched > 0


def test_ft_generate_draft_flags(capsys, tmp_path):
    """ft generate --draft ngram: the plain run's tokens; the reported acceptance is the brute-force replay's and the
    reported hint accuracy the recorded trace's."""
    import json

    from freetoken.cli import main
    from freetoken.trace.stats import hint_accuracy

    base = ["generate", "--token-ids", ",".join(map(str, REPEATING)), "--greedy", "--max-tokens", "16", "--json",
            "--kernels", "host", "--device", "cpu", "--capacity", "6", "--stop-token-ids", ""]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)
    trace_file = tmp_path / "d.safetensors"
    assert main(base + ["--draft", "ngram", "--draft-depth", "3", "--policy", "lookahead", "--policy-option",
                        "hint=router", "--record-trace", str(trace_file)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == plain["token_ids"]
    steps, drafted, accepted = brute_force_acceptance(REPEATING, plain["token_ids"], 3)
    assert (out["draft"]["verify_steps"], out["draft"]["drafted"], out["draft"]["accepted"]) == (
        steps, drafted, accepted) and drafted > 0
    acc = hint_accuracy(load(trace_file))
    assert out["hint_accuracy"][0] is None and out["hint_accuracy"][1:] == pytest.approx(acc[1:].tolist())


@pytest.mark.parametrize("argv, message", [
    (["--draft", "ngram"], "--draft verifies greedily"),
    (["--draft", "ngram", "--greedy", "--draft-depth", "0"], "--draft-depth must be >= 1"),
    (["--draft-depth", "2"], "--draft-depth applies only with --draft ngram"),
])
def test_ft_generate_bad_draft_flags(capsys, argv, message):
    from freetoken.cli import main

    assert main(["generate", "--kernels", "host", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_carry_tally_live_equals_the_recorded_trace(checkpoints, tmp_path):
    """DraftStats' carry tally (per layer, a verify forward's experts and those the rejected drafts of the verify
    forward before named) is the simulator's tally over the recorded trace's verify calls (sim.carry)."""
    from freetoken.sim.carry import carry_tally, recorded_steps

    _, _, _, drafted = plain_and_drafted(checkpoints["qwen3_moe"], REPEATING, 3)
    trace = load(save(drafted.trace(), tmp_path / "draft.safetensors"))
    st = drafted.draft_stats
    assert (st.carry_used, st.carry_named) == carry_tally(trace, recorded_steps(trace, 3))
    assert st.carry_used > 0 and st.carry_accuracy == st.carry_named / st.carry_used


@pytest.mark.parametrize("policy", ["lookahead", "hinted_sweep"])
def test_live_carry_makes_the_replayed_plans(policy, checkpoints, tmp_path):
    """carry="drafts" live: before each verify forward the engine hands the policy the rejected drafts' experts of
    the verify forward before, per layer. The replay of the recorded trace (its verify calls, the recorded router
    hint, the carry sim.carry builds from the draft field) makes the live Plans and tells the same carried keys; an
    engine that records nothing hands the same carry."""
    from freetoken.sim.calls import steps_stream
    from freetoken.sim.carry import carry_stream, recorded_steps

    split = Split("offload")
    opts = {"hint": "router", "carry": "drafts"} | ({"min_confidence": 0.5} if policy == "hinted_sweep" else {})
    cache = CacheConfig(policy, capacity=5, split=split, options=opts)
    runs = [Engine(checkpoints["qwen3_moe"], cache, kernels="host", device="cpu", prefill_chunk=3,
                   keep_plans=True, record=record) for record in (True, False)]
    for engine in runs:
        list(engine.generate(REPEATING, GREEDY, max_tokens=NEW_TOKENS, stop_token_ids=[], draft=DraftConfig(depth=3)))
    live, unrecorded = runs
    trace = load(save(live.trace(), tmp_path / "carry.safetensors"))
    steps = recorded_steps(trace, 3)
    sim_opts = {k: v for k, v in opts.items() if k not in ("hint", "carry")}
    pol = make_policy(policy, 5, trace.num_layers, trace.num_experts, hint=RecordedHint(trace, 3),
                      carry=carry_stream(trace, steps), **sim_opts)
    calls = list(steps_stream(trace, steps).calls())
    sim = replay(calls, pol, split, keep_plans=True)
    assert sim.plans == live.cache.plans == unrecorded.cache.plans
    if policy == "lookahead":  # here the carry changes its decisions (hinted_sweep's do not on this tiny model)
        plain = make_policy(policy, 5, trace.num_layers, trace.num_experts, hint=RecordedHint(trace, 3), **sim_opts)
        assert replay(calls, plain, split, keep_plans=True).plans != sim.plans
    told = live.cache.policy.hint.told
    assert told > 0 and pol.hint.told == told == unrecorded.cache.policy.hint.told  # the carry named keys
    assert live.draft_stats.carry_used > 0


def test_live_carry_needs_drafting(checkpoints):
    cache = CacheConfig("lookahead", capacity=5, options={"hint": "router", "carry": "drafts"})
    engine = Engine(checkpoints["qwen3_moe"], cache, kernels="host", device="cpu")
    with pytest.raises(ValueError) as e:
        engine.generate(REPEATING, GREEDY, max_tokens=4)
    assert "options: carry='drafts'" in str(e.value) and "draft" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="options: carry must be 'drafts'"):
        Engine(checkpoints["qwen3_moe"], CacheConfig("lookahead", capacity=5, options={"hint": "router",
                                                                                      "carry": "draft"}),
               kernels="host", device="cpu")


def test_ft_generate_live_carry(capsys, tmp_path):
    """ft generate with --policy-option carry=drafts: the reported carry tally is the recorded trace's (sim.carry)
    and the policy was told carried keys; without --draft one line names the option."""
    import json

    from freetoken.cli import main
    from freetoken.defaults import DEFAULT_PREFILL_CHUNK
    from freetoken.sim.carry import carry_tally, recorded_steps

    base = ["generate", "--token-ids", ",".join(map(str, REPEATING)), "--greedy", "--max-tokens", "16", "--json",
            "--kernels", "host", "--device", "cpu", "--capacity", "6", "--stop-token-ids", "", "--policy",
            "lookahead", "--policy-option", "hint=router", "--policy-option", "carry=drafts"]
    trace_file = tmp_path / "c.safetensors"
    assert main(base + ["--draft", "ngram", "--draft-depth", "3", "--record-trace", str(trace_file)]) == 0
    d = json.loads(capsys.readouterr().out)["draft"]
    trace = load(trace_file)
    assert (d["carry_used"], d["carry_named"]) == carry_tally(trace, recorded_steps(trace, DEFAULT_PREFILL_CHUNK))
    assert d["carry_used"] > 0 and d["carry_told"] > 0
    assert main(base) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--policy-option carry=drafts" in err[0] and "--draft ngram" in err[0]
