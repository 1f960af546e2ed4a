"""The cost model: seconds for every MoE-layer call of a replay, from physical inputs only.

Per call (one layer of one prefill chunk or one decode token), with S = bytes per expert, P = params per expert:
    dense   attention + dense weights + KV reads of the layer (+ a hybrid model's linear-attention states, read and
            written once per call): max(bytes / HBM, GEMM FLOPs / GPU rate + attention FLOPs / attention rate),
            a hybrid model's Gated DeltaNet FLOPs (ModelCard.linear_flops_per_token) counted with attention's
    hits    resident experts: roofline(hits * S / HBM, 2 P hit_tokens / GPU rate)
    pcie    (fetched + prefetched) * S over BP, plus the fetch lane's fixed latency (the routing ids reach the host
            and the first copy is enqueued: BP is a pipelined rate and holds no per-call sync); beside GPU compute
            when `overlap`, and in prefill loaded during the previous call when `double_buffer` (two staging
            buffers: layer l+1 streams in while layer l computes); `decode_overlap` False: a decode call's copies
            are a kernel on the compute stream (FreeToken 0.1.2's gather), between the router and every expert GEMM;
            `decode_gather_gb_s` > 0: a decode call's copies run at that rate (an SM kernel reading pinned host
            memory, not the copy engine whose rate BP is), never above BP; prefill's copies stay at BP;
            `prefill_copies="layer"`: a prefill call copies every expert of its layer (FreeToken 0.1.2)
    fetched computed on the GPU once their copy has landed: roofline(fetched * S / HBM, 2 P fetch_tokens / rate)
    cpu     roofline(cpu * S / BH, 2 P cpu_tokens / CPU rate) + the CPU lane's fixed latency
The call ends when its slowest lane does. PCIe and CPU read the same host DRAM: `host="shared"` runs the two
flows through sim.lanes.share (DRAM bandwidth split between them), `host="independent"` lets each run at its cap.
GPU rates are achieved ones: datasheet x the hardware's gemm_efficiency (FLOPs) and gemv_efficiency (bytes); the
experts' grouped GEMMs (hits, fetched) run at datasheet x moe_gemm_efficiency, attention's FLOPs at the 16-bit
datasheet rate x attention_efficiency (each falls back to gemm_efficiency where a profile does not give it).
Host work (sim.overhead.HostWork, optional): the launches before the router bound the dense part from below, the
host syncs it charges follow it (the routing ids reach the host), the launches after bound the GPU lanes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from freetoken.sim.hardware import HardwareProfile
from freetoken.sim.lanes import HOST_MODES, roofline, share
from freetoken.sim.model_card import ModelCard
from freetoken.sim.overhead import HostWork, copied_experts
from freetoken.sim.replay import ReplayLog

PREFILL = 0
# what a prefill call copies over PCIe (CostOptions.prefill_copies; sim.engines says whose engine does which):
# missing: its layer's experts not resident; layer: every expert of its layer, resident ones too
PREFILL_COPIES = ("missing", "layer")
# Attention's QK^T and PV run on 16-bit inputs in every engine modelled, whatever the weights' GEMM path: FreeToken's
# Triton attention and vLLM's FlashInfer in bf16; llama.cpp's flash attention (ggml-cuda fattn.cu) in its f16 mma
# kernels (Turing and later) or wmma (Volta), and on GPUs without tensor cores (Pascal) in its tile / vec kernels at
# the FP32 rate (GP104's FP16 runs at 1/64). So never at an int8 rate: the hardware's 16-bit tensor rate, which a
# Pascal profile gives as its FP32 rate (gpu_bf16_tflops: "GEMMs run at the FP32 rate").
ATTENTION_DTYPE = "bf16"


@dataclass(frozen=True, slots=True)
class CostOptions:
    host: str = "shared"  # independent | shared (PCIe DMA and the CPU lane draw from one DRAM)
    overlap: bool = True  # copies run on a second stream beside compute; False: copy, then compute
    decode_overlap: bool = True  # False: decode's copies run on the compute stream (FreeToken 0.1.2's gather kernel)
    double_buffer: bool = True  # prefill: the next call's experts load while this call computes
    dispatch_us: float = 0.0  # the engine's host work per launch on top of the hardware's launch_us
    decode_gather_gb_s: float = 0.0  # > 0: decode's copies at this rate (an SM gather kernel), capped by BP
    prefill_copies: str = "missing"  # layer: a prefill call copies every expert of its layer (sim.engines)

    def __post_init__(self) -> None:
        if self.host not in HOST_MODES:
            raise ValueError(f"host {self.host!r} is not one of {', '.join(HOST_MODES)}")
        if not self.decode_gather_gb_s >= 0:
            raise ValueError(f"decode_gather_gb_s must be >= 0, got {self.decode_gather_gb_s}")
        if self.double_buffer and not self.overlap:
            raise ValueError("double_buffer needs overlap (a copy stream beside compute)")
        if self.prefill_copies not in PREFILL_COPIES:
            raise ValueError(f"prefill_copies {self.prefill_copies!r} is not one of {', '.join(PREFILL_COPIES)}")


@dataclass(slots=True)
class CallMeta:
    """Per call, from the trace: tokens in the call, context tokens before it in its request, its turn.
    A batched call (sim.batch) carries `sequences` [N] sequences of tokens / sequences tokens each, context then
    being their mean context (None: one sequence per call)."""

    tokens: np.ndarray  # [N] tokens (not (token, expert) pairs)
    context: np.ndarray  # [N]
    turn: np.ndarray  # [N]
    sequences: np.ndarray | None = None  # [N]


@dataclass(slots=True)
class CallTimes:
    seconds: np.ndarray  # [N] wall time of each call (the calls run one after another)
    gpu: np.ndarray  # [N] GPU busy
    pcie: np.ndarray  # [N] PCIe busy
    cpu: np.ndarray  # [N] CPU lane busy


def call_meta(trace, prefill_chunk: int) -> CallMeta:
    """The same call order as sim.calls.trace_calls, with what the cost model needs beyond the replay log."""
    from freetoken.sim.calls import segments

    L = trace.num_layers
    n, ctx, turn = [], [], []
    seen: dict[int, int] = {}
    for start, end in segments(trace):
        req, t = int(trace.request[start]), int(trace.turn[start])
        c = seen.get(req, 0)
        if trace.phase[start] == PREFILL:
            for lo in range(start, end, prefill_chunk):
                k = min(end, lo + prefill_chunk) - lo
                n.append(k)
                ctx.append(c)
                turn.append(t)
                c += k
        else:
            k = end - start
            n.extend([1] * k)
            ctx.extend(range(c, c + k))
            turn.extend([t] * k)
            c += k
        seen[req] = c
    rep = lambda a: np.repeat(np.asarray(a, np.int64), L)  # noqa: E731  one entry per layer
    return CallMeta(rep(n), rep(ctx), rep(turn))


def charge(log: ReplayLog, meta: CallMeta, card: ModelCard, hw: HardwareProfile,
           options: CostOptions = CostOptions(), host_work: HostWork | None = None,
           streamed: np.ndarray | None = None) -> CallTimes:
    """streamed [N]: freetoken's prefill double buffer (sim.replay ReplayResult.streamed): a call with streamed >= 0
    had that many experts (its layer's non-resident ones, used or not) copied while the call before it ran, in place
    of its fetches; only those calls load early. None: `double_buffer` loads every prefill call after a prefill call
    early, its fetches."""
    N = len(log)
    if len(meta.tokens) != N:
        raise ValueError(f"call metadata has {len(meta.tokens)} calls, the replay log {N}")
    if streamed is not None and not options.double_buffer:
        raise ValueError("streamed prefill copies are the double buffer's: charge them with double_buffer on")
    S, P, Lm = card.expert_bytes(), card.expert_params, card.moe_layers
    hbm, bp, bh = hw.achieved_hbm_gb_s * 1e9, hw.pcie_gb_s * 1e9, hw.host_gb_s * 1e9
    bp_decode = min(bp, options.decode_gather_gb_s * 1e9) if options.decode_gather_gb_s else bp
    rate, cpu_rate = hw.achieved_tflops(card.compute_dtype) * 1e12, hw.cpu_tflops * 1e12
    moe_rate = hw.moe_tflops(card.compute_dtype) * 1e12  # the experts' grouped GEMMs
    attn_rate = hw.attention_tflops(ATTENTION_DTYPE) * 1e12  # flash attention over the context, 16-bit
    dram = hw.dram_gb_s * 1e9 if options.host == "shared" else math.inf
    latency = hw.cpu_lane_latency_us * 1e-6
    pcie_latency = hw.pcie_call_latency_us * 1e-6
    n, ctx = meta.tokens.astype(np.float64), meta.context.astype(np.float64)
    seqs = np.ones(N) if meta.sequences is None else meta.sequences.astype(np.float64)
    m = n / seqs  # tokens per sequence

    # dense: weights of one layer's share, KV of each sequence's context read once per call, attention FLOPs
    attn_share = card.attention_layers / Lm
    kv_bytes = card.kv_bytes_per_token / Lm * seqs * (ctx + m)
    gemm_flops = 2 * card.dense_params * 1e9 / Lm * n
    attn_flops = 4 * card.attention_width * n * (ctx + (m + 1) / 2) * attn_share
    attn_flops += card.linear_flops_per_token(m) * n / Lm  # Gated DeltaNet's chunked delta rule: tensor-core dots
    state_bytes = 2 * card.state_bytes_per_sequence / Lm * seqs  # linear-attention states: read, then written back
    t_dense = np.maximum((card.dense_bytes() / Lm + kv_bytes + state_bytes) / hbm,
                         gemm_flops / rate + attn_flops / attn_rate)  # [N]
    t_hit = roofline(log.hits * S, 2 * P * log.hit_tokens, hbm, moe_rate)
    t_fcomp = roofline(log.fetched * S, 2 * P * log.fetch_tokens, hbm, moe_rate)
    copied = copied_experts(log, streamed)
    if options.prefill_copies == "layer":  # the whole layer, resident experts too (their compute is unchanged)
        copied = np.where(log.phase == PREFILL, card.num_experts, copied)
    pcie_bytes = ((copied + log.prefetched) * S).astype(np.float64)
    cpu_bytes = (log.cpu * S).astype(np.float64)
    t_cpu_alone = roofline(cpu_bytes, 2 * P * log.cpu_tokens, bh, cpu_rate)
    cpu_cap = np.divide(cpu_bytes, t_cpu_alone, out=np.full(N, bh), where=t_cpu_alone > 0)

    per_launch = (hw.launch_us + options.dispatch_us) * 1e-6
    if host_work is None:
        pre = post = stall = np.zeros(N)
    else:  # host launch time bounds each part from below; each device kernel adds its floor to the GPU's time
        pre, post = host_work.pre_launches * per_launch, host_work.post_launches * per_launch
        stall = host_work.charged_syncs * hw.sync_us * 1e-6
        floor = hw.kernel_floor_us * 1e-6
        t_dense, t_hit = t_dense + host_work.pre_kernels * floor, t_hit + host_work.post_kernels * floor
    seconds, gpu_busy = np.empty(N), t_dense + t_hit + t_fcomp
    pcie_busy, cpu_busy = np.empty(N), np.empty(N)
    end = prev_start = pcie_free = 0.0
    phase = log.phase.tolist()
    for i in range(N):
        start = end
        routed = start + max(t_dense[i], pre[i]) + stall[i]  # launched, computed, and its routing on the host
        d_p, d_c = share(pcie_bytes[i], bp if phase[i] == PREFILL else bp_decode, cpu_bytes[i], cpu_cap[i], dram)
        d_c += latency if cpu_bytes[i] else 0.0
        d_p += pcie_latency if pcie_bytes[i] else 0.0
        if options.overlap and (options.decode_overlap or phase[i] == PREFILL):
            if streamed is not None:
                early = streamed[i] >= 0
            else:
                early = options.double_buffer and phase[i] == PREFILL and i and phase[i - 1] == PREFILL
            pcie_end = max(pcie_free, prev_start if early else routed) + d_p
            gpu_end = max(routed + t_hit[i], pcie_end) + t_fcomp[i]
        else:  # one stream: the copy waits for the resident experts' compute, the fetched ones wait for the copy
            pcie_end = max(pcie_free, routed + t_hit[i]) + d_p
            gpu_end = pcie_end + t_fcomp[i]
        gpu_end = max(gpu_end, routed + post[i])  # the experts' kernels are launched after the routing
        end = max(gpu_end, routed + d_c if cpu_bytes[i] else routed)
        seconds[i] = end - start
        pcie_busy[i], cpu_busy[i] = d_p, d_c if cpu_bytes[i] else 0.0
        pcie_free, prev_start = pcie_end, start
    return CallTimes(seconds, gpu_busy, pcie_busy, cpu_busy)
