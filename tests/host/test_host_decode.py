"""A CPU-only engine's decode token in one host call (freetoken/engine/host_decode.py) against the engine's own
per-layer path on the same checkpoint: logits equal bit for bit, and the same routing trace, Plans, counters and
host counts, over several tokens, for the families whose layers it takes; the others keep the per-layer path and
say why."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.engine import CacheConfig, Engine
from freetoken.engine import host_decode
from freetoken.placement import Split
from tests.engine.conftest import build_checkpoint
from tests.host.conftest import native_or_skip

PROMPT = [3, 17, 5, 9, 1, 22, 40, 8, 13]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {f: build_checkpoint(f, tmp_path_factory.mktemp(f), num_hidden_layers=3)
            for f in ("qwen3_moe", "mixtral", "olmoe", "qwen2_moe", "gpt_oss")}


def _run(path, one_call: bool, cache: CacheConfig, dtype=None, threads: int = 1):
    engine = Engine.from_pretrained(path, cache, kernels="host", device="cpu", keep_plans=True, dtype=dtype,
                                    threads=threads)
    if not one_call:
        engine.one_call = False  # the per-layer path
    kv = engine.new_kv(64)
    token = int(engine.prefill(PROMPT, kv)[-1].argmax())
    logits = []
    for _ in range(6):
        out = engine.decode(token, kv)
        logits.append(out)
        token = int(out[-1].argmax())
    return engine, torch.cat(logits)


CACHES = {"cpu-moe": CacheConfig("static_layers", split=Split("cpu"), capacity=0, options={"n_cpu_layers": "all"}),
          "lru": CacheConfig("lru", fraction=0.4)}


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "olmoe"])
@pytest.mark.parametrize("cache", list(CACHES))
@pytest.mark.parametrize("dtype,threads", [(None, 1), (torch.bfloat16, 2)])
def test_one_call_equals_the_per_layer_path(checkpoints, family, cache, dtype, threads):
    native_or_skip()
    ref, want = _run(checkpoints[family], False, CACHES[cache], dtype, threads)
    got_engine, got = _run(checkpoints[family], True, CACHES[cache], dtype, threads)
    assert host_decode.reason(got_engine) is None and got_engine.one_call  # it ran
    assert got_engine.decode_line.startswith("decode: one host call per token")
    assert torch.equal(got, want)
    a, b = ref.trace(), got_engine.trace()
    assert np.array_equal(a.experts, b.experts) and np.array_equal(a.gates, b.gates)
    assert ref.cache.plans == got_engine.cache.plans
    assert ref.cache.executor.phase_counters == got_engine.cache.executor.phase_counters
    assert ref.host.to_dict() == got_engine.host.to_dict()


@pytest.mark.parametrize("family,why", [("qwen2_moe", "layer 0 is not a plain"), ("gpt_oss", "layer 0 is not a plain")])
def test_other_layers_keep_the_per_layer_path(checkpoints, family, why):
    native_or_skip()
    engine, _ = _run(checkpoints[family], True, CACHES["lru"])
    assert why in host_decode.reason(engine) and engine.one_call is False
    assert why in engine.decode_line


def test_a_bad_token_is_refused_before_anything_runs(checkpoints):
    native_or_skip()
    engine, _ = _run(checkpoints["qwen3_moe"], True, CACHES["cpu-moe"])
    kv = engine.new_kv(16)
    engine.prefill([1, 2], kv)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 128\)"):
        engine.decode(128, kv)
    assert kv.length == 2


def test_sequences_taking_turns_each_read_their_own_cache(checkpoints):
    """Two sequences decoded in turns (as a server interleaves them): the one call repoints its attention at each
    sequence's cache and equals the per-layer path token for token."""
    native_or_skip()
    outs = []
    for one_call in (False, True):
        engine = Engine.from_pretrained(checkpoints["qwen3_moe"], CACHES["lru"], kernels="host", device="cpu",
                                        record=False)
        engine.one_call = None if one_call else False
        kvs = [engine.new_kv(32), engine.new_kv(32)]
        tokens = [int(engine.prefill(p, kv)[-1].argmax()) for p, kv in zip(([3, 4, 5], [9, 1, 2, 7]), kvs)]
        got = []
        for step in range(8):
            i = step % 2
            out = engine.decode(tokens[i], kvs[i])
            tokens[i] = int(out[-1].argmax())
            got.append(out)
        outs.append(torch.cat(got))
    assert engine.one_call and torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("cache", [*CACHES, "s3fifo"])
