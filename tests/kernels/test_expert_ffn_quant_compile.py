"""The quantized expert FFN kernels through Triton's real compiler (TTIR -> PTX -> ptxas) for sm_90 and sm_120, no
GPU needed: every kind and scale variant, on both row-block paths. A subprocess, because this session's kernels were
defined as interpreted functions (Triton fixes interpret-or-compile when each @triton.jit decorator runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCALE_TYPE = {"int4": "*fp16", "fp8": "*fp32", "fp4": "*u8"}
# (kind, layout constexprs, one pair per block, also the down kernel): launches for bf16 activations. The down kernel
# differs from gate/up only around the same tile, so it is compiled once per kind (each compile takes ~2 s). With
# 64-wide K tiles: int4 GROUP 128 and fp8 block 128 load vectorised with one scale per row, int4 GROUP 32 and fp4
# vectorised with a scale tile per group; act-order g_idx and fp8 blocks of 40 columns gather per element.
VARIANTS = (
    ("int4", {"GROUP": 128, "HAS_G_IDX": False}, True, False),
    ("int4", {"GROUP": 32, "HAS_G_IDX": False}, True, True),
    ("fp8", {"BLOCK_ROWS": 1, "BLOCK_COLS": 40}, True, False),
    ("int4", {"GROUP": 128, "HAS_G_IDX": True}, False, True),
    ("fp8", {"BLOCK_ROWS": 128, "BLOCK_COLS": 128}, True, True),
    ("fp4", {"GROUP": 32, "SCALE_CODE": "e8m0"}, False, False),
    ("fp4", {"GROUP": 16, "SCALE_CODE": "e4m3", "GLOBAL_OP": "divide"}, True, True),
    ("fp4", {"GROUP": 16, "SCALE_CODE": "e4m3", "GLOBAL_OP": "multiply"}, False, False),
    ("fp4", {"GROUP": 32, "SCALE_CODE": "e8m0", "HAS_BIAS": True, "GLU": "clamped"}, True, True),  # gpt-oss MXFP4
)
NUM_COMPILES = sum(2 if down else 1 for *_, down in VARIANTS)


ARCHS = (90, 120)  # as test_compile_targets.py
SPILLING = {  # the variants that spill, bytes a thread (sm_90, sm_120), as test_compile_targets.py's: prefill gate/up
    "_gate_up_quant_kernel int4 {'GROUP': 128, 'HAS_G_IDX': True} one_pair=False": (592, 632),
    "_gate_up_quant_kernel fp4 {'GROUP': 32, 'SCALE_CODE': 'e8m0'} one_pair=False": (408, 520),
    "_gate_up_quant_kernel fp4 {'GROUP': 16, 'SCALE_CODE': 'e4m3', 'GLOBAL_OP': 'multiply'} one_pair=False": (432, 320),
    "_down_quant_kernel int4 {'GROUP': 128, 'HAS_G_IDX': True} one_pair=False": (8, 0),
    "_gate_up_quant_kernel fp8 {'BLOCK_ROWS': 1, 'BLOCK_COLS': 40} one_pair=True": (0, 8),
}


def compile_variants(arch: int) -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from freetoken.kernels.lazy import real
    from tests.kernels.cubins import stack_bytes

    from freetoken.kernels.expert_ffn_quant import (
        _down_quant_kernel,
        _gate_up_quant_kernel,
    )

    failures = 0
    for kind, layout, one_pair, down in VARIANTS:
        meta = {"KIND": kind, "GROUP": 1, "HAS_G_IDX": False, "BLOCK_ROWS": 1, "BLOCK_COLS": 1, "SCALE_CODE": "",
                "GLOBAL_OP": "", "HAS_BIAS": False, "GLU": "silu", **layout, "ONE_PAIR": one_pair, "DOT_FP32": False,
                "BLOCK_M": 16 if one_pair else 64, "BLOCK_N": 64, "BLOCK_K": 64}
        launches = [(_gate_up_quant_kernel, 32 if one_pair else 64)] + ([(_down_quant_kernel, 64)] if down else [])
        for fn, block_n in launches:
            fn = real(fn)  # the JITFunction behind a lazy @triton.jit (freetoken/kernels/lazy.py)
            consts = {k: v for k, v in {**meta, "BLOCK_N": block_n}.items() if k in fn.arg_names}  # down: no GLU
            types = {"x_ptr": "*bf16", "h_ptr": "*bf16", "y_ptr": "*fp32", "route_w_ptr": "*fp32", "b_ptr": "*bf16",
                     "alpha": "fp32", "limit": "fp32"}
            for a in fn.arg_names:
                if a.endswith("_ptr") and a not in types:
                    types[a] = ("*i32" if a in ("pairs_ptr", "block_slot_ptr", "slot_ids_ptr") or "g_idx" in a
                                else SCALE_TYPE[kind] if "scales" in a else "*fp32" if "global" in a else "*u8")
            sig = {a: "constexpr" if a in consts else types.get(a, "i32") for a in fn.arg_names}
            name = f"{fn.__name__} {kind} {layout} one_pair={one_pair}"
            try:
                kernel = triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", arch, 32),
                                        options={"num_warps": 4, "num_stages": 3})
                print(f"OK {name}{stack_bytes(kernel.asm['cubin'])}")
            except Exception as e:  # noqa: BLE001  any compiler error: report every variant, then fail
                failures += 1
                print(f"FAIL {name}: {type(e).__name__}: {str(e)[:1500]}")
    return failures


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_expert_ffn_quant_compiles(arch):
    from tests.kernels.cubins import new_spills

    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    res = subprocess.run([sys.executable, __file__, str(arch)], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=600, check=False)
    lines = res.stdout.splitlines()
    assert res.returncode == 0 and sum(line.startswith("OK ") for line in lines) == NUM_COMPILES, \
        res.stdout + res.stderr[-3000:]
    spilling, new = new_spills(lines, SPILLING, ARCHS.index(arch))
    print(f"sm_{arch} spills (bytes a thread): {spilling}")
    assert not new, f"new spills on sm_{arch}: {new}"


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(1 if compile_variants(int(sys.argv[1]) if len(sys.argv) > 1 else 90) else 0)
