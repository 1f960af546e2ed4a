"""Batched decode: several sequences, each in its own KV cache, step together (one MoE call per layer over the union
of their experts) and each gets the logits of its solo run: families with a shared expert, sliding-window attention
and sinks, and every cache kind besides plain KV: Gated DeltaNet's conv + recurrent states (Qwen3.5-MoE), MLA's
per-head latent KV (DeepSeek-V3), DSA's indexer keys (GLM-5, index_topk 4 below the sequences' lengths) and
DeepSeek-V4's compressor windows and compressed entries (sequences at different offsets within their windows)."""

from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import build_checkpoint

PROMPTS = [[3, 17, 5, 99, 42], [7, 1, 2], [8, 100, 12, 13, 14, 15, 16], [9, 9, 4, 120, 6, 2]]
STEPS = 6


def _hf_checkpoint(name: str, out):
    """A tiny random checkpoint of the newer families, shaped as their HF-match tests shape them."""
    from .test_deepseek_hf_match import CONFIGS as DEEPSEEK
    from .test_glm_minimax_hf_match import CONFIGS as GLM
    from .test_qwen3_next_hf_match import CONFIGS as QWEN
    from .tiny_hf import random_hf

    if name == "deepseek_v4":
        from .test_deepseek_v4_hf_match import build

        build(out)
        return out
    model_type, kw = {"qwen3_5_moe": QWEN["qwen3_5_moe"], "deepseek_v3": DEEPSEEK["v3"],
                      "glm_moe_dsa": ("glm_moe_dsa", GLM["glm_moe_dsa"])}[name]
    random_hf(model_type, **kw).save_pretrained(out)
    return out


def _checkpoint(family: str, out):
    if family in ("qwen3_moe", "qwen2_moe", "gpt_oss"):
        return build_checkpoint(family, out)
    return _hf_checkpoint(family, out)


def solo_runs(engine, prompts, steps):
    """Greedy, one sequence at a time: per sequence [(token, logits)] for steps decode positions."""
    out = []
    for prompt in prompts:
        kv = engine.new_kv(64)
        logits, seq = engine.prefill(prompt, kv)[-1], []
        for _ in range(steps):
            seq.append((int(torch.argmax(logits)), logits))
            logits = engine.decode(seq[-1][0], kv)[-1]
        out.append(seq)
    return out


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe", "gpt_oss", "qwen3_5_moe", "deepseek_v3", "glm_moe_dsa",
                                    "deepseek_v4"])
def test_batched_decode_equals_solo_runs(family, tmp_path):
    from freetoken.engine import CacheConfig, Engine

    path = _checkpoint(family, tmp_path / family)
    engine = Engine.from_pretrained(path, CacheConfig("lru", fraction=0.5), kernels="host", device="cpu",
                                    keep_plans=True)
    solo = solo_runs(engine, PROMPTS, STEPS)
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


@pytest.mark.parametrize("family", ["qwen3_5_moe", "deepseek_v4"])
def test_a_failed_step_can_be_stepped_again(family, tmp_path, monkeypatch):
    """A step that fails in its last layer leaves every sequence where it can step again: the stacked DeltaNet
    states are written back only after the whole step, V4's compressor rows are addressed by position (a rerun
    writes what the failed step wrote). Stepping each alone afterwards gives its solo logits."""
    from freetoken.engine import Engine

    engine = Engine.from_pretrained(_checkpoint(family, tmp_path / family), kernels="host", device="cpu")
    solo = solo_runs(engine, PROMPTS[:2], 2)
    kvs = [engine.new_kv(64) for _ in PROMPTS[:2]]
    last = [int(torch.argmax(engine.prefill(p, kv)[-1])) for p, kv in zip(PROMPTS[:2], kvs)]
    real, calls = engine._moe, []

    def failing(layer, h, x):  # the last layer's MoE block fails
        calls.append(layer)
        if layer == engine.config.num_moe_layers - 1:
            raise RuntimeError("injected")
        return real(layer, h, x)

    monkeypatch.setattr(engine, "_moe", failing)
    with pytest.raises(RuntimeError, match="injected"):
        engine.decode_batch(last, kvs)
    monkeypatch.undo()
    assert calls == list(range(engine.config.num_moe_layers))  # every other layer had stepped (all are MoE)
    for i, kv in enumerate(kvs):
        torch.testing.assert_close(engine.decode(last[i], kv)[-1], solo[i][1][1], atol=2e-5, rtol=1e-5)


def test_decode_batch_checks_its_arguments(tmp_path):
    from freetoken.engine import Engine

    engine = Engine.from_pretrained(build_checkpoint("qwen3_moe", tmp_path / "q"), kernels="host",
                                    device="cpu")
    with pytest.raises(ValueError, match="one KV cache and request per token"):
        engine.decode_batch([1, 2], [engine.new_kv(8)])
