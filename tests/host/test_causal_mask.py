"""The prefix-aware causal mask of host prefill attention: torch's own lower-right causal bias, materialised; and a
prefill after a cached prefix on the demo model does not pull in torch._dynamo (about a second at the first request)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from freetoken.kernels.host import causal_after


@pytest.mark.parametrize("start_pos,T", [(0, 5), (3, 4), (10, 1), (7, 7)])
def test_causal_after_is_torchs_lower_right_causal_bias(start_pos, T):
    from torch.nn.attention.bias import causal_lower_right

    assert torch.equal(causal_after(start_pos, T), causal_lower_right(T, start_pos + T)._materialize())


@pytest.mark.slow
def test_a_prefill_after_a_prefix_does_not_import_torch_dynamo():
    code = """
import sys
from freetoken.engine import CacheConfig, Engine
from freetoken.paths import DEMO_MODEL
eng = Engine.from_pretrained(str(DEMO_MODEL), CacheConfig("lru", fraction=1.0), kernels="host", device="cpu",
                             record=False, threads=1)
kv = eng.new_kv(64)
eng.prefill(list(range(1, 20)), kv)
eng.prefill(list(range(20, 40)), kv)  # positions 19..38 against the cached prefix
print("torch._dynamo" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"
