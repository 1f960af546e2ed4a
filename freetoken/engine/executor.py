"""The live executor: carries out one Plan of the placement policy for one MoE layer call.

Lanes overlap: the CPU lane is issued first, as soon as the Plan (the router's picks) is known: x goes to the host
before any expert FFN is queued and the host experts run on a worker thread (`overlap`, default on CUDA) while the
main thread queues the copies and the GPU lane and waits on them; the CPU result is joined and added last.

On a CPU-only machine with the host kernels (`host_only`) every expert of the call - hit, fetched or cpu - is computed
from the host store in one call (ExpertStore.host_moe): the policy still decides and is counted (sim = live), but
nothing is copied (the pool aliases the store).

fetch: host -> slot copies (a side CUDA stream where CUDA exists; the GPU first computes the hits, then waits for
the copies and computes the fetched experts, so transfers overlap compute; in prefill the fetches go in two
halves, double-buffered: the first half computes while the second copies); hits and fetched experts run in
expert_ffn by slot id (expert_ffn_quant for a packed pool); `cpu` experts get slot -1 there and run in the CPU lane (torch on the host weights), whose
result is added (one call into the host kernels over the layer's cpu experts, weights read as stored). The arithmetic is the same whichever lane computes an expert, so the cache never changes the
math beyond floating-point summation order.

Prefill double buffer (`stream_prefill`, needs staging >= 2 E; on by default on CUDA then): with an offload split
that keeps prefill fetches out of the cache, layer l+1's non-resident experts are copied into staging row set
(l+1) % 2 (row capacity + set E + expert) as soon as layer l's FFNs are queued, so they move while layer l computes
(they wait only for layer l-1's FFNs, the last readers of that set); layer l+1's staged fetches then copy nothing
and wait for that stream. It moves every non-resident expert of the layer (what a long prefill chunk touches).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from freetoken.engine.host_counters import HostCounters
from freetoken.engine.kernelset import KernelSet
from freetoken.engine.launch_count import host_side, mark_host
from freetoken.engine.lane_staging import LaneStaging
from freetoken.engine.slots import ExpertStore, SlotPool
from freetoken.kernels.expert_ffn import glu_ref
from freetoken.placement import DECODE, PREFILL, Plan
from freetoken.placement.counts import Counts, count


class LiveExecutor:
    def __init__(self, store: ExpertStore, pool: SlotPool, kernels: KernelSet, device: torch.device,
                 keep_plans: bool = False, pipeline: bool | None = None, host: HostCounters | None = None,
                 overlap: bool | None = None, stream_prefill: bool | None = None):
        self.store, self.pool, self.kernels, self.device = store, pool, kernels, torch.device(device)
        self.host_only = pool.alias  # a CPU-only engine: every expert from the store, in one host call
        self.host = host if host is not None else HostCounters()
        self.reset_counts()
        self.plans: list[Plan] | None = [] if keep_plans else None
        self.cuda = self.device.type == "cuda"
        self.staging = LaneStaging(pin=self.cuda)  # the CPU lane's activations, pinned on CUDA
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        # compute hits, then fetched groups as their copies land (default on CUDA; on CPU the same arithmetic,
        # in the same groups, with copies done up front: what tests check the grouping with)
        self.pipeline = self.cuda if pipeline is None else pipeline
        # the CPU lane on a worker thread, concurrent with the copies and the GPU lane (on a CPU-only engine both
        # lanes share the cores, so by default it runs inline, still issued first)
        self.overlap = self.cuda if overlap is None else overlap
        self._cpu_worker = None
        if self.overlap:  # the host kernels' threads run the lane (freetoken.host.kernels.set_threads)
            self._cpu_worker = ThreadPoolExecutor(1, thread_name_prefix="cpu-lane")
        # the prefill double buffer: two staging sets of one layer's experts each
        self.stream_prefill = (self.cuda if stream_prefill is None else stream_prefill) and (
            pool.staging >= 2 * store.num_experts)
        self._streamed: tuple[int, object, set[int]] | None = None  # (layer, event, experts) already in staging
        self._reads_before = None  # the previous call's _reads_done: the last readers of the other staging set
        self.device_totals = None  # the device decision's per-phase counts (DeviceMoE.phase_totals), if any
        self._reads_done = None  # CUDA event after the last expert FFN queued: what a slot's new copy must follow

    def run(self, plan: Plan, x: torch.Tensor, weights: torch.Tensor, ids: np.ndarray, phase: int,
            prefetch_slots: list[int] | None = None, stream_next: list[int] | None = None) -> torch.Tensor:
        """x [T, D] on the device, weights [T, K] fp32 (device), ids [T, K] host expert ids -> MoE output [T, D].

        prefetch_slots: the slot of each plan.prefetch entry (resident keys the policy placed ahead of use).
        stream_next: in prefill with the double buffer, layer l+1's non-resident experts, streamed into staging
        once this call's FFNs are queued.
        """
        if self.host_only:
            return self._run_host(plan, x, weights, ids, phase)
        layer, store, pool = plan.layer, self.store, self.pool
        E = store.num_experts
        streamed, self._streamed = self._streamed, None
        if streamed is not None and streamed[0] != layer:
            streamed = None
        double = self.stream_prefill and phase == PREFILL
        slot_of = np.full(E, -1, np.int64)  # expert -> slot for this call; -1: CPU lane
        slot_of[plan.hits] = plan.hit_slots
        staging, fetched, ready_already = pool.capacity, [], False
        for e, s in zip(plan.fetch, plan.fetch_slots):
            if s < 0 and double:  # the layer's staging set, one row per expert
                s = pool.capacity + (layer % 2) * E + e
                if streamed is not None and e in streamed[2]:
                    slot_of[e] = s
                    ready_already = True
                    continue
            elif s < 0:
                if staging >= pool.capacity + pool.staging:
                    raise ValueError(f"layer {layer}: {len(plan.fetch)} unkept fetches exceed the "
                                     f"{pool.staging} staging buffers (raise the cache's staging)")
                s, staging = staging, staging + 1
            slot_of[e] = s
            fetched.append((e, s))
        slots = slot_of[ids]  # [T, K]
        cpu_part = self._cpu_lane_start(layer, plan.cpu, x, weights, ids) if plan.cpu else None
        ffn = self.kernels.expert_ffn_quant if pool.packed else self.kernels.expert_ffn
        if ready_already or not self.pipeline or not fetched:  # one group (streamed: also the previous layer's event)
            ready, events = self._copy(layer, [fetched], plan.prefetch, prefetch_slots or [])
            self._wait([ready, *events, streamed[1] if ready_already else None])
            y = ffn(x, self._slots(slots), weights, *pool.weights, max_experts=E, **pool.ffn_options)
        else:  # hits while the copies run; then each fetched group as soon as its copies land
            halves = 2 if phase == PREFILL and len(fetched) >= 2 else 1  # prefill: double-buffered fetches
            cut = -(-len(fetched) // halves)
            groups = [fetched[i:i + cut] for i in range(0, len(fetched), cut)]
            ready, events = self._copy(layer, groups, plan.prefetch, prefetch_slots or [])
            y = None
            for experts, event in [(plan.hits, ready)] + [([e for e, _ in g], ev) for g, ev in zip(groups, events)]:
                if not experts:
                    continue
                self._wait([event])
                part = ffn(x, self._slots(np.where(np.isin(ids, experts), slots, -1)), weights, *pool.weights,
                           max_experts=E, **pool.ffn_options)
                y = part if y is None else y + part
        self._reads_before = self._reads_done
        if self.cuda:
            self._reads_done = torch.cuda.Event()
            self._reads_done.record(torch.cuda.current_stream(self.device))
        if double and stream_next:
            self._streamed = (layer + 1, self._stream(layer + 1, stream_next), set(stream_next))
        if cpu_part is not None:
            y = y + self._cpu_lane_result(cpu_part, y.dtype)
            self.host.syncs += 1  # the activations reach the host
            self.host.copies += 2  # ... and the lane's result goes back
        self.tally(plan, ids, phase)
        return y

    def _run_host(self, plan: Plan, x: torch.Tensor, weights: torch.Tensor, ids: np.ndarray,
                  phase: int) -> torch.Tensor:
        """Every expert the call routes to, from the host store in one call: where a CPU-only engine's lanes all
        meet (the split only changes what is counted)."""
        y = self.store.host_moe(plan.layer, x, ids, weights, None, cast=True)
        self.tally(plan, ids, phase)
        return y

    def tally(self, plan: Plan, ids: np.ndarray, phase: int) -> None:
        self._add(phase, (1, len(plan.hits), len(plan.fetch), len(plan.cpu), len(plan.evict), len(plan.prefetch),
                          routed_to(ids, plan.cpu) if plan.cpu else 0))
        if self.plans is not None:
            self.plans.append(plan)

    def tally_log(self, log: np.ndarray, phase: int) -> None:
        """tally() for the calls of a compiled replay's log [8+, C] (hits, fetched, cpu, evictions, prefetched, hit,
        fetch and cpu tokens per call)."""
        sums = log[:8].sum(axis=1).tolist()
        self._add(phase, (log.shape[1], sums[0], sums[1], sums[2], sums[3], sums[4], sums[7]))

    def _add(self, phase: int, counts: tuple) -> None:
        """counts (calls, hits, fetched, cpu, evictions, prefetched, cpu tokens) into the phase's totals."""
        self._totals[phase] = [total + n for total, n in zip(self._totals[phase], counts)]

    def _slots(self, slots: np.ndarray) -> torch.Tensor:
        """Slot ids up to the device: from pinned memory on CUDA (a truly asynchronous copy; torch's caching host
        allocator keeps the buffer until the copy is done), not from pageable memory (which may synchronise)."""
        self.host.copies += 1
        ids = torch.from_numpy(np.ascontiguousarray(slots, np.int32))
        return (ids.pin_memory() if self.cuda else ids).to(self.device, non_blocking=True)

    def _copy(self, layer: int, groups: list[list[tuple[int, int]]], prefetch: list[tuple[int, int]],
              prefetch_slots: list[int]) -> tuple:
        """Issue the copies, group by group. On CUDA returns (ready, [one event per group]) for the compute stream
        to wait on; `ready` marks the copies queued before this call (earlier prefetches a hit may read).
        On CPU the copies are done on return and every event is None."""
        store, pool = self.store, self.pool
        self.host.copies += pool.tensors_per_expert * (sum(map(len, groups)) + len(prefetch))
        if not self.cuda:
            for group in groups:
                for e, s in group:
                    pool.load(s, store, layer, e)
            for (l, e), s in zip(prefetch, prefetch_slots):
                pool.load(s, store, l, e)
            return None, [None] * len(groups)
        stream = self.copy_stream
        if self._reads_done is not None:  # slots being replaced are no longer read: only the FFNs read slots
            stream.wait_event(self._reads_done)
        events = []
        with torch.cuda.stream(stream):
            ready = torch.cuda.Event()
            ready.record(stream)
            for group in groups:
                for e, s in group:
                    pool.load(s, store, layer, e)
                done = torch.cuda.Event()
                done.record(stream)
                events.append(done)
            for (l, e), s in zip(prefetch, prefetch_slots):  # ahead of need: nothing waits for these now
                pool.load(s, store, l, e)
        return ready, events

    def _stream(self, layer: int, experts: list[int]):
        """Copy `layer`'s experts into its staging set (the double buffer); on CUDA on the copy stream after the
        previous call's FFNs (the set's last readers), returning the event that marks them landed."""
        store, pool = self.store, self.pool
        base = pool.capacity + (layer % 2) * store.num_experts
        self.host.copies += pool.tensors_per_expert * len(experts)
        if not self.cuda:
            for e in experts:
                pool.load(base + e, store, layer, e)
            return None
        stream = self.copy_stream
        if self._reads_before is not None:
            stream.wait_event(self._reads_before)
        with torch.cuda.stream(stream):
            for e in experts:
                pool.load(base + e, store, layer, e)
            done = torch.cuda.Event()
            done.record(stream)
        return done

    def _wait(self, events: list) -> None:
        for event in events:
            if event is not None:
                torch.cuda.current_stream(self.device).wait_event(event)

    def _cpu_lane_start(self, layer: int, experts: list[int], x: torch.Tensor, weights: torch.Tensor,
                        ids: np.ndarray, staged: bool = False) -> Future:
        """Issue the CPU lane: x and the routing weights to the host now (they wait only for the router, as no FFN
        is queued yet; staged: they are there already), the experts on the worker thread (or inline); .result() is
        the [T, D] fp32 sum."""
        xh, wh, ready = x, weights, None
        if not staged:
            xh = self.staging.to_host("x", x, self.store.dtype)  # [T, D]
            wh = self.staging.to_host("weights", weights, torch.float32)  # [T, K]
            ready = self.staging.ready(self.device)
        if self._cpu_worker is not None:
            return self._cpu_worker.submit(self._cpu_lane, layer, experts, xh, wh, ids, ready)
        done: Future = Future()
        with host_side():
            done.set_result(self._cpu_lane(layer, experts, xh, wh, ids, ready))
        return done

    def _cpu_lane_result(self, part: Future, dtype: torch.dtype) -> torch.Tensor:
        """The lane's [T, D] sum on the device, in dtype (uploaded from pinned memory on CUDA)."""
        return self.staging.to_device("y", mark_host(part.result()), self.device, dtype)

    def _cpu_lane(self, layer: int, experts: list[int], xh: torch.Tensor, wh: torch.Tensor,
                  ids: np.ndarray, ready=None) -> torch.Tensor:
        """sum over this call's cpu experts of w[t, k] * down(glu(gate x, up x)) on the host: one call into the host
        kernels over the layer's cpu experts for all tokens, packed weights read as stored -> fp32 [T, D].
        ready: the event after xh / wh's asynchronous copies (None: they are on the host already)."""
        if ready is not None:
            ready.synchronize()
        take = np.zeros(self.store.num_experts, np.uint8)
        take[experts] = 1
        return self.store.host_moe(layer, xh, ids, wh, take)

    # counts: running sums per phase (a server's memory does not grow with its calls), summed by
    # placement.counts.count as the simulator's replay log is
    def reset_counts(self) -> None:
        # [phase][calls, hits, fetched, cpu, evictions, prefetched, cpu_tokens]: Python ints (a decode call adds to
        # them in a fraction of a numpy row update's time)
        self._totals = [[0] * 7, [0] * 7]

    def _count(self, phase: int | None) -> Counts:
        totals = np.array(self._totals, np.int64)
        if self.device_totals is not None:
            totals += self.device_totals()
        log = _CallColumns(*totals[:, 1:].T)  # each column: [2] per-phase sums
        counts = count(log, None if phase is None else np.arange(2) == phase, self.store.expert_bytes)
        counts.calls = int(totals[:, 0].sum() if phase is None else totals[phase, 0])
        return counts

    @property
    def counters(self) -> Counts:
        return self._count(None)

    @property
    def phase_counters(self) -> tuple[Counts, Counts]:
        return self._count(PREFILL), self._count(DECODE)


SMALL_CALL = 64  # ids up to this many: counted in Python (a decode call's top-k), else by numpy


def routed_to(ids: np.ndarray, experts: list[int]) -> int:
    """How many entries of ids are one of `experts`: np.isin(ids, experts).sum(), in Python for a few ids (numpy's
    isin costs tens of microseconds, most of a decode call's bookkeeping)."""
    if ids.size > SMALL_CALL:
        return int(np.isin(ids, experts).sum())
    chosen = set(experts)
    return len([e for e in ids.ravel().tolist() if e in chosen])


@dataclass(slots=True)
class _CallColumns:
    hits: np.ndarray
    fetched: np.ndarray
    cpu: np.ndarray
    evictions: np.ndarray
    prefetched: np.ndarray
    cpu_tokens: np.ndarray
