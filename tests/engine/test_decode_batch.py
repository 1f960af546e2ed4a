"""Batched decode: several sequences, each in its own KV cache, step together (one MoE call per layer over the union
of their experts) and each gets the logits of its solo run, on families with a shared expert, sliding-window
attention and sinks."""

from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import build_checkpoint

PROMPTS = [[3, 17, 5, 99, 42], [7, 1, 2], [8, 100, 12, 13, 14, 15, 16]]
STEPS = 6


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe", "gpt_oss"])
def test_batched_decode_equals_solo_runs(family, tmp_path):
    from freetoken.engine import CacheConfig, Engine

    path = build_checkpoint(family, tmp_path / family)
    engine = Engine.from_pretrained(path, CacheConfig("lru", fraction=0.5), kernels="host", device="cpu",
                                    keep_plans=True)
    solo = []
    for prompt in PROMPTS:  # greedy, one sequence at a time
        kv = engine.new_kv(64)
        logits, out = engine.prefill(prompt, kv)[-1], []
        for _ in range(STEPS):
            out.append((int(torch.argmax(logits)), logits))
            logits = engine.decode(out[-1][0], kv)[-1]
        solo.append(out)
    kvs = [engine.new_kv(64) for _ in PROMPTS]
    last = [int(torch.argmax(engine.prefill(p, kv)[-1])) for p, kv in zip(PROMPTS, kvs)]
    engine.cache.executor.plans = []
    for step in range(1, STEPS):
        logits = engine.decode_batch(last, kvs)  # [B, V]
        for i, seq in enumerate(solo):
            assert last[i] == seq[step - 1][0]
            torch.testing.assert_close(logits[i], seq[step][1], atol=2e-5, rtol=1e-5)
        last = [int(torch.argmax(row)) for row in logits]
    assert [kv.length for kv in kvs] == [len(p) + STEPS - 1 for p in PROMPTS]
    assert all(kv.tokens[len(p):] == [t for t, _ in seq[:STEPS - 1]] for kv, p, seq in zip(kvs, PROMPTS, solo))
    calls = engine.cache.plans  # one call per MoE layer per batched step, over the union of the experts
    assert len(calls) == (STEPS - 1) * engine.config.num_moe_layers
    distinct = [len(p.hits) + len(p.fetch) + len(p.cpu) for p in calls]
    assert max(distinct) > engine.config.top_k and max(distinct) <= len(PROMPTS) * engine.config.top_k


def test_decode_batch_checks_its_arguments(tmp_path):
    from freetoken.engine import Engine

    engine = Engine.from_pretrained(build_checkpoint("qwen3_moe", tmp_path / "q"), kernels="host",
                                    device="cpu")
    with pytest.raises(ValueError, match="one KV cache and request per token"):
        engine.decode_batch([1, 2], [engine.new_kv(8)])
