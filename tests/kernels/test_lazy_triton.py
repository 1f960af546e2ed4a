"""Triton is imported at a kernel's first launch (freetoken/kernels/lazy.py): a CPU run of the engine on its host
kernels never imports it; a launched kernel's file then holds the real Triton objects (its kernels, its
file-level constexprs, the modules), and the launch computes what the torch reference does."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from freetoken.paths import DEMO_MODEL

CHILD = r"""
import sys
from freetoken.cli import main
code = main(["generate", "--model", sys.argv[1], "--kernels", "host", "--device", "cpu", "--token-ids", "5,6,7",
             "--max-tokens", "3", "--greedy"])
print("TRITON", "triton" in sys.modules, "CODE", code)
"""


@pytest.mark.slow
def test_the_cpu_engine_on_host_kernels_never_imports_triton():
    out = subprocess.run([sys.executable, "-c", CHILD, str(DEMO_MODEL)], capture_output=True, text=True, check=True,
                         timeout=300).stdout.split()
    assert out[out.index("CODE") + 1] == "0" and out[out.index("TRITON") + 1] == "False"


def test_a_launch_swaps_the_files_stand_ins_for_triton_and_matches_the_reference():
    from freetoken.kernels import lazy
    from freetoken.kernels import packed_tiles
    from freetoken.kernels.rmsnorm import rms_norm, rms_norm_ref

    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 64, generator=gen), torch.randn(64, generator=gen)
    torch.testing.assert_close(rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6))
    import triton
    import triton.language as tl

    from freetoken.kernels import rmsnorm

    assert rmsnorm.triton is triton and rmsnorm.tl is tl
    kernels = [v for v in vars(rmsnorm).values() if hasattr(v, "fn") and hasattr(v, "run")]
    assert kernels and not any(isinstance(k, lazy.LazyKernel) for k in kernels)
    # a file whose kernels have not run yet keeps its stand-ins; reading a kernel builds it and binds its file
    lazy.real(packed_tiles.e4m3_bits_to_fp32)
    assert isinstance(packed_tiles.TINY_E8M0, tl.constexpr) and packed_tiles.TINY_E8M0.value == 2.0**-127
    assert packed_tiles.tl is tl


def test_jit_keeps_the_options_and_defers_the_build():
    from freetoken.kernels import lazy

    def kernel(x_ptr, N):
        pass

    k = lazy.triton.jit(do_not_specialize=["N"])(kernel)
    assert isinstance(k, lazy.LazyKernel) and k.__name__ == "kernel" and k.options == {"do_not_specialize": ["N"]}
    assert k._real is None
    assert k.arg_names == ["x_ptr", "N"] and k._real is not None  # an attribute read builds it
    with pytest.raises(AttributeError):
        lazy.tl.no_such_thing
