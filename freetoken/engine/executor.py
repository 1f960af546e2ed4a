"""The live executor: carries out one Plan of the placement policy for one MoE layer call.

fetch: host -> slot copies (a side CUDA stream where CUDA exists; the GPU first computes the hits, then waits for
the copies and computes the fetched experts, so transfers overlap compute); hits and fetched experts run in
expert_ffn by slot id; `cpu` experts get slot -1 there and run in the CPU lane (torch on the host weights), whose
result is added. The arithmetic is the same whichever lane computes an expert, so the cache never changes the
math beyond floating-point summation order.
"""

from __future__ import annotations

import numpy as np
import torch

from freetoken.engine.counters import CacheCounters
from freetoken.engine.kernelset import KernelSet
from freetoken.engine.slots import ExpertStore, SlotPool
from freetoken.placement import Plan


class LiveExecutor:
    def __init__(self, store: ExpertStore, pool: SlotPool, kernels: KernelSet, device: torch.device,
                 keep_plans: bool = False):
        self.store, self.pool, self.kernels, self.device = store, pool, kernels, torch.device(device)
        self.counters = CacheCounters()
        self.plans: list[Plan] | None = [] if keep_plans else None
        self.cuda = self.device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None

    def run(self, plan: Plan, x: torch.Tensor, weights: torch.Tensor, ids: np.ndarray,
            prefetch_slots: list[int] | None = None) -> torch.Tensor:
        """x [T, D] on the device, weights [T, K] fp32 (device), ids [T, K] host expert ids -> MoE output [T, D].

        prefetch_slots: the slot of each plan.prefetch entry (resident keys the policy placed ahead of use).
        """
        layer, store, pool = plan.layer, self.store, self.pool
        E = store.num_experts
        slot_of = np.full(E, -1, np.int64)  # expert -> slot for this call; -1: CPU lane
        slot_of[plan.hits] = plan.hit_slots
        staging, fetched = pool.capacity, []
        for e, s in zip(plan.fetch, plan.fetch_slots):
            if s < 0:
                if staging >= pool.capacity + pool.staging:
                    raise RuntimeError(f"layer {layer}: {len(plan.fetch)} unkept fetches exceed the "
                                       f"{pool.staging} staging buffers")
                s, staging = staging, staging + 1
            slot_of[e] = s
            fetched.append((e, s))
        copied = self._copy(layer, fetched, plan.prefetch, prefetch_slots or [])
        slots = slot_of[ids]  # [T, K]
        ffn = self.kernels.expert_ffn
        if copied is not None and plan.hits:  # hits first, then the fetched experts once their copies land
            hit_only = np.where(np.isin(ids, plan.hits), slots, -1)
            y = ffn(x, self._slots(hit_only), weights, pool.w_gate_up, pool.w_down)
            torch.cuda.current_stream(self.device).wait_event(copied)
            y = y + ffn(x, self._slots(np.where(np.isin(ids, plan.fetch), slots, -1)), weights, pool.w_gate_up,
                        pool.w_down)
        else:
            if copied is not None:
                torch.cuda.current_stream(self.device).wait_event(copied)
            y = ffn(x, self._slots(slots), weights, pool.w_gate_up, pool.w_down)
        if plan.cpu:
            y = y + self._cpu_lane(layer, plan.cpu, x, weights, ids).to(self.device, y.dtype)
        self._count(plan, ids)
        return y

    def _slots(self, slots: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(slots, np.int32)).to(self.device, non_blocking=True)

    def _copy(self, layer: int, fetched: list[tuple[int, int]], prefetch: list[tuple[int, int]],
              prefetch_slots: list[int]):
        """Issue the copies; on CUDA returns the event the compute stream must wait for (None when nothing moved)."""
        if not fetched and not prefetch:
            return None
        store, pool = self.store, self.pool
        if not self.cuda:
            for e, s in fetched:
                pool.load(s, store, layer, e)
            for (l, e), s in zip(prefetch, prefetch_slots):
                pool.load(s, store, l, e)
            return None
        stream = self.copy_stream
        stream.wait_stream(torch.cuda.current_stream(self.device))  # slots being replaced are no longer read
        with torch.cuda.stream(stream):
            for e, s in fetched:
                pool.load(s, store, layer, e)
            done = torch.cuda.Event()
            done.record(stream)
            for (l, e), s in zip(prefetch, prefetch_slots):  # ahead of need: nothing waits for these now
                pool.load(s, store, l, e)
        return done

    def _cpu_lane(self, layer: int, experts: list[int], x: torch.Tensor, weights: torch.Tensor,
                  ids: np.ndarray) -> torch.Tensor:
        """sum over this call's cpu experts of w[t, k] * down(silu(gate x) * up x), in fp32 on the host."""
        store = self.store
        I = store.intermediate
        xh = x.to("cpu", torch.float32)  # [T, D]
        wh = weights.to("cpu", torch.float32)  # [T, K]
        out = torch.zeros_like(xh)
        for e in experts:
            tok, k = np.nonzero(ids == e)
            tok_t = torch.from_numpy(tok)
            gu = store.gate_up[layer][e].float()  # [2I, D]
            h = xh[tok_t] @ gu.T  # [n, 2I]
            h = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
            y = h @ store.down[layer][e].float().T  # [n, D]
            out.index_add_(0, tok_t, y * wh[tok_t, torch.from_numpy(k)][:, None])
        return out

    def _count(self, plan: Plan, ids: np.ndarray) -> None:
        c = self.counters
        c.calls += 1
        c.hits += len(plan.hits)
        c.fetched += len(plan.fetch)
        c.cpu += len(plan.cpu)
        c.evictions += len(plan.evict)
        c.prefetched += len(plan.prefetch)
        c.cpu_tokens += int(np.isin(ids, plan.cpu).sum()) if plan.cpu else 0
        c.fetched_bytes += (len(plan.fetch) + len(plan.prefetch)) * self.store.expert_bytes
        if self.plans is not None:
            self.plans.append(plan)
