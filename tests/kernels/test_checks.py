"""Wrapper checks and the interpreter switch made at package import."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from freetoken.kernels import rms_norm
from freetoken.kernels.checks import check_tensor


def test_cpu_tensor_without_interpreter_is_refused(monkeypatch):
    monkeypatch.setattr(sys.modules["freetoken.kernels.checks"], "_INTERPRETING", False)
    with pytest.raises(ValueError, match="x: on cpu"):
        check_tensor(torch.randn(2, 4), "x", 2)


def test_non_contiguous_last_dim_is_refused():
    with pytest.raises(ValueError, match="x: last dim"):
        rms_norm(torch.randn(8, 4).T, torch.ones(8), 1e-6)


def test_wrong_rank_and_dtype_are_named():
    with pytest.raises(ValueError, match="x: expected 2 dims"):
        rms_norm(torch.randn(2, 3, 4), torch.ones(4), 1e-6)
    with pytest.raises(TypeError, match="x: dtype torch.int32"):
        rms_norm(torch.ones(2, 4, dtype=torch.int32), torch.ones(4), 1e-6)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the switch only applies without CUDA")
def test_import_switches_cpu_machines_to_the_interpreter():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import os, torch\n"
        "import freetoken.kernels as K\n"
        "x = torch.ones(2, 4)\n"
        "print(os.environ['TRITON_INTERPRET'], K.rms_norm(x, torch.full((4,), 2.0), 0.0).sum().item())\n"
    )
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["1", "16.0"]  # rows of ones normalise to ones, times 2, 8 entries
