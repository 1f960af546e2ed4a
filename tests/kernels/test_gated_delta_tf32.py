"""gated_delta_chunk with bf16 inputs takes tf32 products (tensor cores) on a GPU. The interpreter computes every
product in fp32, so two checks: the bf16 launch (value columns in blocks of 32) against HF's chunk rule under the
interpreter, and the kernel's chunk algorithm in torch with every product operand rounded to tf32 (10 mantissa bits,
as the tensor cores read fp32) against HF's rule at Qwen3-Next's head dims: its error stays below what rounding the
output to bf16 loses."""

from __future__ import annotations

import torch

from freetoken.kernels.gated_delta_chunk import CHUNK, gated_delta_chunk, l2norm

from tests.kernels.tolerances import TOL


def _inputs(T, Hk, Hv, Dk, Dv, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(T, Hk, Dk, generator=g), torch.randn(T, Hk, Dk, generator=g)
    v = torch.randn(T, Hv, Dv, generator=g)
    gate = -torch.nn.functional.softplus(torch.randn(T, Hv, generator=g))
    beta = torch.sigmoid(torch.randn(T, Hv, generator=g))
    start = torch.randn(Hv, Dk, Dv, generator=g) * 0.3
    return q.to(dtype), k.to(dtype), v.to(dtype), gate, beta.to(dtype), start


def _hf(q, k, v, gate, beta, state):
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    out, final = torch_chunk_gated_delta_rule(q[None].float(), k[None].float(), v[None].float(), gate[None].float(),
                                              beta[None].float(), initial_state=state[None], output_final_state=True,
                                              use_qk_l2norm_in_kernel=True)
    return out[0], final[0]


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> the nearest value with a 10-bit mantissa (ties away from zero), as a tensor core reads it."""
    return ((x.contiguous().view(torch.int32) + 0x1000) & -0x2000).view(torch.float32)


def _chunk_tf32(q, k, v, gate, beta, state, BT=CHUNK):
    """The kernel's chunk algorithm per value head, each product's operands rounded to tf32."""
    mm = lambda a, b: _tf32(a) @ _tf32(b)  # noqa: E731
    T, Hk, Dk = q.shape
    Hv, Dv = v.shape[1:]
    out, S = torch.empty(T, Hv, Dv), state.clone()
    for h in range(Hv):
        hk = h // (Hv // Hk)
        for t0 in range(0, T, BT):
            sl = slice(t0, min(t0 + BT, T))
            qc, kc = l2norm(q[sl, hk]) * Dk ** -0.5, l2norm(k[sl, hk])
            vc, bc, c = v[sl, h].float(), beta[sl, h].float(), gate[sl, h].float().cumsum(0)
            n = c.numel()
            lower = torch.ones(n, n, dtype=torch.bool).tril()
            decay = (c[:, None] - c[None, :]).masked_fill(~lower, float("-inf")).exp()
            kb = kc * bc[:, None]
            A = (mm(kb, kc.T) * decay).tril(-1)
            W = torch.linalg.inv(torch.eye(n) + A)  # the kernel's forward substitution, exact either way
            v_new = mm(W, vc * bc[:, None]) - mm(mm(W, kb * c.exp()[:, None]), S[h])
            out[sl, h] = mm(qc * c.exp()[:, None], S[h]) + mm(mm(qc, kc.T) * decay, v_new)
            S[h] = S[h] * c[-1].exp() + mm((kc * (c[-1] - c).exp()[:, None]).T, v_new)
    return out, S


def test_bf16_launch_is_hf_chunk_rule():
    """Dv = 40: two programs of 32 value columns per head; the output in bf16 at its tolerance."""
    q, k, v, gate, beta, start = _inputs(37, 1, 2, 16, 40, 5, torch.bfloat16)
    want, want_state = _hf(q, k, v, gate, beta, start.clone())
    state = start.clone()
    out = gated_delta_chunk(q, k, v, gate, beta, state)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want, **TOL[torch.bfloat16])
    torch.testing.assert_close(state, want_state, rtol=1e-4, atol=1e-5)  # fp32 products in the interpreter


def test_tf32_products_stay_inside_the_bf16_tolerance():
    """Measured here: output error ~2.5e-5 against ~1.2e-4 from rounding the exact output to bf16; state error
    ~2.4e-4 at a state scale of 0.3-0.5."""
    q, k, v, gate, beta, start = _inputs(64, 1, 2, 128, 128, 8, torch.bfloat16)
    want, want_state = _hf(q, k, v, gate, beta, start.clone())
    out, state = _chunk_tf32(q, k, v, gate, beta, start)
    bf16_rounding = (want.to(torch.bfloat16).float() - want).abs().max()
    assert 0 < (out - want).abs().max() <= bf16_rounding  # rounded, yet below what the bf16 output loses anyway
    assert (state - want_state).abs().max() <= 2 ** -8 * want_state.abs().max()  # under a bf16 ulp of the state
