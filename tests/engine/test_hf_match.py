"""The cache must not change the math: logits equal HF transformers' at every capacity, in every split.

Tolerance (fp32 weights and activations): max |logit - HF| <= 1e-4 * max |HF logit|. The only differences are
summation order (kernel tiling, which lane adds an expert's output first); observed errors are ~1e-7 absolute.
"""

from __future__ import annotations

import pytest
import torch

from freetoken.engine import CacheConfig, Engine, SamplingParams
from freetoken.placement import POLICIES, Split

from .conftest import DECODE_STEPS, FAMILIES, PROMPT, hf_topk, policy_options

SPLITS = {"offload": Split("offload"), "cpu": Split("cpu"), "hybrid": Split("hybrid", bp=1.0, bh=1.0)}
CHUNK = 4  # prefill chunks of 4: the 10-token prompt takes 3 chunks, so prefill calls see the cache mid-prompt
REL_TOL = 1e-4


def run_steps(engine: Engine, tokens: list[int]) -> torch.Tensor:
    """Prefill the prompt, then decode HF's greedy tokens one by one; logits at every position [T, V]."""
    kv = engine.new_kv(64)
    out = [engine.prefill(tokens[:len(PROMPT)], kv, all_logits=True)]
    for pos in range(len(PROMPT), len(tokens)):
        out.append(engine.decode(tokens[pos], kv))
    return torch.cat(out).float().cpu()


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    err = (got - want).abs().max().item()
    scale = want.abs().max().item()
    assert err <= REL_TOL * scale, f"{what}: max error {err:.3e} vs logit scale {scale:.3e}"


def assert_grid(make_engine, tokens: list[int], want: torch.Tensor, capacities, what: str, extra=None) -> None:
    """Every capacity x split: logits equal `want`; offload never computes on the CPU, cpu never fetches.
    make_engine(capacity, split name) -> Engine; extra(capacity, split name, engine) adds a caller's checks."""
    for capacity in capacities:
        for split in SPLITS:
            engine = make_engine(capacity, split)
            assert_close(run_steps(engine, tokens), want, f"{what} capacity={capacity} split={split}")
            c = engine.counters
            if split == "offload":
                assert c.cpu == 0 and c.fetched + c.hits == c.accesses
            if split == "cpu":
                assert c.fetched == 0 and c.cpu > 0
            if extra is not None:
                extra(capacity, split, engine)


@pytest.mark.parametrize("family", [f if f == "qwen3_moe" else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES])
def test_lru_every_capacity_every_split(family, hf_models, checkpoints):
    ref, ckpt = hf_models[family], checkpoints[family]
    L, E = ckpt.config.num_moe_layers, ckpt.config.num_experts
    picks = hf_topk(ref, len(ref.tokens) - 1)  # [T, L, K]
    want_accesses = sum(len(set(picks[lo:min(lo + CHUNK, len(PROMPT)), l].reshape(-1).tolist()))  # distinct experts per chunk call
                        for lo in range(0, len(PROMPT), CHUNK) for l in range(L))
    want_accesses += DECODE_STEPS * L * ref.top_k
    seen_rates = set()
    for capacity in range(L * E + 1):
        for name, split in SPLITS.items():
            engine = Engine(ckpt, CacheConfig("lru", capacity=capacity, split=split), kernels="host",
                            device="cpu", prefill_chunk=CHUNK)
            logits = run_steps(engine, ref.tokens[:-1])
            assert_close(logits, ref.logits[:-1], f"{family} lru capacity={capacity} split={name}")
            c = engine.counters
            assert c.accesses == want_accesses
            if name == "cpu":
                assert c.fetched == 0 and c.hits == 0  # lru admits only what it fetches
            if name == "offload":
                assert c.cpu == 0
            seen_rates.add(round(c.hit_rate, 6))
    assert len(seen_rates) > 3  # the grid really exercised different cache states


@pytest.mark.parametrize("family", [f if f == "qwen3_moe" else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES])
def test_every_policy(family, hf_models, checkpoints):
    ref, ckpt = hf_models[family], checkpoints[family]
    first = Engine(ckpt, CacheConfig("lru", capacity=0), kernels="reference", device="cpu", prefill_chunk=CHUNK)
    run_steps(first, ref.tokens[:-1])
    trace = first.trace()
    for policy in sorted(set(POLICIES) - {"lru"}):
        opts = policy_options(policy, trace, CHUNK)
        for capacity in (0, 5, 8, 16):
            for name, split in SPLITS.items():
                engine = Engine(ckpt, CacheConfig(policy, capacity=capacity, split=split, options=opts),
                                kernels="host", device="cpu", prefill_chunk=CHUNK)
                logits = run_steps(engine, ref.tokens[:-1])
                assert_close(logits, ref.logits[:-1], f"{family} {policy} capacity={capacity} split={name}")


@pytest.mark.parametrize("family", FAMILIES)
def test_pipelined_groups_keep_the_math(family, hf_models, checkpoints):
    """The GPU path's order (hits, then fetched experts in two halves in prefill) run on CPU: same logits."""
    ref, ckpt = hf_models[family], checkpoints[family]
    for capacity in (0, 3, 7, 12):
        for name, split in SPLITS.items():
            engine = Engine(ckpt, CacheConfig("lru", capacity=capacity, split=split), kernels="host",
                            device="cpu", prefill_chunk=CHUNK, pipeline=True)
            logits = run_steps(engine, ref.tokens[:-1])
            assert_close(logits, ref.logits[:-1], f"{family} pipelined capacity={capacity} split={name}")


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_equal_hf_generate(family, hf_models, checkpoints):
    ref, ckpt = hf_models[family], checkpoints[family]
    engine = Engine(ckpt, CacheConfig("lru", capacity=5, split=SPLITS["hybrid"]), kernels="host",
                    device="cpu", prefill_chunk=CHUNK)
    got = list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=DECODE_STEPS + 1,
                               stop_token_ids=[]))
    assert got == ref.tokens[len(PROMPT):]


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_triton_kernels_prefill_and_decode(family, hf_models, checkpoints):
    """The real Triton path (interpreted on CPU) on one full prefill + 8 decode steps, with a cache that
    hits, fetches into slots and staging, and computes on the CPU lane."""
    ref, ckpt = hf_models[family], checkpoints[family]
    engine = Engine(ckpt, CacheConfig("lru", capacity=5, split=SPLITS["hybrid"]), kernels="triton",
                    device="cuda" if torch.cuda.is_available() else "cpu", prefill_chunk=CHUNK)
    logits = run_steps(engine, ref.tokens[:-1])
    assert_close(logits, ref.logits[:-1], f"{family} triton")
    c = engine.counters
    assert c.hits > 0 and c.fetched > 0 and c.cpu > 0
    assert logits.argmax(-1)[len(PROMPT) - 1:].tolist() == ref.tokens[len(PROMPT):]
