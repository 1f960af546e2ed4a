"""The CPU-only engine on the host kernels: logits equal the torch-reference kernel set's on the same checkpoint, with
the C kernels and with the torch fallback a machine without a compiler runs; a decode batch equals each sequence's
solo decode; the slot pool aliases the expert store (no second copy of any expert)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.engine import CacheConfig, Engine
from freetoken.host import kernels as hk
from tests.engine.conftest import build_checkpoint


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return build_checkpoint("qwen3_moe", tmp_path_factory.mktemp("q3"))


def _logits(path, kernels, tokens):
    engine = Engine.from_pretrained(path, CacheConfig("lru", fraction=0.5), kernels=kernels, device="cpu",
                                    record=False)
    kv = engine.new_kv(64)
    out = [engine.prefill(tokens[:5], kv, all_logits=True)]
    for t in tokens[5:]:
        out.append(engine.decode(t, kv))
    return torch.cat(out).float(), engine


@pytest.mark.parametrize("fallback", [False, True])
def test_host_logits_equal_the_reference_set(qwen3, fallback, monkeypatch):
    tokens = [3, 17, 5, 9, 1, 22, 40, 8]
    ref, _ = _logits(qwen3, "reference", tokens)
    if fallback:
        monkeypatch.setattr(hk, "available", lambda: False)
    got, engine = _logits(qwen3, "host", tokens)
    assert engine.cache.pool.alias and engine.cache.pool.nbytes == 0
    assert all(s is None for s in engine.decoder.steps) == fallback  # the one-call decode attention, where built
    assert (got - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()


def test_a_decode_batch_equals_its_sequences_solo(qwen3):
    engine = Engine.from_pretrained(qwen3, CacheConfig("lru", fraction=0.5), kernels="host", device="cpu",
                                    record=False)
    prompts = [[3, 4, 5], [9, 1, 2, 7, 7], [11]]
    kvs = [engine.new_kv(32) for _ in prompts]
    firsts = [int(engine.prefill(p, kv)[-1].argmax()) for p, kv in zip(prompts, kvs)]
    batch = engine.decode_batch(firsts, kvs)  # [B, V]
    for p, first, row in zip(prompts, firsts, batch):
        kv = engine.new_kv(32)
        engine.prefill(p, kv)
        solo = engine.decode(first, kv)[0]
        assert torch.equal(solo, row)


def test_a_long_prefill_chunk_takes_torchs_gemm_with_the_same_result(monkeypatch):
    """Dense experts averaging GEMM_TOKENS_PER_EXPERT tokens go to torch's GEMM (gate / up rounded to the dtype
    before the activation, as HF does) where torch's bf16 GEMM is fast, else stay on the C kernels, which keep them
    in fp32: both within bf16 rounding of the fp32 reference."""
    from freetoken.engine.slots import ExpertStore
    from freetoken.host import grouped
    from freetoken.host.kernels import moe_ref

    gen = torch.Generator().manual_seed(0)
    E, I, D, T, K = 4, 64, 128, 200, 2
    gu, dn = (torch.randn(1, E, 2 * I, D, generator=gen) / 8).bfloat16()[0], (torch.randn(E, D, I, generator=gen) / 8).bfloat16()
    store = ExpertStore([(gu, dn)])
    x = torch.randn(T, D, generator=gen).bfloat16()
    ids = np.stack([torch.randperm(E, generator=gen)[:K].numpy() for _ in range(T)]).astype(np.int32)
    w = torch.rand(T, K, generator=gen)
    monkeypatch.setattr(grouped, "_HALF_FAST", [False])  # an AVX2-only CPU: torch's bf16 GEMM is a slow fallback
    assert not grouped.gemm_sized(ids, None, E, torch.bfloat16) and grouped.gemm_sized(ids, None, E, torch.float32)
    monkeypatch.setattr(grouped, "_HALF_FAST", [True])
    bf16 = torch.bfloat16
    assert grouped.gemm_sized(ids, None, E, bf16) and not grouped.gemm_sized(ids[:20], None, E, bf16)
    ref = moe_ref(x, torch.from_numpy(ids), w, torch.ones(E, dtype=torch.uint8), gu[:, :I].float(), gu[:, I:].float(),
                  dn.float())
    gemm = store.host_moe(0, x, ids, w, None)
    native = torch.cat([store.host_moe(0, x[i:i + 20], ids[i:i + 20], w[i:i + 20], None) for i in range(0, T, 20)])
    for out in (gemm, native):
        assert ((out - ref).abs().max() / ref.abs().max()).item() < 1e-2
