"""The seed table's cells as sim.anchors predicts them: each row's machine, engine and settings (CELLS), why a cell
misses the accuracy goal with a variant of its uncertain input (NOTES), the regression pins (PINS) and the cells
that miss (MISSES). Data only; sim.anchors computes and renders."""

from __future__ import annotations

from dataclasses import dataclass

from freetoken.sim.engines import (  # the published FreeToken runs'
    FREETOKEN_012_DECODE, FREETOKEN_012_HYBRID_PREFILL, FREETOKEN_012_OFFLOAD_PREFILL)

# llama.cpp's MTP on Qwen3.5: one MTP block drafting one token; acceptance as DeepSeek-V3's technical report gives
# for its (one-token) MTP draft: 85-90% (low end taken). The review does not publish the run's acceptance.
MTP_SPEC = dict(depth=1, acceptance=0.85)


@dataclass(frozen=True, slots=True)
class Row:
    """How a seed row is predicted: machine, engine, the review's prompt, the engine settings the row assumes
    (sim.engines.with_settings), said in words, and speculative decoding where the row used it."""

    hardware: str
    engine: str
    prompt: int
    settings: dict
    about: str
    speculation: dict | None = None


_FT_FORMAT = ("NVFP4 experts (4.5 bpw: the only 4-bit expert format FreeToken 0.1.2 loads for Qwen3.5 MoE, "
              "models/qwen3_5_moe/config.py; no GPTQ / AWQ / AutoRound or GGUF path there)")
_FT_CHUNK = ("prefill as FreeToken 0.1.2 runs it by default: 8192-token chunks (scheduler/config.py "
             "max_extend_tokens; the run's chunk is not published), each loading every expert of every layer over "
             "PCIe, resident ones too (pipelined full-layer loading: engine/config.py moe_prefill_hit_d2d off; "
             "sim/engines.py FREETOKEN_012_OFFLOAD_PREFILL), as the paper's own Qwen3.6 chunk time confirms "
             "(sim/paper_checks.py, the section below)")
_FT_DECODE_PATH = ("decode as FreeToken 0.1.2 runs it, counted from its code (sim/engines.py FREETOKEN_012_DECODE): "
                   "one CUDA graph per step, no host launch or sync per layer, the LRU decided on the device and the "
                   "misses gathered by a kernel on the compute stream before one grouped expert GEMM; that gather is "
                   "SM loads of pinned host memory, not the copy engine, at ~31 GB/s (its authors' measurement on a "
                   "PCIe 5.0 H100 box, kernel/fast_index_copy.py; not measured on this one), where the review's 56 GB/s "
                   "reads as ft bench bw's linear-copy ceiling (its report pairs it with host RAM, the STREAM "
                   "ceiling): the copy engine, which 0.1.2's prefill uses")
_FT_DOUBLE = ("the prefill double buffer on, as FreeToken 0.1.2's default (engine/config.py moe_prefill_overlap; two "
              "expert layers of its slot cache, engine/cache_budget.py; sim/engines.py FREETOKEN_012_OFFLOAD_PREFILL)")
_FT_HYBRID_PREFILL = ("prefill as FreeToken 0.1.2's hybrid runs it: no CPU lane, every miss fetched, double-buffered "
                      "as its offload (layers/moe.py _prefill_routed reads no decode_target; engine/engine.py builds "
                      "the hybrid cache with the same moe_prefill_overlap; sim/engines.py "
                      "FREETOKEN_012_HYBRID_PREFILL: prefill_split offload, double_buffer on)")
