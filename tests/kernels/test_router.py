"""router_topk kernel vs its reference; the reference vs HF's Qwen3-MoE / OLMoE routers and Mixtral's top-k-then-softmax."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels import router_topk, router_topk_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("T,E,k", [(1, 128, 8), (7, 13, 3), (4, 60, 4)])
@pytest.mark.parametrize("renormalize", [True, False])
def test_kernel_matches_reference(dtype, T, E, k, renormalize):
    g = torch.Generator().manual_seed(T * E + k)
    logits = (torch.randn(T, E, generator=g) * 2).to(dtype)
    w, ids = router_topk(logits, k, renormalize)
    w_ref, ids_ref = router_topk_ref(logits, k, renormalize)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32 and w.shape == (T, k)
    if dtype != torch.float32:  # 16-bit logits can tie; ties are checked below, here compare the chosen weights
        torch.testing.assert_close(w, w_ref, rtol=1e-5, atol=1e-6)
        picked = torch.softmax(logits.float(), -1).gather(1, ids.long())
        torch.testing.assert_close(picked, torch.softmax(logits.float(), -1).gather(1, ids_ref.long()))
    else:
        assert torch.equal(ids, ids_ref)
        torch.testing.assert_close(w, w_ref, rtol=1e-5, atol=1e-6)
    if renormalize:
        torch.testing.assert_close(w.sum(-1), torch.ones(T), rtol=1e-6, atol=1e-6)


def test_ties_go_to_the_lower_id():
    # row 0: experts 1, 2, 4 tie at 3.0 -> top-2 is (1, 2); row 1: all equal -> (0, 1), each weight 1/5 unnormalised
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    w, ids = router_topk(logits, 2, renormalize=False)
    assert ids.tolist() == [[1, 2], [0, 1]]
    torch.testing.assert_close(w[1], torch.full((2,), 0.2))
    w, ids = router_topk(logits, 2, renormalize=True)
    torch.testing.assert_close(w, torch.full((2, 2), 0.5))


def _hf_router(model_type: str, E: int, k: int, norm: bool):
    """HF router module whose gate is the identity, so its logits are its input."""
    from transformers import AutoConfig
    from transformers.models.olmoe.modeling_olmoe import OlmoeTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    cls = {"qwen3_moe": Qwen3MoeTopKRouter, "olmoe": OlmoeTopKRouter}[model_type]
    cfg = AutoConfig.for_model(model_type, hidden_size=E, num_experts=E, num_experts_per_tok=k, norm_topk_prob=norm)
    router = cls(cfg)
    with torch.no_grad():
        router.weight.copy_(torch.eye(E))
    return router


@pytest.mark.parametrize("model_type,norm", [("qwen3_moe", True), ("olmoe", False)])
def test_reference_matches_hf_routers(model_type, norm):
    E, k = 16, 4
    logits = torch.randn(6, E, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        _, w_hf, ids_hf = _hf_router(model_type, E, k, norm)(logits)
    w, ids = router_topk_ref(logits, k, norm)
    assert torch.equal(ids.long(), ids_hf)
    torch.testing.assert_close(w, w_hf, rtol=1e-6, atol=1e-7)


def test_reference_matches_mixtral_topk_then_softmax():
    """Mixtral (original formulation): top-k over the logits, softmax over those k."""
    logits = torch.randn(6, 8, generator=torch.Generator().manual_seed(6))
    top_logits, top_ids = torch.topk(logits, 2, dim=-1)
    w, ids = router_topk_ref(logits, 2, renormalize=True)
    assert torch.equal(ids.long(), top_ids)
    torch.testing.assert_close(w, torch.softmax(top_logits, dim=-1), rtol=1e-6, atol=1e-7)


def test_k_larger_than_experts_is_refused():
    with pytest.raises(ValueError, match="k"):
        router_topk(torch.randn(2, 4), 5, True)
