"""The quantized CPU lane: packed int4 / fp8 / fp4 experts computed on the host equal a torch sum over the test
quantizers' own dequantized matrices (tests/kernels/quant_by_hand.py), through the host kernels (this CPU's path
and the portable one) and through the torch fallback; the host kernels read the packed bits as stored, so no
expert is ever dequantized (no copy is made, cached or not)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.engine.executor import LiveExecutor
from freetoken.engine.kernelset import kernel_set
from freetoken.engine.slots import ExpertStore, SlotPool
from freetoken.host import kernels as hk
from freetoken.placement import DECODE, Plan
from freetoken.quant import packed
from tests.kernels import quant_by_hand as qh

E, D, I = 4, 32, 32


def _quantize(kind: str, w: torch.Tensor, gen: torch.Generator):
    if kind == "int4":
        return qh.int4(w, 16, symmetric=False, act_order=False, gen=gen)
    if kind == "fp8":
        return qh.fp8(w, (1, w.shape[-1]))
    return qh.fp4(w, 32, "e8m0")


def _store(kind: str, dtype: torch.dtype = torch.float32):
    gen = torch.Generator().manual_seed(0)
    gate, up, down = (torch.randn(E, I, D, generator=gen) / 4, torch.randn(E, I, D, generator=gen) / 4,
                      torch.randn(E, D, I, generator=gen) / 4)
    packed_ws, deq = zip(*(_quantize(kind, w, gen) for w in (gate, up, down)))
    return ExpertStore([tuple(packed_ws)], dtype=dtype), deq


def _reference(deq, x, weights, ids) -> torch.Tensor:
    gate, up, down = deq
    out = torch.zeros(x.shape)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = ids[t, k]
            out[t] += weights[t, k] * (down[e] @ (torch.nn.functional.silu(gate[e] @ x[t]) * (up[e] @ x[t])))
    return out


@pytest.mark.parametrize("lane", ["native", "generic", "torch"])
@pytest.mark.parametrize("kind", ["int4", "fp8", "fp4"])
def test_quantized_cpu_lane_equals_reference_without_dequantizing(kind, lane, monkeypatch):
    store, deq = _store(kind)
    if lane == "generic":
        real = hk.moe
        monkeypatch.setattr(hk, "moe", lambda *a, **kw: real(*a, **kw, generic=True))
    elif lane == "torch":
        monkeypatch.setattr(hk, "available", lambda: False)
    else:  # the host kernels read the packed bits: dequantizing anything is a failure here
        def refuse(*_a, **_kw):
            raise AssertionError("an expert was dequantized")
        monkeypatch.setattr(packed, "dequantize_packed", refuse)
    ex = LiveExecutor(store, SlotPool(0, 1, store, "cpu"), kernel_set("reference"), torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    ids = np.array([[0, 2], [2, 3]])
    for _ in range(3):
        x, weights = torch.randn(2, D, generator=g), torch.rand(2, 2, generator=g)
        y = ex.run(Plan(0, [], [], [], [], [0, 2, 3]), x, weights, ids, DECODE)
        torch.testing.assert_close(y, _reference(deq, x, weights, ids), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("kind", ["int4", "fp8", "fp4"])
def test_bf16_cpu_lane_matches_the_reference_to_bf16_rounding(kind):
    """bf16 activations take the AVX512-BF16 path where the CPU has it: exact products, fp32 sums; the gated
    activation rounds to bf16 before the down projection (as the GPU kernel's buffer does)."""
    store, deq = _store(kind, torch.bfloat16)
    ex = LiveExecutor(store, SlotPool(0, 1, store, "cpu"), kernel_set("reference"), torch.device("cpu"))
    g = torch.Generator().manual_seed(2)
    ids = np.array([[0, 2], [1, 3], [3, 0]])
    x, weights = torch.randn(3, D, generator=g).bfloat16(), torch.rand(3, 2, generator=g)
    y = ex.run(Plan(0, [], [], [], [], [0, 1, 2, 3]), x, weights, ids, DECODE)
    ref = _reference(deq, x.float(), weights, ids)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
