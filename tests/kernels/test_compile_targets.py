"""Every kernel variant the wrappers launch goes through Triton's real compiler (TTIR -> PTX -> ptxas) for sm_90
(H100 / H200) and sm_120 (RTX 50xx / RTX PRO 6000 Blackwell), without a GPU: catches what the interpreter lets
through (dot shapes, dtypes, shared memory, control flow).

Run as a script in a subprocess because Triton fixes interpret-or-compile when each @triton.jit decorator runs, and
the test session has already imported the kernels as interpreted functions.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _variants():
    """(name, kernel, pointer/float arg types, constexprs, num_warps, num_stages) for the launches the wrappers make."""
    from freetoken.kernels.attention_decode import _attention_decode_merge_kernel, _attention_decode_split_kernel
    from freetoken.kernels.attention_prefill import _attention_prefill_kernel
    from freetoken.kernels.expert_ffn import _down_kernel, _gate_up_kernel
    from freetoken.kernels.pair_sums import _sum_pairs_kernel
    from freetoken.kernels.linear import TILE_CONFIGS, _linear_kernel
    from freetoken.kernels.linear_decode import _linear_decode_kernel
    from freetoken.kernels.tuning import load_table
    from freetoken.kernels.placement import _placement_kernel
    from freetoken.kernels.rmsnorm import _rms_norm_kernel
    from freetoken.kernels.rope import _rope_kernel
    from freetoken.kernels.router import _router_topk_kernel

    P, F = "*bf16", "*fp32"
    slots = dict(pairs_ptr="*i32", block_slot_ptr="*i32", slot_ids_ptr="*i32")
    out = [
        ("rms_norm", _rms_norm_kernel, dict(x_ptr=P, w_ptr=P, out_ptr=P, eps="fp32"), dict(BLOCK_D=2048), 8, 1),
        ("rope", _rope_kernel, dict(x_ptr=P, pos_ptr="*i64", inv_freq_ptr=F, out_ptr=P, cs_scale="fp32"),
         dict(BLOCK_H=32, BLOCK_HALF=64, BLOCK_PASS=0), 4, 1),
        ("rope partial", _rope_kernel, dict(x_ptr=P, pos_ptr="*i64", inv_freq_ptr=F, out_ptr=P, cs_scale="fp32"),
         dict(BLOCK_H=32, BLOCK_HALF=32, BLOCK_PASS=64), 4, 1),
        ("router_topk", _router_topk_kernel, dict(logits_ptr=P, bias_ptr=P, weights_ptr=F, ids_ptr="*i32", scale="fp32"),
         dict(RENORMALIZE=True, SCORE="softmax", HAS_BIAS=False, GROUPED=False, GROUP_TOP2=False, BLOCK_E=128,
              BLOCK_K=8, BLOCK_G=1), 1, 1),
        ("router_topk deepseek-v3", _router_topk_kernel,
         dict(logits_ptr=P, bias_ptr=F, weights_ptr=F, ids_ptr="*i32", scale="fp32"),
         dict(RENORMALIZE=True, SCORE="sigmoid", HAS_BIAS=True, GROUPED=True, GROUP_TOP2=True, BLOCK_E=256, BLOCK_K=8,
              BLOCK_G=8), 1, 1),
        ("router_topk deepseek-v4", _router_topk_kernel,
         dict(logits_ptr=P, bias_ptr=F, weights_ptr=F, ids_ptr="*i32", scale="fp32"),
         dict(RENORMALIZE=True, SCORE="sqrtsoftplus", HAS_BIAS=True, GROUPED=False, GROUP_TOP2=False, BLOCK_E=256,
              BLOCK_K=8, BLOCK_G=1), 1, 1),
        ("linear fp32 decode", _linear_kernel, dict(x_ptr=F, w_ptr=F, bias_ptr=F, out_ptr=F),
         dict(HAS_BIAS=True, DOT_FP32=True, BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, GROUP_M=8), 4, 4),
    ]
    for _, bm, bn, bk, warps, stages in TILE_CONFIGS:
        for bn_used in sorted({bn, 32} if bm == 16 else {bn}):
            out.append((f"linear {bm}x{bn_used}x{bk}", _linear_kernel, dict(x_ptr=P, w_ptr=P, bias_ptr=P, out_ptr=P),
                        dict(HAS_BIAS=False, DOT_FP32=False, BLOCK_M=bm, BLOCK_N=bn_used, BLOCK_K=bk, GROUP_M=8),
                        warps, stages))
    kv_scales = dict(k_scale_ptr=F, v_scale_ptr=F)
    decode = dict(x_ptr=P, w_ptr=P, bias_ptr=P, out_ptr=P, partial_ptr=F, count_ptr="*i32")
    for shape_class, cfg in load_table()["default"]["linear_decode"].items():  # the shipped decode configs
        for split, bm, bias in ((1, 1, False), (3, 1, True), (4, 4, False)):  # one launch; split-K; 4 rows split
            out.append((f"linear_decode {shape_class} split={split} rows={bm}", _linear_decode_kernel, decode,
                        dict(HAS_BIAS=bias, SPLIT_K=split, BLOCK_M=bm, BLOCK_N=cfg["BLOCK_N"],
                             BLOCK_K=max(cfg["BLOCK_K"] // bm, 32)),  # as linear_decode narrows K for more rows
                        cfg["num_warps"], cfg["num_stages"]))
    for bm, warps in ((16, 4), (64, 8)):
        for sinks, sliding, fp8 in ((False, False, False), (True, True, False), (False, False, True)):
            # plain; gpt-oss (sinks, sliding window); an FP8 KV cache (uint8 e4m3 codes + fp32 scales)
            kv = "*u8" if fp8 else P
            out.append((f"attention prefill BM={bm}" + (" sinks sliding" if sinks else "") + (" fp8 kv" if fp8 else ""),
                        _attention_prefill_kernel,
                        dict(q_ptr=P, k_ptr=kv, v_ptr=kv, out_ptr=P, sinks_ptr=F, qk_scale="fp32", **kv_scales),
                        dict(DOT_FP32=False, SINKS=sinks, SLIDING=sliding, FP8_KV=fp8, BLOCK_M=bm, BLOCK_N=64,
                             BLOCK_D=128), warps, 2))
    for fp8 in (False, True):
        kv = "*u8" if fp8 else P
        out.append(("attention decode split" + (" fp8 kv" if fp8 else ""), _attention_decode_split_kernel,
                    dict(q_ptr=P, k_ptr=kv, v_ptr=kv, part_out_ptr=F, part_lse_ptr=F, qk_scale="fp32", **kv_scales),
                    dict(DOT_FP32=False, FP8_KV=fp8, BLOCK_G=16, BLOCK_N=64, BLOCK_D=128), 4, 2))
    out += [
        ("attention decode merge", _attention_decode_merge_kernel,
         dict(part_out_ptr=F, part_lse_ptr=F, out_ptr=P, sinks_ptr=F), dict(SINKS=False, BLOCK_S=64, BLOCK_D=128), 4, 1),
        ("attention decode merge sinks", _attention_decode_merge_kernel,
         dict(part_out_ptr=F, part_lse_ptr=F, out_ptr=P, sinks_ptr=F), dict(SINKS=True, BLOCK_S=64, BLOCK_D=128), 4, 1),
        ("expert sum", _sum_pairs_kernel, dict(y_ptr=F, slot_ptr="*i32", out_ptr=P, a1_ptr=P, a2_ptr=P),
         dict(TERMS=0, BLOCK_D=1024), 4, 1),
        ("expert sum + CPU lane + group", _sum_pairs_kernel, dict(y_ptr=F, slot_ptr="*i32", out_ptr=P, a1_ptr=P,
                                                                   a2_ptr=F), dict(TERMS=2, BLOCK_D=1024), 4, 1),
    ]
    for one_pair, bm in ((True, 16), (False, 64)):
        for bias, glu in ((False, "silu"), (True, "clamped"), (False, "silu_limit")):  # plain; gpt-oss; DeepSeek-V4
            meta = dict(ONE_PAIR=one_pair, DOT_FP32=False, HAS_BIAS=bias, BLOCK_M=bm, BLOCK_N=64, BLOCK_K=64)
            tag = f"one_pair={one_pair}" + (" bias" if bias else "") + f" {glu}"
            out.append((f"expert gate_up {tag}", _gate_up_kernel,
                        dict(x_ptr=P, w_ptr=P, h_ptr=P, b_ptr=P, alpha="fp32", limit="fp32", **slots),
                        dict(meta, GLU=glu, BLOCK_N=32 if one_pair else 64), 4, 3))
            out.append((f"expert down {tag}", _down_kernel,
                        dict(h_ptr=P, w_ptr=P, route_w_ptr=F, y_ptr=F, b_ptr=P, **slots), meta, 4, 3))
    placement = {a: "*i32" for a in ("experts_ptr", "tokens_ptr", "slot_of_ptr", "key_of_slot_ptr", "fetch_count_ptr",
                                     "kind_ptr", "slot_ptr", "copy_expert_ptr", "copy_slot_ptr", "evict_ptr")}
    placement.update(last_use_ptr="*i64", ints_ptr="*i64", counts_ptr="*i64")
    for admit in (True, False):
        for order in (0, 1, 2):
            out.append((f"placement admit={admit} order={order}", _placement_kernel, placement,
                        dict(ADMIT=admit, ORDER=order, BLOCK_N=16, BLOCK_C=256), 4, 1))
    from freetoken.kernels.expert_gather import _gather_kernel

    for raw in ("*i16", "*u8", "*i32"):  # bf16 rows, packed bytes, fp32 scales: moved as raw elements
        out.append((f"expert gather {raw}", _gather_kernel,
                    dict(src_ptr=raw, dst_ptr=raw, copy_expert_ptr="*i32", copy_slot_ptr="*i32", counts_ptr="*i64"),
                    dict(BLOCK=4096), 4, 1))
    from freetoken.kernels.expert_gather import _gather2_kernel
    from freetoken.kernels.router_linear import NUM_WARPS, _router_linear_topk_kernel

    out.append(("expert gather, two tensors", _gather2_kernel,
                dict(src0_ptr="*i16", dst0_ptr="*i16", src1_ptr="*i16", dst1_ptr="*i16", copy_expert_ptr="*i32",
                     copy_slot_ptr="*i32", counts_ptr="*i64"), dict(BLOCK=4096), 4, 1))
    for split in (False, True):  # prefill: a program per token; decode: features split, the last program picks
        out.append((f"router linear top-k split={split}", _router_linear_topk_kernel,
                    dict(h_ptr=P, w_ptr=P, part_ptr=F, done_ptr="*i32", weights_ptr=F, ids_ptr="*i32"),
                    dict(RENORMALIZE=True, SPLIT=split, BLOCK_E=128, BLOCK_D=64, BLOCK_K=8), NUM_WARPS, 1))
    return out + _newer_variants()


def _newer_variants():
    """The hybrid (Qwen3-Next / Qwen3.5) model's kernels and DeepSeek-V4's."""
    from freetoken.kernels.attention_compressed import _attention_compressed_kernel
    from freetoken.kernels.causal_conv1d import _causal_conv1d_kernel
    from freetoken.kernels.causal_conv1d_update import _conv1d_update_kernel
    from freetoken.kernels.gated_delta_chunk import CHUNK, _gated_delta_chunk_kernel
    from freetoken.kernels.rmsnorm_gated import _rms_norm_gated_kernel
    from freetoken.kernels.compress_pool import _compress_pool_kernel
    from freetoken.kernels.gated_delta_step import _gated_delta_step_kernel
    from freetoken.kernels.hyper_connection import _hc_post_kernel, _hc_pre_kernel
    from freetoken.kernels.router import _router_weights_kernel

    P, F = "*bf16", "*fp32"
    hc = dict(x_ptr=P, fn_ptr=F, base_ptr=F, scale_ptr=F, post_ptr=F, comb_ptr=F, out_ptr=P, eps="fp32",
              hc_eps="fp32")
    delta = dict(q_ptr=P, k_ptr=P, v_ptr=P, g_ptr=F, beta_ptr=P, state_ptr=F, out_ptr=P, scale="fp32")
    return [
        ("rms_norm_gated", _rms_norm_gated_kernel, dict(x_ptr=P, z_ptr=P, w_ptr=P, out_ptr=P, eps="fp32"),
         dict(BLOCK_D=128), 1, 3),
        ("causal_conv1d (prefill)", _causal_conv1d_kernel, dict(x_ptr=P, w_ptr=P, state_ptr=P, out_ptr=P),
         dict(KW=4, SILU=True, BLOCK_T=16, BLOCK_C=128), 4, 3),
        ("gated delta chunk (prefill, bf16: tf32 products)", _gated_delta_chunk_kernel, delta,
         dict(DOT_FP32=False, BT=CHUNK, BK=128, BV=32), 8, 3),
        ("gated delta chunk (prefill, fp32)", _gated_delta_chunk_kernel, dict(delta, q_ptr=F, k_ptr=F, v_ptr=F,
                                                                               beta_ptr=F, out_ptr=F),
         dict(DOT_FP32=True, BT=CHUNK, BK=128, BV=16), 8, 3),
        ("conv1d update (a decode batch)", _conv1d_update_kernel, dict(x_ptr=P, w_ptr=P, state_ptr=P, out_ptr=P),
         dict(KW=4, SILU=True, BLOCK_C=256), 4, 1),
        ("gated delta step (a decode batch)", _gated_delta_step_kernel, delta, dict(BK=128, BV=64), 4, 1),
        ("router weights (hash)", _router_weights_kernel, dict(logits_ptr=P, ids_ptr="*i32", weights_ptr=F,
                                                               scale="fp32"),
         dict(RENORMALIZE=True, SCORE="sqrtsoftplus", BLOCK_E=256, BLOCK_K=8), 1, 1),
        ("hyper-connection pre", _hc_pre_kernel, hc, dict(N=4, NP=4, MP=32, HEAD=False, BLOCK=1024, BLOCK_D=256),
         4, 1),
        ("hyper-connection head", _hc_pre_kernel, hc, dict(N=4, NP=4, MP=4, HEAD=True, BLOCK=1024, BLOCK_D=256), 4, 1),
        ("hyper-connection post", _hc_post_kernel, dict(x_ptr=P, y_ptr=P, post_ptr=F, comb_ptr=F, out_ptr=P),
         dict(N=4, NP=4, BLOCK_D=128), 4, 1),
        ("compress pool csa", _compress_pool_kernel, dict(kv_ptr=P, score_ptr=F, out_ptr=P),
         dict(BLOCK_S=8, BLOCK_C=512), 4, 1),
        ("compress pool hca", _compress_pool_kernel, dict(kv_ptr=P, score_ptr=F, out_ptr=P),
         dict(BLOCK_S=128, BLOCK_C=32), 4, 1),
        ("attention compressed", _attention_compressed_kernel,
         dict(q_ptr=P, k_ptr=P, e_ptr=P, picks_ptr="*i32", sinks_ptr=F, out_ptr=P, qk_scale="fp32"),
         dict(DOT_FP32=False, BLOCK_H=16, BLOCK_N=16, BLOCK_D=512), 4, 1),
    ]


ARCHS = (90, 120)  # Hopper; consumer / workstation Blackwell
# variants whose threads spill registers (the stack frame cuobjdump reports, bytes a thread, Triton 3.9's ptxas), a
# GPU-speed debt for a GPU to measure: a variant that starts to spill on an arch fails the test
SPILLING = {  # (sm_90, sm_120)
    "expert gate_up one_pair=False bias clamped": (816, 856),
    "expert gate_up one_pair=False silu": (808, 712),
    "expert gate_up one_pair=False silu_limit": (808, 712),
    "gated delta chunk (prefill, fp32)": (472, 456),
    "hyper-connection pre": (472, 232),
    "gated delta step (a decode batch)": (128, 144),
    "expert down one_pair=False silu_limit": (80, 152),
    "expert down one_pair=False silu": (80, 152),
    "gated delta chunk (prefill, bf16: tf32 products)": (0, 184),
    "expert down one_pair=False bias clamped": (0, 136),
    "linear 16x64x128": (0, 80),
    "linear 128x128x64": (8, 16),
    "attention prefill BM=64 fp8 kv": (0, 16),
    "linear 64x64x64": (0, 8),
    "attention decode split fp8 kv": (8, 0),
}


def compile_all(arch: int) -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from freetoken.kernels.lazy import real
    from tests.kernels.cubins import stack_bytes

    target = GPUTarget("cuda", arch, 32)
    failures = 0
    for name, fn, types, consts, warps, stages in _variants():
        fn = real(fn)  # the JITFunction behind a lazy @triton.jit (freetoken/kernels/lazy.py)
        signature = {a: "constexpr" if a in consts else types.get(a, "i32") for a in fn.arg_names}
        try:
            kernel = triton.compile(ASTSource(fn, signature, consts), target=target,
                                    options=dict(num_warps=warps, num_stages=stages))
            print(f"OK {name}{stack_bytes(kernel.asm['cubin'])}")
        except Exception as e:  # report every variant, then fail
            failures += 1
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[:1500]}")
    return failures


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_every_kernel_compiles(arch):
    from tests.kernels.cubins import new_spills

    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    res = subprocess.run([sys.executable, __file__, str(arch)], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    lines = res.stdout.splitlines()
    assert res.returncode == 0 and not any(line.startswith("FAIL") for line in lines), res.stdout + res.stderr[-3000:]
    assert sum(line.startswith("OK ") for line in lines) == len(_variants())
    spilling, new = new_spills(lines, SPILLING, ARCHS.index(arch))
    print(f"sm_{arch} spills (bytes a thread): {spilling}")
    assert not new, f"new spills on sm_{arch}: {new}"


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(1 if compile_all(int(sys.argv[1]) if len(sys.argv) > 1 else 90) else 0)
