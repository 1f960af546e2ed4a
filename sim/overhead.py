"""Per-layer fixed costs: kernel launches, host syncs and small copies of every MoE-layer call, per engine.

The byte and FLOP lanes of sim.cost charge what a call moves; this charges what it costs the host to ask for it.
Counts are physical inputs read off each engine's code path (docs/cost_model.md, "Per-layer fixed costs"):

    freetoken    counted from freetoken/engine (model.py, engine.py, executor.py): each kernel-set call launches
                 KERNEL_LAUNCHES[name] Triton kernels; the router's expert ids reach the host once per MoE layer
                 (one sync + one device-to-host copy); each expert_ffn call uploads its slot ids (one copy).
                 tests/engine/test_host_counters.py checks these counts against the live engine's own counters.
                 With the device placement (engine/device_moe.py) a call instead launches the decision program
                 and one expert gather per two expert tensors, and no id read, slot upload or per-expert copy; a split
                 with a CPU lane reads each call's decision back once; the recorder copies once per forward (no sync).
    llama.cpp    ggml ops per layer of its qwen3moe graph that run on the GPU backend (LLAMACPP_GPU_OPS); with
                 -cmoe each MoE layer is two graph splits (GPU -> CPU experts -> GPU), whose round trip is the CPU
                 lane's latency; CUDA graphs per split since ggml PR #18934, not on Pascal (PR #27721).
    ktransformers, vLLM   decode runs as one captured CUDA graph per step (one launch per step).

With CUDA graphs a decode step is one graph launch; prefill is never captured (shapes change per chunk).
Time: launches cost `launch_us` each (hardware: the driver's per-kernel issue rate) plus the engine's own
`dispatch_us` (host work per launch: Python + Triton's JIT dispatch for freetoken, 0 for C++ engines); a charged sync
costs `sync_us` (the stream drains, then a small device-to-host copy). A CPU lane's round trip is charged once, as
its `cpu_lane_latency_us`, and is counted here but not charged again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# one table: the engine counts by it, the cost model charges it
from freetoken.kernel_launches import ATTENTION_LINEARS, DELTANET_LINEARS, KERNEL_LAUNCHES

PREFILL = 0

# llama.cpp: ggml ops per transformer layer on the GPU backend, counted from src/models/qwen3moe.cpp
# (llm_build_qwen3moe) and build_moe_ffn (views and reshapes launch nothing); Qwen3.5's linear-attention layers
# (qwen3next graph) launch more, which this count leaves out:
# attn rms_norm + mul (2), q/k/v mul_mat (3), q/k rms_norm + mul (4), rope x2, KV set_rows x2, flash_attn_ext, wo
# mul_mat, residual add, ffn rms_norm + mul (2), router mul_mat, softmax, argsort, view + get_rows, weight sum + div
# (2), residual add; the expert ops (3 mul_mat_id, glu, weighting) run on the CPU backend under -cmoe.
LLAMACPP_GPU_OPS = 25
# vLLM / KTransformers decode (captured graphs): device kernels per MoE layer, vLLM's fused path (fused add +
# rms_norm x2, qkv, q/k norm + rope, KV cache write, attention, o, router, topk_softmax, moe_align, fused_moe w13
# and w2, silu_and_mul, moe_sum, shared expert gate_up / act / down / gate / mul); an estimate, not counted live
GRAPH_KERNELS_PER_LAYER = 20
# torch glue between freetoken's kernels (freetoken/engine/model.py): before the router the attention residual add
# and the two KV writes; after it the MoE residual add, one add per extra expert_ffn group or CPU lane result, and
# a shared expert's slot / scale tensors and residual add. Counted by hand; the fusions take theirs off
# (LayerShape.fused_prologue: the KV writes, fused_adds: both residual adds), and with them the count equals the
# live engine's own (tests/engine/test_launch_count.py).
GLUE_PRE, GLUE_POST, GLUE_SHARED, GLUE_DENSE_LAYER, GLUE_STEP = 3, 1, 3, 6, 2
# a Gated DeltaNet layer (freetoken/engine/gated_deltanet.py) before the router: sigmoid(b), a.float(), + dt_bias,
# softplus, * -exp(A_log), the residual add (no KV writes); an attention output gate adds sigmoid and the product
GLUE_PRE_LINEAR, GLUE_OUT_GATE = 6, 2
FLAVOURS = ("freetoken", "llamacpp", "graph")


@dataclass(frozen=True, slots=True)
class LayerShape:
    """What changes a freetoken layer's launch count: q/k norms, a shared expert and its sigmoid gate."""

    qk_norm: bool = True
    shared_expert: bool = False
    shared_gate: bool = False
    packed: bool = False  # packed experts run expert_ffn_quant
    tensors_per_expert: int = 2  # host -> slot copies per expert (bf16: gate_up, down; packed: every tensor of
    #                              gate, up, down; + 2 with biases), freetoken/engine/slots.py SlotPool.load
    linear_layers: tuple[int, ...] = ()  # MoE layers whose token mixer is Gated DeltaNet (Qwen3-Next / Qwen3.5)
    out_gate: bool = False  # attention output *= sigmoid(h @ out_gate): one more linear (Qwen3-Next / Qwen3.5)
    fused_prologue: bool = False  # q / k norms, ropes and KV writes as one qk_norm_rope (engine/model.py)
    fused_router: bool = False  # the router's projection + top-k as one router_linear_topk (Engine.route)
    fused_qkv: bool = False  # a decode token's add + input norm + qkv projection as one add_norm_linear (Decoder)
    fused_adds: bool = False  # residual adds inside add_rms_norm / add_norm_linear (Decoder._add_norm): no glue


