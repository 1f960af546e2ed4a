"""One MoE layer call with the placement decided on the device: no host round trip unless a CPU lane needs one.

    router ids [T, K] (device) -> union of the call's experts [n] (first-use order, -1 padded, n = min(T K, E))
      -> place_call (one program: hit / fetch / cpu, slots, copy list, evictions; state updated in place)
      -> staging rows for fetches the policy does not keep -> expert -> slot map -> slot ids [T, K]
      -> gather_experts per expert tensor (host store -> pool slots, read from the copy list where it lies)
      -> expert_ffn over the hits while the gather runs (side stream on CUDA), then over the fetched experts.

Everything is fixed-shape device work, so a CUDA graph can hold it (engine/decode_graphs.py). A split that can
send misses to the CPU (hybrid, cpu) reads the decision back once per call: the CPU lane needs its experts and x on
the host anyway. Counters (hits, fetches, ...) accumulate in a device tensor, read only when asked for.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch

from freetoken.engine.device_placement import DevicePolicy, _fetch_counts, device_form
from freetoken.engine.executor import LiveExecutor
from freetoken.engine.launch_count import mark_host, wait_event
from freetoken.kernel_launches import KERNEL_LAUNCHES
from freetoken.kernels.expert_gather import gather_pairs
from freetoken.kernels.moe_slots import moe_slots
from freetoken.kernels.moe_union import MAX_PICKS, moe_union
from freetoken.kernels.pair_sums import PairSums
from freetoken.placement import DECODE, PlacementPolicy, Split
from freetoken.placement.call import Plan


def device_reason(policy: PlacementPolicy, staging: int, num_experts: int) -> str | None:
    """None when the engine can decide `policy`'s calls on the device, else why not (one line)."""
    reason = device_form(policy)
    if reason is None and staging < num_experts:
        reason = (f"placement {policy.name} with {staging} staging buffers (< {num_experts} experts) decides on the "
                  f"host (the device path needs a staging row per expert of a call)")
    return reason


