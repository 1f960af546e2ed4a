"""Host decode attention against the explicit reference (kernels/attention.py attention_ref): GQA, sinks, sliding
windows, an fp8 cache, a batch of sequences of different lengths in one call; and the one-call decode step
(norms, rope, KV writes, attention) against the same ops done one by one with the references."""

from __future__ import annotations

import pytest
import torch

from freetoken.host import kernels as hk
from freetoken.kernels import apply_rope_ref, attention_ref, rms_norm_ref
from freetoken.kernels.kv_fp8 import quantize_kv
from freetoken.kernels.rope import _inv_freq
from tests.host.conftest import native_or_skip


@pytest.mark.parametrize("H,Hkv,Dh", [(8, 2, 64), (4, 4, 32), (6, 2, 24), (10, 2, 40)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("generic", [False, True], ids=["native", "portable"])
def test_decode_batch_equals_the_reference_per_sequence(H, Hkv, Dh, dtype, generic):
    """Both builds: the native one (AVX-512 where the CPU has it) and the portable one (AVX2, as CPUs without
    AVX-512 run it); the head dims reach the vector paths' whole and part tiles and the scalar path (24, 40)."""
    native_or_skip()
    if generic and hk.library(generic=True) is None:
        pytest.skip("the portable host build is unavailable")
    gen = torch.Generator().manual_seed(H + Dh)
    lengths = [1, 9, 33]
    ks = [torch.randn(n + 4, Hkv, Dh, generator=gen).to(dtype) for n in lengths]
    vs = [torch.randn(n + 4, Hkv, Dh, generator=gen).to(dtype) for n in lengths]
    q = torch.randn(len(lengths), H, Dh, generator=gen).to(dtype)
    sinks = torch.randn(H, generator=gen)
    for opts in ({}, {"sinks": sinks}, {"window": 5}, {"sinks": sinks, "window": 3}):
        out = hk.attention_decode(q, ks, vs, lengths, Dh ** -0.5, generic=generic, **opts)
        for b, n in enumerate(lengths):
            ref = attention_ref(q[b:b + 1], ks[b], vs[b], n - 1, Dh ** -0.5, **opts)
            tol = 1e-5 if dtype == torch.float32 else 8e-3
            assert (out[b].float() - ref[0].float()).abs().max().item() < tol * ref.abs().max().item()


def test_fp8_cache():
    native_or_skip()
    gen = torch.Generator().manual_seed(3)
    k, v = torch.randn(20, 2, 32, generator=gen), torch.randn(20, 2, 32, generator=gen)
    (kq, ks), (vq, vs) = quantize_kv(k), quantize_kv(v)
    q = torch.randn(1, 4, 32, generator=gen)
    out = hk.attention_decode(q, [kq], [vq], [17], 0.2, k_scales=[ks], v_scales=[vs])
    ref = attention_ref(q, kq, vq, 16, 0.2, k_scale=ks, v_scale=vs)
    assert (out - ref).abs().max().item() < 1e-5


@pytest.mark.parametrize("norm", [None, "head", "full"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_decode_step_equals_the_ops_one_by_one(norm, dtype):
    native_or_skip()
    gen = torch.Generator().manual_seed(11)
    H, Hkv, Dh, rotary = 4, 2, 32, 16
    starts = [0, 5, 12]
    B = len(starts)
    qkv = torch.randn(B, (H + 2 * Hkv) * Dh, generator=gen).to(dtype)
    span = Dh if norm == "head" else (H * Dh, Hkv * Dh)
    qn = kn = None
    if norm == "head":
        qn, kn = torch.rand(Dh, generator=gen).to(dtype) + 0.5, torch.rand(Dh, generator=gen).to(dtype) + 0.5
    elif norm == "full":
        qn, kn = torch.rand(span[0], generator=gen).to(dtype) + 0.5, torch.rand(span[1], generator=gen).to(dtype) + 0.5
    inv = _inv_freq(1e4, rotary, "cpu")
    layer = hk.StepLayer(H, Hkv, Dh, Dh ** -0.5, inv.float(), rotary, 1.0, qn, kn, norm == "full", 1e-6)
    caches = [(torch.randn(16, Hkv, Dh, generator=gen).to(dtype), torch.randn(16, Hkv, Dh, generator=gen).to(dtype))
              for _ in starts]
    want_caches = [(k.clone(), v.clone()) for k, v in caches]
    out = hk.attention_step(qkv, layer, starts, [k for k, _ in caches], [v for _, v in caches])
    for b, s in enumerate(starts):  # the reference: the engine's op-by-op path (engine/model.py _project)
        q, k, v = qkv[b:b + 1].split([H * Dh, Hkv * Dh, Hkv * Dh], dim=1)
        if norm == "full":
            q, k = rms_norm_ref(q, qn, 1e-6), rms_norm_ref(k, kn, 1e-6)
        q, k, v = q.reshape(1, H, Dh), k.reshape(1, Hkv, Dh), v.reshape(1, Hkv, Dh)
        if norm == "head":
            q = rms_norm_ref(q.reshape(H, Dh), qn, 1e-6).view(1, H, Dh)
            k = rms_norm_ref(k.reshape(Hkv, Dh), kn, 1e-6).view(1, Hkv, Dh)
        pos = torch.tensor([s])
        q, k = apply_rope_ref(q, pos, 1e4, rotary), apply_rope_ref(k, pos, 1e4, rotary)
        kc, vc = want_caches[b]
        kc[s], vc[s] = k[0], v[0]
        ref = attention_ref(q, kc, vc, s, Dh ** -0.5)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        assert (out[b].float() - ref[0].float()).abs().max().item() < tol * ref.abs().max().item()
        exact = 0 if dtype == torch.bfloat16 else 1e-6  # bf16 k / v written bit for bit as the reference rounds them
        assert (caches[b][0].float() - kc.float()).abs().max().item() <= exact * kc.abs().max().item() + 1e-7 or \
            dtype == torch.float32
        assert torch.equal(caches[b][1], vc)
