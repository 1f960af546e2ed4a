"""DeepSeek-V4's kernels (interpreted Triton and torch references) against transformers' deepseek_v4 modules: the
hyper-connections (DeepseekV4HyperConnection / HyperHead and the decoder layer's mixing), the compressed attention
(its eager_attention_forward with sinks over window keys and compressed entries, the block mask built as its
compressors build it), the compression pooling, the routers (DeepseekV4TopKRouter, DeepseekV4HashRouter) and the
experts' clamped activation (DeepseekV4Experts._apply_gate)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from freetoken.kernels.attention_compressed import attention_compressed, attention_compressed_ref
from freetoken.kernels.compress_pool import compress_pool, compress_pool_ref
from freetoken.kernels.expert_ffn import glu_ref
from freetoken.kernels.hyper_connection import hc_head, hc_head_ref, hc_post, hc_post_ref, hc_pre, hc_pre_ref
from freetoken.kernels.router import router_topk, router_topk_ref, router_weights, router_weights_ref
from tests.kernels.tolerances import assert_close


def _hf_config(**kw):
    from transformers import DeepseekV4Config

    return DeepseekV4Config(**{**dict(hidden_size=40, num_hidden_layers=1, n_routed_experts=8, num_experts_per_tok=2,
                                      vocab_size=32), **kw})


@pytest.mark.parametrize("hc", [3, 4])
def test_hyper_connections_are_hf(hc):
    """hc_pre's (post, comb, collapsed), hc_post's new streams and hc_head's collapse = transformers' modules with
    random fn / base / scale (Sinkhorn's 20 rounds), for 3 (padded) and 4 streams."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection, DeepseekV4HyperHead

    cfg = _hf_config(hc_mult=hc)
    g = torch.Generator().manual_seed(hc)
    T, D = 5, cfg.hidden_size
    mod, head = DeepseekV4HyperConnection(cfg), DeepseekV4HyperHead(cfg)
    with torch.no_grad():
        for p in (*mod.parameters(), *head.parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        x = torch.randn(1, T, hc, D, generator=g)
        post, comb, collapsed = mod(x)
        y = torch.randn(1, T, D, generator=g)
        streams = post.unsqueeze(-1) * y.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), x)  # the layer's mix
        final = head(x)
    args = (mod.fn.detach(), mod.base.detach(), mod.scale.detach(), cfg.rms_norm_eps, cfg.hc_eps, cfg.hc_sinkhorn_iters)
    for pre_fn, post_fn in ((hc_pre, hc_post), (hc_pre_ref, hc_post_ref)):
        got = pre_fn(x[0], *args)
        for ours, theirs in zip(got, (post[0], comb[0], collapsed[0])):
            assert_close(ours, theirs)
        assert_close(post_fn(x[0], y[0], got[0], got[1]), streams[0])
    for fn in (hc_head, hc_head_ref):
        assert_close(fn(x[0], head.hc_fn.detach(), head.hc_base.detach(), head.hc_scale.detach(), cfg.rms_norm_eps,
                        cfg.hc_eps), final[0])
    comb_rows, comb_cols = got[1].sum(-1), got[1].sum(-2)  # Sinkhorn: nearly doubly stochastic after 20 rounds
    assert (comb_rows - 1).abs().max() < 1e-2 and (comb_cols - 1).abs().max() < 1e-5