_LLAMA = "GGUF Q4_K_M (assumed: the run's type is not published), ubatch 512 (llama-server's default)"
# (machine, engine column, mode column) of the seed table -> Row
CELLS: dict[tuple[str, str, str], Row] = {
    ("ultra7", "vLLM", "fully resident (AutoRound int4)"): Row(
        "rtxpro6000-ultra7", "resident", 32768, {"prefill_chunk": 8192},
        "vLLM: every expert in VRAM at int4 (4.25 bpw), dense 16 bit, decode as full CUDA graphs, 8192-token "
        "prefill chunks (vLLM's default max_num_batched_tokens for the API server on a GPU of >= 70 GiB: vLLM PR "
        "#12369, ROCm/vllm PR #954), the experts' W4A16 GEMMs at the class's MoE GEMM rate (35% of datasheet: "
        "vLLM's Marlin MoE kernel, FlagGems PR #3609), attention at FlashInfer's fa2 rate on this GPU at head dim "
        "256 (42%, FlashInfer PR #3576)"),
    ("ryzen", "FreeToken", "hybrid"): Row(
        "rtx5090-ryzen", "freetoken-hybrid", 36864,
        {**FREETOKEN_012_DECODE, **FREETOKEN_012_HYBRID_PREFILL, "expert_format": "nvfp4"},
        f"FreeToken: {_FT_FORMAT}, {_FT_CHUNK}, {_FT_HYBRID_PREFILL}, paper split rule in decode, global LRU, "
        f"{_FT_DECODE_PATH}"),
    ("ryzen", "FreeToken", "offload"): Row(
        "rtx5090-ryzen", "freetoken-offload", 36864,
        {**FREETOKEN_012_DECODE, **FREETOKEN_012_OFFLOAD_PREFILL, "expert_format": "nvfp4"},
        f"FreeToken: {_FT_FORMAT}, {_FT_CHUNK}, {_FT_DOUBLE}, global LRU, {_FT_DECODE_PATH}"),
    ("ryzen", "llama.cpp", "-cmoe (all experts computed on CPU)"): Row(
        "rtx5090-ryzen", "llamacpp-cmoe", 36864, {"gguf_type": "q4_k_m", "prefill_chunk": 512, "cuda_graphs": True},
        f"llama.cpp -cmoe: {_LLAMA}, CUDA graphs per split (ggml PR #18934)"),
    ("xeon", "llama.cpp", "cpu-moe + MTP"): Row(
        "xeon-2xp5000", "llamacpp-cmoe", 36864, {"gguf_type": "q4_k_m", "prefill_chunk": 512, "cuda_graphs": False},
        f"llama.cpp --cpu-moe: {_LLAMA}, no CUDA graphs (Pascal: ggml enables them from Volta), MTP depth "
        f"{MTP_SPEC['depth']}, acceptance {MTP_SPEC['acceptance']}", MTP_SPEC),
    ("xeon", "llama.cpp", "cpu-moe"): Row(
        "xeon-2xp5000", "llamacpp-cmoe", 36864, {"gguf_type": "q4_k_m", "prefill_chunk": 512, "cuda_graphs": False},
        f"llama.cpp --cpu-moe: {_LLAMA}, no CUDA graphs (Pascal)"),
}

_FT_DECODE = ("decode as FreeToken 0.1.2 runs it (sim/engines.py FREETOKEN_012_DECODE): one CUDA graph per step, its "
              "misses copied by an SM gather kernel at the ~31 GB/s its authors measured, in series with every "
              "expert GEMM. Was +40% / +38% with the gather at the copy engine's 56 GB/s (variant): the published "
              "~500 us per layer needs the copy of ~1.6 misses per layer at ~30 GB/s.",
              ("gather at the PCIe rate BP (56 GB/s)", {"decode_gather_gb_s": 0.0}))
