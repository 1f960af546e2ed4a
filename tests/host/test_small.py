"""The host set's small ops against their references: RMSNorm (both rounding orders), rotary embedding (partial
rotary, strided heads), softmax top-k routing (renormalised or not; ties to the lower id, as the Triton kernel)."""

from __future__ import annotations

import pytest
import torch

from freetoken.host import ops
from freetoken.kernels import apply_rope_ref, rms_norm_ref, router_topk_ref
from tests.host.conftest import native_or_skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm(dtype):
    native_or_skip()
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 96, generator=gen).to(dtype), torch.randn(96, generator=gen).to(dtype)
    for rn in (True, False):
        out, ref = ops.rms_norm(x, w, 1e-6, rn), rms_norm_ref(x, w, 1e-6, rn)
        assert out.dtype == dtype
        ulp = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]  # a last-bit flip at most
        assert ((out.float() - ref.float()).abs() <= ulp * ref.float().abs() + 1e-6).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope(dtype):
    native_or_skip()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 8, 32, generator=gen).to(dtype)[:, ::2]  # strided heads
    pos = torch.tensor([0, 7, 4000])
    for rotary in (32, 16):
        out, ref = ops.apply_rope(x, pos, 1e6, rotary), apply_rope_ref(x, pos, 1e6, rotary)
        tol = 1e-5 if dtype == torch.float32 else 8e-3
        assert ((out.float() - ref.float()).abs() <= tol * ref.float().abs().clamp(min=1)).all()


def test_softmax_topk():
    native_or_skip()
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(9, 64, generator=gen)
    for renorm in (True, False):
        w, ids = ops.router_topk(logits, 8, renorm)
        rw, rids = router_topk_ref(logits, 8, renorm)
        assert torch.equal(ids, rids)
        torch.testing.assert_close(w, rw, rtol=1e-6, atol=1e-7)
    tied = torch.zeros(1, 16)
    tied[0, 3] = tied[0, 9] = 1.0
    _, ids = ops.router_topk(tied, 3, True)
    assert ids.tolist() == [[3, 9, 0]]  # equal scores: the lower id first
    with pytest.raises(ValueError, match="k: 65 exceeds"):
        ops.router_topk(logits, 65, True)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_prompts_rope_and_routing_in_threads_equal_one_token_at_a_time(threads):
    """Prompt-sized calls (tokens split over the threads) give each token what a one-token call gives it, and match
    the references: routing ids exactly (a stable sort: ties on every token, scores from four values)."""
    native_or_skip()
    from freetoken.host import kernels as hk

    gen = torch.Generator().manual_seed(3)
    hk.set_threads(threads)
    x = torch.randn(37, 4, 64, generator=gen).bfloat16()
    pos = torch.arange(100, 137)
    out = ops.apply_rope(x, pos, 1e6, 64)
    assert torch.equal(out, torch.cat([ops.apply_rope(x[t:t + 1], pos[t:t + 1], 1e6, 64) for t in range(37)]))
    ref = apply_rope_ref(x, pos, 1e6, 64)
    assert ((out.float() - ref.float()).abs() <= 8e-3 * ref.float().abs().clamp(min=1)).all()
    logits = torch.randint(0, 4, (37, 32), generator=gen).float()
    p, order = torch.sort(torch.softmax(logits, -1), dim=-1, descending=True, stable=True)  # ties: the lower id first
    for k in (1, 6, 32):
        w, ids = ops.router_topk(logits, k, True)
        assert torch.equal(ids, order[:, :k].int()), k
        torch.testing.assert_close(w, p[:, :k] / p[:, :k].sum(-1, keepdim=True), rtol=1e-6, atol=1e-7)
        one = [ops.router_topk(logits[t:t + 1], k, True)[1] for t in range(37)]
        assert torch.equal(ids, torch.cat(one))