def call_union(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, K] int -> (experts [n] int32, tokens [n] int32): the distinct experts in first-use order (as
    placement.callstream.fill_call) with their token counts, -1 / 0 after the last; n = min(T K, E). Per-expert
    tables (first use by a scatter-min, counts by a scatter-add) and an argsort over E: O(M + E) memory, fixed
    shapes, no sync (a capturable prefill chunk of M = 16384 pairs no longer builds two M x M matrices)."""
    flat = ids.reshape(-1).long()  # [M]
    M, E, dev = flat.numel(), num_experts, ids.device
    n = min(M, E)
    first = torch.full((E,), M, dtype=torch.long, device=dev)  # [E] first position, M: unused
    first.scatter_reduce_(0, flat, torch.arange(M, device=dev), "amin")
    count = torch.zeros(E, dtype=torch.int32, device=dev)  # [E] a token routes to an expert once
    count.scatter_add_(0, flat, torch.ones(M, dtype=torch.int32, device=dev))
    order = torch.argsort(first, stable=True)[:n]  # [n] experts by first use, the unused last
    used = first[order] < M  # [n]
    return torch.where(used, order, -1).to(torch.int32), torch.where(used, count[order], 0).to(torch.int32)


@dataclass(slots=True)
class Front:
    """One call's decision as the later parts read it: device tensors of fixed shapes (a graph's static outputs)."""
    x: torch.Tensor  # [T, D]
    weights: torch.Tensor  # [T, K] fp32
    shape: tuple[int, int]  # (T, K)
    experts: torch.Tensor  # [n] the union
    kind: torch.Tensor  # [n] 0 hit, 1 fetched, 2 cpu
    slot: torch.Tensor  # [n]
    copy_expert: torch.Tensor  # the gather's copy list
    copy_slot: torch.Tensor
    evict: torch.Tensor
    counts: torch.Tensor
    slots: torch.Tensor  # [T, K] each pick's slot (-1: the CPU lane)
    hit_slots: torch.Tensor  # [T, K] the hits' only
    fetch_slots: torch.Tensor  # [T, K] the fetched experts' only
    staged: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # host: decision, x, weights (a CPU lane only)


@dataclass(slots=True)
class Back:
    """The FFNs' work before their last launch: a graph's static outputs, as finish() reads them."""
    sums: PairSums  # the (fetched experts' or every pick's) FFN, stopped before its sum over pairs
    hits: torch.Tensor | None  # [T, D] the hits' output, where the pipeline ran them apart


class DeviceMoE:
    """The device decision and the GPU lane of one layer call; the CPU lane is the executor's."""

    def __init__(self, policy: PlacementPolicy, split: Split, executor: LiveExecutor):
        self.executor, self.split = executor, split
        self.store, self.pool, self.device = executor.store, executor.pool, executor.device
        self.placement = DevicePolicy(policy, self.device)
        table = _fetch_counts(split, self.store.num_experts)
        # a split that may leave misses to the CPU: hybrid / cpu (offload fetches every miss)
        self.cpu_lane = bool((table < np.arange(len(table))).any())
        self.totals = torch.zeros((2, 7), dtype=torch.int64, device=self.device)  # = LiveExecutor._totals
        executor.device_totals = self.phase_totals  # the executor's counters add these
        if executor.cuda:
            self._pin_store()

    def reset(self, policy: PlacementPolicy) -> None:
        """A fresh policy's state, written into the same tensors (a captured graph keeps their addresses)."""
        self.placement.load(policy)
        self.totals.zero_()

    def _pin_store(self) -> None:
        """The gather reads the host store from the GPU: it must be pinned (page-locked, device-addressable)."""
        st, pinned = self.store, {}  # a tensor shared by several layers is pinned once

        def pin(ts):
            for t in ts:
                if not t.is_pinned() and id(t) not in pinned:
                    pinned[id(t)] = t.pin_memory()
            return [t if t.is_pinned() else pinned[id(t)] for t in ts]

        if st.packed:
            from dataclasses import replace

            for name in ("gate", "up", "down"):
                setattr(st, name, [replace(w, **{k: v for k, v in zip(w.tensors(), pin(w.tensors().values()))})
                                   for w in getattr(st, name)])
        else:
            st.gate_up, st.down = pin(st.gate_up), pin(st.down)
        if st.b_gate_up is not None:
            st.b_gate_up, st.b_down = pin(st.b_gate_up), pin(st.b_down)

    def __call__(self, layer: int, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                 phase: int, record: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, D], weights [T, K] fp32, ids [T, K] int32, all on the device -> MoE output [T, D]. record [2, T, K]
        fp32 (the trace recorder's slot of this layer) gets the ids and weights. Eagerly, the parts a CUDA graph
        holds one by one (front, back, finish) with the host's part (lane) between them."""
        front = self.front(layer, x, weights, ids, phase, record)
        part = self.lane(layer, front)
        back = self.back(layer, front)
        if self.executor.plans is not None:  # kept for checks: read back (a sync per call, off the counted path)
            E = self.store.num_experts
            self.executor.plans.append(Plan.from_kinds(layer, front.experts.tolist(), front.kind.tolist(),
                                                       front.slot.tolist(), front.evict[:int(front.counts[1])].tolist(),
                                                       num_experts=E))
        return self.finish(back, None if part is None else self.upload_buffer(part))

    def front(self, layer: int, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, phase: int,
              record: torch.Tensor | None = None) -> Front:
        """Device work up to the decision: the union, the placement, the slot maps; with a CPU lane, the decision,
        x and the weights copied to host buffers (asynchronously, pinned on CUDA) for lane() to read."""
        ex, pool, E = self.executor, self.pool, self.store.num_experts
        host = ex.host
        if ids.numel() <= MAX_PICKS:  # decode-sized: the union and the recorder's write in one launch
            experts, tokens = moe_union(ids, E, weights, record)  # [n]
            host.launches += KERNEL_LAUNCHES["moe_union"]
        else:
            experts, tokens = call_union(ids, E)  # [n]
            if record is not None:
                record[0], record[1] = ids, weights
        kind, slot, copy_expert, copy_slot, evict, counts = self.placement.decide(layer, experts, tokens, self.split,
                                                                                  phase)
        host.launches += KERNEL_LAUNCHES["place_call"]
        n = experts.numel()
        readback = torch.empty(2 * n + ids.numel(), dtype=torch.int32, device=self.device) if self.cpu_lane else None
        slots, hit_slots, fetch_slots = moe_slots(ids, experts, kind, slot, copy_expert, copy_slot, counts,
                                                  self.totals, pool.capacity, phase, readback)  # [T, K] each
        host.launches += KERNEL_LAUNCHES["moe_slots"]
        staged = None
        if self.cpu_lane:  # the decision (experts, kind, ids); in decode also x and the weights (a few rows: copied
            # whether or not the lane takes an expert, and waited for with the decision, once)
            staging, T = ex.staging, x.shape[0]
            decision = staging.to_host("decision", readback, torch.int32, T)
            early = phase == DECODE
            staged = (decision, staging.to_host("x", x, self.store.dtype) if early else None,
                      staging.to_host("weights", weights, torch.float32) if early else None)
            host.copies += 3 if early else 1
        return Front(x, weights, tuple(ids.shape), experts, kind, slot, copy_expert, copy_slot, evict, counts, slots,
                     hit_slots, fetch_slots, staged)

    def lane(self, layer: int, front: Front) -> Future | None:
        """The host's part: wait for the staged decision (the call's one sync) and issue the CPU lane on its
        experts; None when no expert is on it (or the split has no CPU lane)."""
        if front.staged is None:
            return None
        ex = self.executor
        wait_event(ex.staging.ready(self.device), counted=True)
        ex.host.syncs += 1
        decision, xh, wh = front.staged
        n = front.experts.numel()
        back = decision.numpy()
        cpu = back[:n][back[n:2 * n] == 2].tolist()
        if not cpu:
            return None
        ids = back[2 * n:].reshape(front.shape).astype(np.int64)
        if xh is None:  # prefill: x and the weights go now (the lane's worker waits for them: a second sync)
            ex.host.syncs += 1
            ex.host.copies += 2
            return ex._cpu_lane_start(layer, cpu, front.x, front.weights, ids)
        return ex._cpu_lane_start(layer, cpu, xh, wh, ids, staged=True)

    def back(self, layer: int, front: Front) -> Back:
        """Device work after the decision: the gather and the expert FFNs over the hits and the fetched experts, up
        to their last launch (the sum over pairs), which finish() makes with the other terms folded in."""
        ex, pool, E = self.executor, self.pool, self.store.num_experts
        fetched = self._gather(layer, front.copy_expert, front.copy_slot, front.counts)
        ffn = ex.kernels.expert_ffn_quant if pool.packed else ex.kernels.expert_ffn
        run = lambda s, **kw: ffn(front.x, s.contiguous(), front.weights, *pool.weights,  # noqa: E731
                                  max_experts=E, **pool.ffn_options, **kw)
        if ex.pipeline:  # the hits while the gather runs, then the fetched experts
            hits = run(front.hit_slots)
            ex._wait([fetched])
            return Back(run(front.fetch_slots, defer=True), hits)
        ex._wait([fetched])
        return Back(run(front.slots, defer=True), None)

    def upload_buffer(self, part: Future) -> torch.Tensor:
        """The CPU lane's [T, D] fp32 sum, joined, in the host buffer finish() uploads from (pinned on CUDA)."""
        self.executor.host.copies += 1
        return self.executor.staging.put("y", mark_host(part.result()))

    def finish(self, back: Back, buf: torch.Tensor | None) -> torch.Tensor:
        """The block's output in the FFN's last launch: its pair sums + the hits' output (pipeline) + the CPU lane's
        sum uploaded from buf (None: no lane work), each add rounded as the eager `a + b` was."""
        terms = [] if back.hits is None else [back.hits]
        if buf is not None:
            terms.append(self.executor.staging.upload(buf, self.device, torch.float32))
        return back.sums.finish(*terms)

    def _gather(self, layer, copy_expert, copy_slot, counts):
        """Copy the fetched experts into their slots: on CUDA on the copy stream after the decision (which follows
        every earlier FFN on the compute stream, so a replaced slot is no longer read); returns its event."""
        ex = self.executor
        pairs = self.pool.tensor_pairs(self.store, layer)
        ex.host.launches += KERNEL_LAUNCHES["gather_experts"] * (-(-len(pairs) // 2))  # two tensors per launch
        if not ex.cuda:
            gather_pairs(pairs, copy_expert, copy_slot, counts)
            return None
        placed = torch.cuda.Event()
        placed.record(torch.cuda.current_stream(self.device))
        stream = ex.copy_stream
        stream.wait_event(placed)
        with torch.cuda.stream(stream):
            gather_pairs(pairs, copy_expert, copy_slot, counts)
            done = torch.cuda.Event()
            done.record(stream)
        if not torch.cuda.is_current_stream_capturing():  # (captured: the join below orders every later reuse)
            for t in (copy_expert, copy_slot, counts):
                t.record_stream(stream)
        return done

    def phase_totals(self) -> np.ndarray:
        """[2, 7] per-phase sums (calls, hits, fetched, cpu, evictions, prefetched, cpu_tokens); syncs."""
        return self.totals.cpu().numpy()