# (row label, metric) -> (why it misses the target, optional (variant name, with_settings overrides))
NOTES: dict[tuple[str, str], tuple[str, tuple[str, dict] | None]] = {
    ("ultra7 / vLLM fully resident (AutoRound int4)", "prefill_tok_s"): (
        "compute-bound: dense GEMMs at 80% of the datasheet tensor rate (an H200's large bf16 GEMM, the class "
        "default), the experts' grouped W4A16 GEMMs at 35% (vLLM's Marlin MoE kernel on an H20, FlagGems PR "
        "#3609), attention at 42% (FlashInfer fa2 on this GPU at head dim 256, PR #3576): +133% before those two "
        "rates. The 36 Gated DeltaNet layers' chunked delta rule is charged by its FLOPs (ModelCard."
        "linear_flops_per_token: 0.21 GFLOP a token, about 1% of this cell) at attention's rate: the gap, ~43 us a "
        "token, would need those kernels ~40x slower than that. Not charged: vLLM's per-step host work. The missing "
        "input is a measurement of this prefill on this GPU (its MoE, attention and DeltaNet kernels at these "
        "shapes).",
        ("2048-token chunks", {"prefill_chunk": 2048})),
    ("ryzen / FreeToken hybrid", "decode_tok_s"): _FT_DECODE,
    ("ryzen / FreeToken offload", "decode_tok_s"): _FT_DECODE,
    ("ryzen / FreeToken hybrid", "prefill_tok_s"): (
        "the same prediction as the offload row's prefill (its note says why).",
        ("2048-token chunks", {"prefill_chunk": 2048})),
    ("ryzen / FreeToken offload", "prefill_tok_s"): (
        "charged as FreeToken 0.1.2 runs its prefill by default (settings): compute-bound, each chunk's full-layer "
        "copies (48 x 256 NVFP4 experts, 65 GB: 1.17 s at BP) behind its GEMMs and attention by the double buffer. "
        "0.1.2 runs the same prefill in hybrid and offload (layers/moe.py _prefill_routed has no CPU path, hybrid "
        "changes decode only; the default NVFP4 backend, --nvfp4-backend triton, loads the same native banks for "
        "both), so one prediction serves both rows, while the published hybrid prefill is 1.29x the offload one: "
        "it meets the hybrid row and overshoots this one. Compute-bound prefill on this GPU class comes out fast "
        "here as in the vLLM resident row: the achieved MoE, attention and DeltaNet kernel rates at these shapes "
        "on a GB202 GPU are the unmeasured input. With the copies not overlapping compute (variant) it would meet "
        "this row; 0.1.2's default overlaps them.",
        ("double buffer off", {"double_buffer": False})),
    ("ryzen / llama.cpp -cmoe (all experts computed on CPU)", "decode_tok_s"): (
        "BH = 63.6 GB/s is FreeToken's CPU lane (ft bench bw); llama.cpp's Q4_K CPU kernels were not measured on "
        "this box and the GGUF type is assumed.", ("IQ4_XS (4.25 bpw)", {"gguf_type": "iq4_xs"})),
    ("ryzen / llama.cpp -cmoe (all experts computed on CPU)", "prefill_tok_s"): (
        "llama.cpp's ubatch was not published, and the published figure rules out its default: each ubatch of "
        ">= 32 tokens uploads every used expert of every layer (ggml sched; PR #15346 copies only the used ones, "
        "which at 512 tokens x top-8 of 256 is all of them), not overlapped with compute (issue #25859, PR #28414), "
        "so prefill <= ubatch x BP / expert bytes = 512 x 56 GB/s / 70.3 GB = 408 tok/s at Q4_K_M (465 at IQ4_XS) "
        "against the published 806: the run used -ub >= 1024 (long-prompt -cmoe runs set it: -ub 1024 in PR "
        "#15346's thread, 3072 in the hot-experts run of sim/locality_evidence.py). Not set from this cell: the "
        "xeon rows, at the same -ub 1024, would come out +39% unless their uploads ran from pageable mmap'd "
        "memory (issue #25859: a bounce buffer, ~half the pinned rate), which is not published either.",
        ("-ub 1024", {"prefill_chunk": 1024})),
    ("xeon / llama.cpp cpu-moe + MTP", "decode_tok_s"): (
        "the MTP acceptance of the run is not published (0.85 assumed from DeepSeek-V3's report).",
        ("acceptance 0.95", {"acceptance": 0.95})),
    ("xeon / llama.cpp cpu-moe + MTP", "prefill_tok_s"): (
        "copy-bound over PCIe 3.0 x16 (12.5 GB/s, a published typical figure, not measured on this box), with "
        "attention at Pascal's FP32 rate (ggml's flash-attention tile kernels; no tensor cores, FP16 at 1/64): "
        "-23% while it was charged at the int8 dp4a rate. At the assumed Q4_K_M and ubatch 512 the uploads alone "
        "bound prefill at 512 x 12.5 GB/s / 70.3 GB = 91 tok/s, below the published 107-108, so the run's GGUF "
        "type, ubatch or link rate differs from the assumed (none is published). Not llama.cpp's pipeline "
        "parallelism over the two GPUs: --cpu-moe is a tensor buffer override (common/arg.cpp "
        "llm_ffn_exps_cpu_override), and src/llama-context.cpp enables pipeline parallelism only when "
        "!model.has_tensor_overrides().",
        ("IQ4_XS (4.25 bpw)", {"gguf_type": "iq4_xs"})),
    ("xeon / llama.cpp cpu-moe", "prefill_tok_s"): (
        "as the MTP row's prefill.", ("IQ4_XS (4.25 bpw)", {"gguf_type": "iq4_xs"})),
}

# Regression pins (tests/test_anchors.py): |prediction / published - 1| as this version predicts it, rounded up to
# 5 points, plus 5. Not an accuracy claim: TARGET is (tests/test_anchor_accuracy.py).
PINS: dict[tuple[str, str], float] = {
    ("ultra7 / vLLM fully resident (AutoRound int4)", "decode_tok_s"): 0.30,
    ("ultra7 / vLLM fully resident (AutoRound int4)", "prefill_tok_s"): 0.50,
    ("ryzen / FreeToken hybrid", "decode_tok_s"): 0.10,
    ("ryzen / FreeToken hybrid", "prefill_tok_s"): 0.30,
    ("ryzen / FreeToken offload", "decode_tok_s"): 0.10,
    ("ryzen / FreeToken offload", "prefill_tok_s"): 0.70,
    ("ryzen / llama.cpp -cmoe (all experts computed on CPU)", "decode_tok_s"): 0.20,
    ("ryzen / llama.cpp -cmoe (all experts computed on CPU)", "prefill_tok_s"): 0.60,
    ("xeon / llama.cpp cpu-moe + MTP", "decode_tok_s"): 0.20,
    ("xeon / llama.cpp cpu-moe + MTP", "prefill_tok_s"): 0.30,
    ("xeon / llama.cpp cpu-moe", "decode_tok_s"): 0.10,
    ("xeon / llama.cpp cpu-moe", "prefill_tok_s"): 0.30,
}
PINS_LABELS = tuple(dict.fromkeys(label for label, _ in PINS))  # the seed rows, in table order
# The cells that miss TARGET (tests/test_anchor_accuracy.py expects them to fail, strictly: one that starts to
# meet the target fails the test until it is taken off this list). Each has its reason in NOTES.
MISSES = {
    ("ultra7 / vLLM fully resident (AutoRound int4)", "prefill_tok_s"),
    ("ryzen / llama.cpp -cmoe (all experts computed on CPU)", "prefill_tok_s"),
    ("ryzen / FreeToken offload", "prefill_tok_s"),
    ("xeon / llama.cpp cpu-moe + MTP", "prefill_tok_s"),
    ("xeon / llama.cpp cpu-moe", "prefill_tok_s"),
}
