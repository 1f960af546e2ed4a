"""router_topk's DeepSeek options (sigmoid scores, a choice-only correction bias, group-limited top-k, a weight
scale) under the interpreter vs the torch reference, and the reference vs transformers' DeepseekV2TopkRouter
(softmax, greedy / group_limited_greedy) and DeepseekV3TopkRouter (sigmoid + e_score_correction_bias, top-2 group
scores, renormalised, routed_scaling_factor)."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels import router_topk, router_topk_ref

V2_GROUPED = dict(score="softmax", n_group=4, topk_group=2, group_score="max", scale=1.5)
V3 = dict(score="sigmoid", n_group=4, topk_group=2, group_score="top2", scale=2.5)
CASES = {
    "v2 greedy scaled": (False, dict(scale=1.5), False),
    "v2 group_limited_greedy": (False, V2_GROUPED, False),
    "v3 sigmoid bias groups": (True, V3, True),
    "sigmoid one group": (True, dict(score="sigmoid"), True),
}


def _sorted(w: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = ids.argsort(dim=-1)
    return w.gather(1, order), ids.gather(1, order.to(ids.dtype).long())


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("T,E,k", [(5, 16, 4), (3, 32, 6)])
def test_kernel_matches_reference(case, T, E, k):
    renorm, opts, with_bias = CASES[case]
    g = torch.Generator().manual_seed(T * E + k)
    logits = torch.randn(T, E, generator=g) * 2
    bias = torch.randn(E, generator=g) * 0.5 if with_bias else None
    w, ids = router_topk(logits, k, renorm, bias=bias, **opts)
    w_ref, ids_ref = router_topk_ref(logits, k, renorm, bias=bias, **opts)
    assert torch.equal(ids, ids_ref)  # both descending in the choice score; fp32 random scores do not tie
    torch.testing.assert_close(w, w_ref, rtol=1e-5, atol=1e-6)
    if opts.get("n_group", 1) > 1:  # every pick lies in one of topk_group groups
        groups = ids.long() // (E // opts["n_group"])
        assert all(len(set(row.tolist())) <= opts["topk_group"] for row in groups)


def test_groups_and_bias_change_the_picks():
    """The options are live: without the groups or the bias, the picks differ on these logits."""
    g = torch.Generator().manual_seed(3)
    logits, bias = torch.randn(8, 32, generator=g) * 2, torch.randn(32, generator=g)
    _, ids = router_topk(logits, 6, True, bias=bias, **V3)
    _, no_groups = router_topk(logits, 6, True, bias=bias, score="sigmoid", scale=2.5)
    _, no_bias = router_topk(logits, 6, True, **V3)
    assert not torch.equal(ids, no_groups) and not torch.equal(ids, no_bias)


def test_bad_options_are_named():
    logits = torch.randn(2, 12)
    with pytest.raises(ValueError, match="n_group: 5 must be >= 1 and divide the 12 experts"):
        router_topk(logits, 2, True, n_group=5)
    with pytest.raises(ValueError, match="score: 'tanh'"):
        router_topk(logits, 2, True, score="tanh")
    with pytest.raises(ValueError, match="k: 7 exceeds the 2 x 3 experts"):
        router_topk(logits, 7, True, n_group=4, topk_group=2)
    with pytest.raises(ValueError, match="bias: 3 entries"):
        router_topk(logits, 2, True, bias=torch.zeros(3))


def _hf_router(version: str, E: int, k: int, **kw):
    from transformers import DeepseekV2Config, DeepseekV3Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    if version == "v2":
        cfg = DeepseekV2Config(hidden_size=16, num_attention_heads=4, n_routed_experts=E, num_experts_per_tok=k, **kw)
        return DeepseekV2TopkRouter(cfg)
    cfg = DeepseekV3Config(hidden_size=16, num_attention_heads=4, n_routed_experts=E, num_experts_per_tok=k, **kw)
    return DeepseekV3TopkRouter(cfg)


@pytest.mark.parametrize("version,hf_kw,ours", [
    ("v2", dict(topk_method="greedy", routed_scaling_factor=1.5), dict(scale=1.5)),
    ("v2", dict(topk_method="group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=1.5), V2_GROUPED),
    ("v3", dict(n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True), V3),
])
def test_reference_matches_transformers(version, hf_kw, ours):
    E, k = 16, 4
    router = _hf_router(version, E, k, **hf_kw)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        router.weight.copy_(torch.randn(E, 16, generator=g))
        bias = None
        if version == "v3":
            bias = torch.randn(E, generator=g) * 0.3
            router.e_score_correction_bias.copy_(bias)
        x = torch.randn(6, 16, generator=g)
        logits, hf_w, hf_ids = router(x)
    renorm = version == "v3"  # HF's V2 router never renormalises
    w, ids = router_topk_ref(logits, k, renorm, bias=bias, **ours)
    hf_w, hf_ids = _sorted(hf_w, hf_ids)
    w, ids = _sorted(w, ids)
    assert torch.equal(ids.long(), hf_ids)
    torch.testing.assert_close(w, hf_w, rtol=1e-6, atol=1e-7)