@pytest.mark.parametrize("T", [1, 70])
def test_sinkhorn_on_both_paths_is_hf(T):
    """hc_pre_ref = DeepseekV4HyperConnection at a decode token (its Sinkhorn in numpy) and past
    SINKHORN_NUMPY_TOKENS (in torch)."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection

    from freetoken.kernels.hyper_connection import SINKHORN_NUMPY_TOKENS

    assert 1 <= SINKHORN_NUMPY_TOKENS < 70  # (the two cases take the two paths)
    cfg = _hf_config(hc_mult=4)
    g = torch.Generator().manual_seed(T)
    mod = DeepseekV4HyperConnection(cfg)
    with torch.no_grad():
        for p in mod.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        x = torch.randn(1, T, 4, cfg.hidden_size, generator=g)
        want = mod(x)
    got = hc_pre_ref(x[0], mod.fn.detach(), mod.base.detach(), mod.scale.detach(), cfg.rms_norm_eps, cfg.hc_eps,
                     cfg.hc_sinkhorn_iters)
    for ours, theirs in zip(got, want):
        assert_close(ours, theirs[0])


def test_references_over_several_token_blocks_are_hf():
    """A prefill longer than HC_BLOCK_TOKENS runs the references a block at a time: (post, comb, collapsed), the
    new streams and the head's collapse still equal transformers' modules over the whole prompt, the last block a
    partial one."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection, DeepseekV4HyperHead

    from freetoken.kernels.hyper_connection import HC_BLOCK_TOKENS

    cfg = _hf_config(hc_mult=4)
    g = torch.Generator().manual_seed(7)
    T, D = 2 * HC_BLOCK_TOKENS + 44, cfg.hidden_size
    mod, head = DeepseekV4HyperConnection(cfg), DeepseekV4HyperHead(cfg)
    with torch.no_grad():
        for p in (*mod.parameters(), *head.parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        x = torch.randn(1, T, 4, D, generator=g).bfloat16()
        post, comb, collapsed = mod(x)
        y = torch.randn(1, T, D, generator=g).bfloat16()
        streams = post.to(x.dtype).unsqueeze(-1) * y.unsqueeze(-2) + torch.matmul(comb.to(x.dtype).transpose(-1, -2), x)
        final = head(x)
    got = hc_pre_ref(x[0], mod.fn.detach(), mod.base.detach(), mod.scale.detach(), cfg.rms_norm_eps, cfg.hc_eps,
                     cfg.hc_sinkhorn_iters)
    for ours, theirs in zip(got, (post[0], comb[0], collapsed[0])):
        assert_close(ours, theirs)
    assert_close(hc_post_ref(x[0], y[0], got[0], got[1]), streams[0])
    assert_close(hc_head_ref(x[0], head.hc_fn.detach(), head.hc_base.detach(), head.hc_scale.detach(),
                             cfg.rms_norm_eps, cfg.hc_eps), final[0])


def _hf_attention(q, kv, entries, picks, start, window, sinks, scale):
    """transformers' eager_attention_forward: keys = the cache rows up to the last query then the entries, the
    sliding causal mask, the compressor's block bias (a query sees only its picks), sinks."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import eager_attention_forward

    T, H, Dh = q.shape
    L = start + T
    keys = torch.cat([kv[:L], entries])[None, None]  # [1, 1, L + C, Dh]
    qpos, kpos = start + torch.arange(T)[:, None], torch.arange(L)[None, :]
    mask = torch.full((T, L + entries.shape[0]), float("-inf"))
    mask[:, :L] = torch.where((kpos <= qpos) & (kpos > qpos - window), 0.0, float("-inf"))
    for t in range(T):
        for p in picks[t].tolist():
            if p >= 0:
                mask[t, L + p] = 0.0
    module = SimpleNamespace(num_key_value_groups=H, sinks=sinks, training=False)
    out, _ = eager_attention_forward(module, q.transpose(0, 1)[None], keys, keys, mask[None, None], scale)
    return out[0]  # [T, H, Dh]


@pytest.mark.parametrize("start,T", [(0, 6), (9, 4), (13, 1)])
def test_compressed_attention_is_hf(start, T):
    """Window 4 over the cache plus per-query picked entries (some -1), sinks: kernel = reference = HF."""
    g = torch.Generator().manual_seed(start)
    H, Dh, C, P, window = 5, 48, 4, 3, 4
    q = torch.randn(T, H, Dh, generator=g)
    kv = torch.randn(start + T + 2, Dh, generator=g)  # rows past the last query are never read
    entries = torch.randn(C, Dh, generator=g)
    picks = torch.stack([torch.randperm(C, generator=g)[:P] for _ in range(T)])  # distinct, as top-k's
    picks[torch.rand(T, P, generator=g) < 0.3] = -1  # some slots empty
    sinks = torch.randn(H, generator=g)
    want = _hf_attention(q, kv, entries, picks, start, window, sinks, Dh ** -0.5)
    for fn in (attention_compressed, attention_compressed_ref):
        assert_close(fn(q, kv, entries, picks, start, window, sinks, Dh ** -0.5), want)
    none = torch.full_like(picks, -1)  # the entries are in play: without them the answer moves
    assert (attention_compressed_ref(q, kv, entries, none, start, window, sinks, Dh ** -0.5) - want).abs().max() > 1e-2


def test_compressed_attention_checks_its_arguments():
    q, kv = torch.zeros(2, 3, 8), torch.zeros(5, 8)
    with pytest.raises(ValueError, match="fit the cache"):
        attention_compressed(q, kv, torch.zeros(1, 8), torch.zeros(2, 1, dtype=torch.int32), 4, 4, torch.zeros(3), 1.0)
    with pytest.raises(ValueError, match="want q"):
        attention_compressed(q, kv, torch.zeros(1, 4), torch.zeros(2, 1, dtype=torch.int32), 0, 4, torch.zeros(3), 1.0)


@pytest.mark.parametrize("W,S,C", [(3, 8, 40), (2, 128, 20), (1, 4, 600)])
def test_compress_pool_kernel_is_the_reference(W, S, C):
    """Per-channel softmax over a window's slots weighting its values; an empty half (-inf) weighs nothing."""
    g = torch.Generator().manual_seed(S)
    kv, score = torch.randn(W, S, C, generator=g), torch.randn(W, S, C, generator=g)
    score[0, :S // 2] = float("-inf")  # the first window's previous half: empty, as a sequence's first entry
    want = compress_pool_ref(kv, score)
    assert_close(compress_pool(kv, score), want)
    assert_close(want[0], compress_pool_ref(kv[:1, S // 2:], score[:1, S // 2:])[0])


def test_routers_are_hf():
    """sqrt(softplus) top-k with a correction bias for the choice, and given (hash) picks: kernel and reference =
    DeepseekV4TopKRouter / DeepseekV4HashRouter (weights renormalised x routed_scaling_factor)."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HashRouter, DeepseekV4TopKRouter

    cfg = _hf_config()
    g = torch.Generator().manual_seed(3)
    h = torch.randn(6, cfg.hidden_size, generator=g)
    topk, hashed = DeepseekV4TopKRouter(cfg), DeepseekV4HashRouter(cfg)
    with torch.no_grad():
        for r in (topk, hashed):
            r.weight.copy_(torch.randn(r.weight.shape, generator=g) * 0.5)
        topk.e_score_correction_bias.copy_(torch.randn(8, generator=g) * 0.5)
        hashed.tid2eid.copy_(torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(cfg.vocab_size)]))
        logits, w_hf, ids_hf = topk(h)
        tokens = torch.randint(0, cfg.vocab_size, (6,), generator=g)
        _, hw_hf, hids = hashed(h, tokens)
    bias, scale = topk.e_score_correction_bias, cfg.routed_scaling_factor
    for fn in (router_topk, router_topk_ref):
        w, ids = fn(logits, 2, True, "sqrtsoftplus", bias=bias, scale=scale)
        order = ids.long().sort(-1)
        want = ids_hf.sort(-1)
        assert torch.equal(order.values, want.values)
        assert_close(w.gather(1, order.indices), w_hf.gather(1, want.indices))
    for fn in (router_weights, router_weights_ref):
        assert_close(fn(hashed_logits(hashed, h), hids.int(), True, "sqrtsoftplus", scale), hw_hf)


def hashed_logits(router, h):
    return torch.nn.functional.linear(h, router.weight).detach()


def test_clamped_silu_is_hf_apply_gate():
    """glu 'silu_limit': silu(min(gate, limit)) x clamp(up, +-limit), as DeepseekV4Experts._apply_gate."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Experts

    experts = DeepseekV4Experts(_hf_config(moe_intermediate_size=16, swiglu_limit=0.7))
    gate_up = torch.randn(9, 32, generator=torch.Generator().manual_seed(4)) * 2
    assert (gate_up.abs() > 0.7).float().mean() > 0.3  # the clamp bites
    torch.testing.assert_close(glu_ref(gate_up[:, :16], gate_up[:, 16:], "silu_limit", limit=0.7),
                               experts._apply_gate(gate_up), rtol=0, atol=0)
