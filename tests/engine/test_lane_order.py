"""Lanes overlap: the executor issues the CPU lane before the GPU lane's copies and waits, and the result is the
same MoE output whichever way the CPU lane runs (inline or on its worker thread) as a brute-force torch sum."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.engine.executor import LiveExecutor
from freetoken.engine.kernelset import kernel_set
from freetoken.engine.slots import ExpertStore, SlotPool
from freetoken.placement import DECODE, PREFILL, Plan

E, D, I = 4, 16, 8


class RecordingExecutor(LiveExecutor):
    """Logs the order in which the lanes are issued and waited on (fake streams: the CPU machine's no-op events)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log: list[str] = []

    def _cpu_lane_start(self, *args):
        self.log.append("cpu issued")
        return super()._cpu_lane_start(*args)

    def _copy(self, *args):
        self.log.append("copies issued")
        return super()._copy(*args)

    def _wait(self, events):
        self.log.append("gpu waits")
        return super()._wait(events)


def _store(seed: int = 0) -> ExpertStore:
    g = torch.Generator().manual_seed(seed)
    return ExpertStore([(torch.randn(E, 2 * I, D, generator=g) / 4, torch.randn(E, D, I, generator=g) / 4)])


def moe_reference(store: ExpertStore, x, weights, ids, layer: int = 0) -> torch.Tensor:
    """sum_k w[t, k] * down(silu(gate x) * up x) for each token, expert by expert (`layer`'s experts)."""
    inter = store.down[layer].shape[-1]
    out = torch.zeros(x.shape)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            gu, dn = store.gate_up[layer][ids[t, k]], store.down[layer][ids[t, k]]
            h = x[t] @ gu.T
            out[t] += weights[t, k] * (dn @ (torch.nn.functional.silu(h[:inter]) * h[inter:]))
    return out


@pytest.mark.parametrize("overlap, pipeline, phase", [(False, True, DECODE), (True, True, PREFILL),
                                                       (True, False, DECODE)])
def test_cpu_lane_issued_before_gpu_waits(overlap, pipeline, phase):
    store = _store()
    ex = RecordingExecutor(store, SlotPool(2, 2, store, "cpu"), kernel_set("reference"), torch.device("cpu"),
                           pipeline=pipeline, overlap=overlap)
    ids = np.array([[0, 1, 2], [3, 1, 0]])  # [T, K]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, D, generator=g)
    weights = torch.rand(2, 3, generator=g)
    plan = Plan(0, hits=[], hit_slots=[], fetch=[0, 1], fetch_slots=[0, 1], cpu=[2, 3])
    y = ex.run(plan, x, weights, ids, phase)
    assert ex.log[0] == "cpu issued" and "gpu waits" in ex.log and ex.log.count("cpu issued") == 1
    assert ex.log.index("cpu issued") < ex.log.index("copies issued") < ex.log.index("gpu waits")
    torch.testing.assert_close(y, moe_reference(store, x, weights, ids), rtol=1e-5, atol=1e-5)
    assert (ex._cpu_worker is not None) == overlap


def test_no_cpu_experts_no_cpu_lane():
    store = _store()
    ex = RecordingExecutor(store, SlotPool(4, 0, store, "cpu"), kernel_set("reference"), torch.device("cpu"))
    ids = np.array([[0, 1]])
    x, weights = torch.randn(1, D), torch.rand(1, 2)
    ex.run(Plan(0, [], [], [0, 1], [0, 1], []), x, weights, ids, DECODE)
    assert "cpu issued" not in ex.log


def test_host_threads_are_physical_cores_and_shared_with_torch():
    import psutil

    from freetoken.engine.runtime import set_host_threads
    from freetoken.host import kernels as hk
    from freetoken.host.kernels import physical_cores

    assert physical_cores() == psutil.cpu_count(logical=False)
    two_sockets_smt = "".join(f"processor\t: {i}\nphysical id\t: {i // 4}\ncore id\t: {i % 2}\n\n" for i in range(8))
    assert physical_cores(two_sockets_smt) == 4  # 8 logical CPUs, 2 packages x 2 cores x 2 threads
    before = torch.get_num_threads()
    try:
        assert set_host_threads(1) == 1 and torch.get_num_threads() == 1 and hk.threads() == 1
        torch.set_num_threads(physical_cores())  # torch's default: the physical cores
        assert set_host_threads(None) == physical_cores() == hk.threads() == torch.get_num_threads()
        for bad in (0, -2, 1.5, True):
            with pytest.raises(ValueError, match="threads must be a positive integer"):
                set_host_threads(bad)
    finally:
        torch.set_num_threads(before)
        hk.set_threads(None)