def test_the_steps_calls_planned_in_one_replay_count_as_layer_by_layer(checkpoints, cache):
    """Without kept Plans the one-call step plans its L calls in one compiled replay (ExpertCache.account_step):
    the same counters and the same residency after single and batched steps as the per-layer path's plan() calls."""
    native_or_skip()
    config = CACHES.get(cache) or CacheConfig(cache, fraction=0.4)
    runs = []
    for one_call in (False, True):
        engine = Engine.from_pretrained(checkpoints["qwen3_moe"], config, kernels="host", device="cpu", threads=1)
        engine.one_call = None if one_call else False
        kvs = [engine.new_kv(48) for _ in range(3)]
        tokens = [int(engine.prefill(p, kv, request=i)[-1].argmax())
                  for i, (p, kv) in enumerate(zip([PROMPT, [4, 5], [11, 2, 2]], kvs))]
        outs = []
        for step in range(8):  # solo steps, then batches of three
            if step < 4:
                out = engine.decode(tokens[0], kvs[0])
                tokens[0] = int(out[-1].argmax())
            else:
                out = engine.decode_batch(tokens, kvs, requests=[0, 1, 2])
                tokens = out.argmax(-1).tolist()
            outs.append(out)
        runs.append((engine, torch.cat(outs)))
    (ref, want), (engine, got) = runs
    assert engine.one_call and engine.cache.executor.plans is None and torch.equal(got, want)
    assert ref.cache.executor.phase_counters == engine.cache.executor.phase_counters
    decode = ref.cache.executor.phase_counters[1]
    assert (decode.cpu if cache == "cpu-moe" else decode.hits) > 0  # (something to count)
    assert ref.cache.policy.slot_of == engine.cache.policy.slot_of


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_a_decode_batch_in_one_call_equals_the_per_layer_batch(checkpoints, dtype):
    native_or_skip()
    runs = []
    for one_call in (False, True):
        engine = Engine.from_pretrained(checkpoints["olmoe"], CACHES["lru"], kernels="host", device="cpu",
                                        keep_plans=True, dtype=dtype, threads=2)
        engine.one_call = None if one_call else False
        prompts = [[3, 4, 5], [9, 1, 2, 7, 7], [11]]
        kvs = [engine.new_kv(32) for _ in prompts]
        tokens = [int(engine.prefill(p, kv, request=i)[-1].argmax()) for i, (p, kv) in enumerate(zip(prompts, kvs))]
        outs = []
        for _ in range(4):
            out = engine.decode_batch(tokens, kvs, requests=[0, 1, 2])
            tokens = out.argmax(-1).tolist()
            outs.append(out)
        runs.append((engine, torch.cat(outs)))
    (ref, want), (engine, got) = runs
    assert engine.one_call and torch.equal(got, want)
    assert ref.cache.plans == engine.cache.plans
    assert ref.cache.executor.phase_counters == engine.cache.executor.phase_counters
    a, b = ref.trace(), engine.trace()
    assert np.array_equal(a.experts, b.experts) and np.array_equal(a.request, b.request)


@pytest.fixture(scope="module")
def gptq(tmp_path_factory):
    """A GPTQ int4 checkpoint (experts and attention packed) of a random bf16 Qwen3-MoE, and one with its head too."""
    from freetoken.calibrate.checkpoints import RandomMoE, build_random
    from freetoken.calibrate.gptq import write_gptq

    root = tmp_path_factory.mktemp("gptq")
    src = build_random(RandomMoE(hidden=128, layers=2, experts=4, top_k=2, moe_intermediate=128, heads=4, kv_heads=2,
                                 head_dim=32, vocab=512), root / "bf16")
    return write_gptq(src, root / "gptq"), write_gptq(src, root / "gptq-head", lm_head=True)


@pytest.mark.parametrize("which,lm_head", [(0, "checkpoint"), (0, "int8"), (1, "checkpoint")])
def test_packed_weights_and_heads_in_one_call(gptq, which, lm_head):
    """GPTQ experts and projections read packed, a bf16, int8 or int4 LM head: the same logits as layer by layer."""
    native_or_skip()
    outs = []
    for one_call in (False, True):
        engine = Engine.from_pretrained(gptq[which], CACHES["cpu-moe"], kernels="host", device="cpu", record=False,
                                        lm_head=lm_head)
        engine.one_call = None if one_call else False
        kv = engine.new_kv(32)
        token = int(engine.prefill(PROMPT, kv)[-1].argmax())
        got = []
        for _ in range(4):
            out = engine.decode(token, kv)
            token = int(out[-1].argmax())
            got.append(out)
        outs.append(torch.cat(got))
    assert engine.one_call and engine.store.packed and torch.equal(outs[0], outs[1])
