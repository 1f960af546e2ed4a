"""What the engine runs on a CPU-only machine (the `reference` kernel set) where a per-pair or explicit-score torch
reference would be slow: the routed-expert FFN grouped by slot, and attention through torch's fused SDPA.

Expert FFN: expert_ffn_ref gathers a copy of an expert's weights for every (token, pick) pair ([T, K, 2I, D]): the oracle of the
Triton kernel, but on a host it makes prefill memory grow with the prompt and runs one tiny product per pair. Here
each slot touched by the call is read once and multiplies all of its tokens in one GEMM (decode: one GEMV per pick),
in fp32 as the reference does; each pair's output lands in its own row and a token's K rows are summed at the end
(the GPU kernel's sum_pairs), so the result equals expert_ffn_ref up to summation order.
"""

from __future__ import annotations

from typing import Callable

import torch

from freetoken.kernels.attention import attention_ref, visible_kv
from freetoken.kernels.expert_ffn import glu_ref
from freetoken.kernels.expert_ffn_quant import check_packed_experts
from freetoken.kernels.pair_sums import deferrable
from freetoken.quant.packed import PackedWeight

SlotWeights = Callable[[int], tuple[torch.Tensor, torch.Tensor]]  # slot -> (gate_up [2I, D], down [D, I])


def _grouped(x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, slot_weights: SlotWeights,
             b_gate_up: torch.Tensor | None, b_down: torch.Tensor | None, glu: str, alpha: float,
             limit: float) -> torch.Tensor:
    # T = tokens, K = picks, D = hidden, I = expert intermediate, n = pairs of one slot
    T, K = slot_ids.shape
    flat = slot_ids.reshape(-1)  # [T * K]
    route = weights.reshape(-1).float()  # [T * K]
    xf = x.float()
    y_pairs = torch.zeros(T * K, x.shape[1], dtype=torch.float32, device=x.device)  # [T * K, D]
    order = torch.argsort(flat, stable=True)  # pairs grouped by slot, token order kept inside a group
    slots, counts = torch.unique_consecutive(flat[order], return_counts=True)
    start = 0
    for s, n in zip(slots.tolist(), counts.tolist()):
        pairs = order[start:start + n]  # [n]
        start += n
        if s < 0:  # not resident: another lane computes it
            continue
        tok = pairs // K  # [n]
        gate_up, down = slot_weights(s)
        I = down.shape[1]
        h = xf[tok] @ gate_up.float().T  # [n, 2I]
        if b_gate_up is not None:
            h = h + b_gate_up[s].float()
        h = glu_ref(h[:, :I], h[:, I:], glu, alpha, limit)  # [n, I]
        y = h @ down.float().T  # [n, D]
        if b_down is not None:
            y = y + b_down[s].float()
        y_pairs[pairs] = y * route[pairs, None]
    return y_pairs.view(T, K, -1).sum(1).to(x.dtype)  # [T, D]: each token's K picks, in pick order


@deferrable
def expert_ffn_host(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
    b_gate_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None, glu: str = "silu",
    alpha: float = 1.702, limit: float = 7.0, max_experts: int | None = None,
) -> torch.Tensor:
    """expert_ffn's contract (x [T, D], slot_ids [T, K] with -1 = skip, weights [T, K], w_gate_up [S, 2I, D],
    w_down [S, D, I]) computed slot by slot. max_experts (the kernel's padding bound) has nothing to bound here:
    only the slots the call touches are visited."""
    return _grouped(x, slot_ids, weights, lambda s: (w_gate_up[s], w_down[s]), b_gate_up, b_down, glu, alpha, limit)


@deferrable
def expert_ffn_quant_host(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor,
    gate: PackedWeight, up: PackedWeight, down: PackedWeight, **options,
) -> torch.Tensor:
    """expert_ffn_quant's contract: only the slots this call touches are dequantized, each once."""
    check_packed_experts(gate, up, down, x.shape[1])
    options.pop("max_experts", None)  # no padding to bound: only the touched slots are visited
    b_gate_up, b_down = options.pop("b_gate_up", None), options.pop("b_down", None)

    def slot_weights(s: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat([gate.to_float(s), up.to_float(s)]), down.to_float(s)

    return _grouped(x, slot_ids, weights, slot_weights, b_gate_up, b_down, options.get("glu", "silu"),
                    options.get("alpha", 1.702), options.get("limit", 7.0))


def causal_after(start_pos: int, T: int, device=None) -> torch.Tensor:
    """[T, start_pos + T] bool: query t sees keys <= start_pos + t (what torch.nn.attention.bias.causal_lower_right
    materialises on the CPU anyway; importing that module costs ~1 s of torch._dynamo at the first request)."""
    return torch.ones(T, start_pos + T, dtype=torch.bool, device=device).tril(start_pos)


def attention_host(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start_pos: int, sm_scale: float,
    sinks: torch.Tensor | None = None, window: int | None = None, k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """attention's contract through torch's scaled_dot_product_attention in fp32 on [1, H, T, Dh] queries against
    [1, Hkv, L, Dh] keys (GQA without repeating kv heads); the causal mask aligned to the last T keys (query t sees
    positions <= start_pos + t) is SDPA's own from position 0, a boolean [T, L] mask after a cached prefix. Sinks and
    sliding windows go to attention_ref, which spells them out. An FP8 cache is dequantized first."""
    if sinks is not None or window is not None:
        return attention_ref(q, k_cache, v_cache, start_pos, sm_scale, sinks, window, k_scale, v_scale)
    # T = queries, H = heads, Hkv = kv heads, L = visible positions, Dh = head dim
    T, H, Dh = q.shape
    L = start_pos + T
    k, v = visible_kv(k_cache, v_cache, L, k_scale, v_scale)  # [L, Hkv, Dh] fp32
    qh = q.float().transpose(0, 1)[None]  # [1, H, T, Dh]
    kh, vh = k.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, Hkv, L, Dh]
    gqa = H != kh.shape[1]
    if start_pos == 0:
        o = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=T > 1, scale=sm_scale,
                                                             enable_gqa=gqa)
    else:
        o = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=causal_after(start_pos, T),
                                                             scale=sm_scale, enable_gqa=gqa)
    return o[0].transpose(0, 1).to(q.dtype)  # [T, H, Dh]