@dataclass(slots=True)
class HostWork:
    """Per call [N]: host launches before the router's result is needed (attention, router) and after it (experts),
    the device kernels the GPU runs in each part (= launches without CUDA graphs, glue included), syncs that stall
    the host, small copies, the subset of syncs the cost model charges (not the CPU lane's), and `launches`: the
    kernel-set launches the engine's counters see (glue excluded)."""

    pre_launches: np.ndarray
    post_launches: np.ndarray
    pre_kernels: np.ndarray
    post_kernels: np.ndarray
    syncs: np.ndarray
    copies: np.ndarray
    charged_syncs: np.ndarray
    launches: np.ndarray

    def totals(self) -> dict[str, int]:
        return {"launches": int(self.launches.sum()), "syncs": int(self.syncs.sum()),
                "copies": int(self.copies.sum())}


def gather_launches(shape: LayerShape) -> int:
    """The device MoE's expert gathers per call: two expert tensors per launch (kernels/expert_gather.py)."""
    return -(-shape.tensors_per_expert // 2)


def attention_launches(shape: LayerShape, decode: np.ndarray, linear: np.ndarray | None = None) -> np.ndarray:
    """input rms_norm, the fused q/k/v projection, q/k norms, two ropes, attention, (output gate,) o projection,
    post-attention rms_norm; where `linear` [N]: a Gated DeltaNet layer instead: input rms_norm, the fused
    qkv / z / b / a input projection, the causal conv, the gated delta rule, the gated rms_norm, the out linear,
    post-attention rms_norm."""
    k = KERNEL_LAUNCHES
    prologue = k["qk_norm_rope"] if shape.fused_prologue else 2 * k["apply_rope"] + (
        2 * k["rms_norm"] if shape.qk_norm else 0)
    base = 2 * k["rms_norm"] + (ATTENTION_LINEARS + shape.out_gate) * k["linear"] + prologue
    fused = k["rms_norm"] + k["linear"] - k["add_norm_linear"] if shape.fused_qkv else 0  # decode only
    attn = base + np.where(decode, k["attention_decode"] - fused, k["attention_prefill"])
    if linear is None or not linear.any():
        return attn
    delta = 2 * k["rms_norm"] + DELTANET_LINEARS * k["linear"] + k["rms_norm_gated"] + np.where(
        decode, k["causal_conv1d_update"] + k["gated_delta_step"], k["causal_conv1d"] + k["gated_delta_chunk"])
    return np.where(linear, delta, attn)


def ffn_calls(log, pipeline: bool) -> np.ndarray:
    """expert_ffn calls of each MoE call (freetoken/engine/executor.py run): one, or with the CUDA pipeline one for
    the hits and one per fetched group (two halves in prefill when at least two experts are fetched)."""
    if not pipeline:
        return np.ones(len(log), np.int64)
    fetched = log.fetched
    groups = np.where((log.phase == PREFILL) & (fetched >= 2), 2, np.minimum(fetched, 1))
    return np.where(fetched > 0, (log.hits > 0) + groups, 1)


def freetoken_work(log, num_layers: int, shape: LayerShape, *, pipeline: bool, cuda_graphs: bool,
                   record: bool = False, device_placement: bool = False, cpu_split: bool = False,
                   moe_graphs: bool = False, streamed: np.ndarray | None = None) -> HostWork:
    """The live engine's host work per MoE call. Each step's call of MoE layer 0 also carries the step's dense
    layers (attention + one expert_ffn each), the final norm and lm_head. Per-step host work outside the layers
    (the sampler's read of the logits, one sync per token) is neither counted nor charged.
    cuda_graphs: decode steps replayed as one captured graph (DESIGN.md: the device-side decision), so a decode
    call launches nothing on its own and does not sync; layer 0 carries the step's one graph launch.
    device_placement: the decision on the device (hits and fetched experts in two expert_ffn calls with the
    pipeline, whatever the misses; the second group's and the CPU lane's adds inside the last FFN's sum over pairs);
    cpu_split: its split may leave misses to the CPU (hybrid, cpu).
    moe_graphs: with the device placement, each decode call's MoE block (router, top-k, decision, gathers, expert
    FFNs) is one graph launch (engine/decode_graphs.py), or with a CPU lane three (front, back and finish around
    the host's wait); attention, a shared expert and the step's head stay eager; the recorder's one copy per forward
    and the lane's syncs and copies stay.
    streamed [N]: the prefill double buffer (ReplayResult.streamed): the experts streamed into each call's staging
    set while the call before it ran, -1 where the call copies its own fetches. A streamed call copies those (every
    non-resident expert of its layer, used or not) instead of its fetches, and runs one expert_ffn call."""
    k = KERNEL_LAUNCHES
    N = len(log)
    decode = log.phase != PREFILL
    first = log.layer == 0
    calls = np.full(N, 2 if pipeline else 1, np.int64) if device_placement else ffn_calls(log, pipeline)
    if streamed is not None:  # the executor's streamed path: one group, already in staging
        calls = np.where(streamed >= 0, 1, calls)
    ffn = k["expert_ffn_quant"] if shape.packed else k["expert_ffn"]
    shared = (k["expert_ffn"] + (k["linear"] if shape.shared_gate else 0)) if shape.shared_expert else 0
    linear = np.isin(log.layer, shape.linear_layers)
    attn = attention_launches(shape, decode, linear)
    moe_layers = int(log.layer.max()) + 1 if N else 1
    dense_layers = num_layers - moe_layers
    dense_attn = attention_launches(shape, decode)  # dense layers counted as full-attention ones
    step = first * (dense_layers * (dense_attn + k["expert_ffn"]) + k["rms_norm"] + k["linear"])  # norm, lm_head
    router = k["router_linear_topk"] if shape.fused_router else k["linear"] + k["router_topk"]
    pre = attn + router  # + the router's linear and top-k
    post = calls * ffn + shared + step
    if device_placement:  # the decision program, the slot ids, one gather per two expert tensors
        # (+ the union, as a kernel for calls of up to moe_union.MAX_PICKS picks: every call at the chunks modelled)
        post = post + k["moe_union"] + k["place_call"] + k["moe_slots"] + k["gather_experts"] * gather_launches(shape)
    cpu = (log.cpu > 0).astype(np.int64)
    launches = pre + post
    adds = int(shape.fused_adds)  # each residual add fused into the norm after it
    # the adds of a second FFN group and of the CPU lane's sum; the device placement folds both into the last
    # FFN's sum over pairs (kernels/pair_sums.py)
    group_adds = 0 if device_placement else (calls - 1) + cpu
    glue_post = GLUE_POST - adds + group_adds + (GLUE_SHARED if shape.shared_expert else 0) + first * (
        dense_layers * GLUE_DENSE_LAYER + GLUE_STEP)
    glue_pre = np.where(linear, GLUE_PRE_LINEAR, GLUE_PRE - 2 * shape.fused_prologue + GLUE_OUT_GATE * shape.out_gate)
    glue_pre = glue_pre - adds
    pre, post = pre + glue_pre, post + glue_post
    pre_kernels, post_kernels = pre, post
    experts = shape.tensors_per_expert * (copied_experts(log, streamed) + log.prefetched)
    syncs = 1 + record + cpu  # router ids, recorded gates, the CPU lane's activations
    copies = 1 + record + calls + 2 * cpu + experts  # ids (+ gates) down, slot ids up, CPU lane down and up
    charged = np.full(N, 1 + record)
    if device_placement:  # the decision read back where a CPU lane may need it; the recorder's one copy per
        # forward is read once the next token's read has waited for it: a copy, no sync. A decode call copies x and
        # the routing weights down with the decision (one wait for the three); a prefill call copies them after the
        # wait, only for a CPU lane with work (its worker waits again). The lane's result goes up.
        read, per_forward = int(cpu_split), record * first
        syncs = np.where(decode, read, read + cpu)
        copies = np.where(decode, 3 * read + cpu, read + 3 * cpu) + per_forward
        charged = np.full(N, read)
    if moe_graphs:
        if not device_placement or cuda_graphs:
            raise ValueError("moe_graphs: the device placement's per-layer graphs, without step graphs")
        held = (router + calls * ffn + k["moe_union"] + k["place_call"] + k["moe_slots"]
                + k["gather_experts"] * gather_launches(shape))  # what one MoE block graph holds
        graphs = 1 + 2 * int(cpu_split)  # one block graph, or front, back and finish around the CPU lane
        launches = np.where(decode, launches - held + graphs, launches)
        pre = np.where(decode, attn + glue_pre, pre)  # attention and its glue stay eager
        post = np.where(decode, graphs + shared + step + glue_post, post)
    if cuda_graphs:  # expert copies stay (graph nodes); the CPU lane keeps its round trip
        pre, post = np.where(decode, 0, pre), np.where(decode, first, post)
        launches = np.where(decode, first, launches)
        syncs, charged = np.where(decode, cpu, syncs), np.where(decode, 0, charged)
        copies = np.where(decode, experts + 2 * cpu, copies)
    return HostWork(_i(pre), _i(post), _i(pre_kernels), _i(post_kernels), _i(syncs), _i(copies), _i(charged),
                    _i(launches))


def copied_experts(log, streamed: np.ndarray | None) -> np.ndarray:
    """[N] experts a call copies in for its own use: its fetches, or on a streamed call what the prefill double
    buffer streamed into it (ReplayResult.streamed; -1 where nothing streamed). Prefetches come on top."""
    return log.fetched if streamed is None else np.where(streamed >= 0, streamed, log.fetched)


def llamacpp_work(log, *, cuda_graphs: bool) -> HostWork:
    """Per layer LLAMACPP_GPU_OPS kernels (one graph launch per split with graphs, in decode); a MoE layer whose
    experts run on the CPU is two splits: activations down and back (syncs and copies of the CPU lane)."""
    decode = log.phase != PREFILL
    cpu = (log.cpu > 0).astype(np.int64)
    ops = np.where(decode & cuda_graphs, 1, LLAMACPP_GPU_OPS)
    zero, kernels = np.zeros(len(log)), np.full(len(log), LLAMACPP_GPU_OPS)
    return HostWork(_i(ops), _i(zero), _i(kernels), _i(zero), _i(2 * cpu), _i(2 * cpu), _i(zero), _i(ops))


def graph_work(log) -> HostWork:
    """A fully captured decode step (vLLM, KTransformers): one launch per step (on layer 0's call); a CPU expert
    call's round trip (KTransformers: a host function in the graph) is the CPU lane's. Eager prefill's launches
    are not counted: at 2048+ tokens per chunk they are microseconds against milliseconds."""
    first = (log.layer == 0).astype(np.int64)
    cpu = (log.cpu > 0).astype(np.int64)
    decode = log.phase != PREFILL
    zero, kernels = np.zeros(len(log)), np.where(decode, GRAPH_KERNELS_PER_LAYER, 0)
    return HostWork(_i(first * decode), _i(zero), _i(kernels), _i(zero), _i(cpu), _i(2 * cpu), _i(zero),
                    _i(first * decode))


def host_work(flavour: str, log, num_layers: int, shape: LayerShape, *, cuda_graphs: bool,
              pipeline: bool = True, record: bool = False, streamed: np.ndarray | None = None) -> HostWork:
    """streamed: freetoken's prefill double buffer (ReplayResult.streamed), where the engine has it on."""
    if streamed is not None and flavour != "freetoken":
        raise ValueError(f"streamed prefill copies are freetoken's double buffer, not {flavour}'s")
    if flavour == "freetoken":
        return freetoken_work(log, num_layers, shape, pipeline=pipeline, cuda_graphs=cuda_graphs, record=record,
                              streamed=streamed)
    if flavour == "llamacpp":
        return llamacpp_work(log, cuda_graphs=cuda_graphs)
    if flavour == "graph":
        return graph_work(log)
    raise ValueError(f"host-work flavour {flavour!r} is not one of {', '.join(FLAVOURS)}")


def _i(a) -> np.ndarray:
    return np.asarray(a, np.int64)
