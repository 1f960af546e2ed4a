"""The int4 GEMM through Triton's real compiler (TTIR -> PTX -> ptxas) for sm_90, no GPU needed: catches what the
interpreter lets through. A subprocess, because this session's kernels were defined as interpreted functions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ((128, False, False), (32, True, False), (128, False, True))  # (group, act-order g_idx, awq)


def compile_variants() -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from freetoken.kernels.dequant_int4 import (
        BLOCK_K,
        BLOCK_M,
        BLOCK_N,
        _int4_linear_kernel,
    )

    types = {"x_ptr": "*bf16", "qweight_ptr": "*i32", "qzeros_ptr": "*i32", "scales_ptr": "*fp16",
             "g_idx_ptr": "*i32", "out_ptr": "*bf16"}
    failures = 0
    for group, g_idx, awq in VARIANTS:
        consts = {"GROUP": group, "ZERO_OFFSET": 0 if awq else 1, "HAS_G_IDX": g_idx, "AWQ": awq, "DOT_FP32": False,
                  "BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K}
        sig = {a: "constexpr" if a in consts else types.get(a, "i32") for a in _int4_linear_kernel.arg_names}
        try:
            triton.compile(ASTSource(_int4_linear_kernel, sig, consts), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": 4, "num_stages": 3})
            print(f"OK group={group} g_idx={g_idx} awq={awq}")
        except Exception as e:  # noqa: BLE001  any compiler error: report both variants, then fail
            failures += 1
            print(f"FAIL group={group} g_idx={g_idx} awq={awq}: {type(e).__name__}: {str(e)[:1500]}")
    return failures


@pytest.mark.slow
def test_int4_linear_compiles_for_sm90():
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    res = subprocess.run([sys.executable, __file__], env=env, cwd=REPO, capture_output=True, text=True, timeout=600,
                         check=False)
    lines = res.stdout.splitlines()
    assert res.returncode == 0 and sum(line.startswith("OK ") for line in lines) == len(VARIANTS), res.stdout + res.stderr[-3000:]


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(1 if compile_variants() else 0)
