"""The quantized CPU lane: packed int4 / fp8 / fp4 experts computed on the host equal a torch sum over the test
quantizers' own dequantized matrices (tests/kernels/quant_by_hand.py), and each expert is dequantized once while
it fits the byte budget of the store's DequantCache (LRU beyond it; budget 0 = every use)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.engine.dequant_cache import DequantCache
from freetoken.engine.executor import LiveExecutor
from freetoken.engine.kernelset import kernel_set
from freetoken.engine.slots import ExpertStore, SlotPool
from freetoken.placement import DECODE, Plan
from tests.kernels import quant_by_hand as qh

E, D, I = 4, 32, 32


def _quantize(kind: str, w: torch.Tensor, gen: torch.Generator):
    if kind == "int4":
        return qh.int4(w, 16, symmetric=False, act_order=False, gen=gen)
    if kind == "fp8":
        return qh.fp8(w, (1, w.shape[-1]))
    return qh.fp4(w, 32, "e8m0")


def _store(kind: str, budget: int):
    gen = torch.Generator().manual_seed(0)
    gate, up, down = (torch.randn(E, I, D, generator=gen) / 4, torch.randn(E, I, D, generator=gen) / 4,
                      torch.randn(E, D, I, generator=gen) / 4)
    packed, deq = zip(*(_quantize(kind, w, gen) for w in (gate, up, down)))
    store = ExpertStore([tuple(packed)], dtype=torch.float32, cpu_cache_bytes=budget)
    return store, deq


def _reference(deq, x, weights, ids) -> torch.Tensor:
    gate, up, down = deq
    out = torch.zeros(x.shape)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = ids[t, k]
            out[t] += weights[t, k] * (down[e] @ (torch.nn.functional.silu(gate[e] @ x[t]) * (up[e] @ x[t])))
    return out


@pytest.mark.parametrize("kind", ["int4", "fp8", "fp4"])
def test_quantized_cpu_lane_equals_reference_and_dequantizes_once(kind):
    expert_bytes = 3 * I * D * 4
    store, deq = _store(kind, budget=4 * expert_bytes)
    calls = []
    make = store._dequantize
    store._dequantize = lambda l, e: calls.append((l, e)) or make(l, e)
    ex = LiveExecutor(store, SlotPool(0, 1, store, "cpu"), kernel_set("reference"), torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    ids = np.array([[0, 2], [2, 3]])
    for step in range(3):
        x, weights = torch.randn(2, D, generator=g), torch.rand(2, 2, generator=g)
        y = ex.run(Plan(0, [], [], [], [], [0, 2, 3]), x, weights, ids, DECODE)
        torch.testing.assert_close(y, _reference(deq, x, weights, ids), rtol=2e-5, atol=2e-5)
    assert sorted(calls) == [(0, 0), (0, 2), (0, 3)]  # once each, however many steps
    assert store.dequantized.hits == 6 and store.dequantized.bytes == 3 * expert_bytes


def test_budget_bounds_the_cache():
    expert_bytes = 3 * I * D * 4
    store, _ = _store("fp8", budget=2 * expert_bytes)
    for e in (0, 1, 2, 1, 3):
        store.expert_weights(0, e)
    assert sorted(k for k in [(0, e) for e in range(E)] if k in store.dequantized) == [(0, 1), (0, 3)]
    assert store.dequantized.bytes == 2 * expert_bytes
    none, _ = _store("fp8", budget=0)
    none.expert_weights(0, 1)
    none.expert_weights(0, 1)
    assert len(none.dequantized) == 0 and none.dequantized.misses == 2
    with pytest.raises(ValueError, match="budget must be >= 0"):
        DequantCache(-1)
