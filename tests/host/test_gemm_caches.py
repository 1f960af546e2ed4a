"""ideep's per-shape GEMM cache bounded: bf16 matmuls of 200 distinct row counts keep clearly less memory after
bound_ideep_cache than with ideep's default 1024 entries (glibc's in-use bytes, each setting in a fresh process: the
variable is read once), and a value that would crash ideep is refused by name."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from freetoken.host import gemm_caches

CHILD = r"""
import ctypes, torch
from freetoken.host.gemm_caches import bound_ideep_cache
print("CAP", bound_ideep_cache())
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
def in_use():
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd
torch.set_num_threads(1)
w, x = torch.randn(256, 512, dtype=torch.bfloat16), torch.randn(256, 512, dtype=torch.bfloat16)
torch.mm(x[:3], w.T)
before = in_use()
for m in range(1, 201):
    torch.mm(x[:m], w.T)
print("KEPT", in_use() - before)
"""


def kept(capacity: str | None) -> tuple[int, int]:
    env = {k: v for k, v in os.environ.items() if k != gemm_caches.VARIABLE}
    if capacity is not None:
        env[gemm_caches.VARIABLE] = capacity
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    return int(out[out.index("CAP") + 1]), int(out[out.index("KEPT") + 1])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallinfo2")
def test_the_bounded_cache_keeps_less_than_ideeps_default():
    cap_default, default = kept("1024")
    cap_ours, ours = kept(None)
    assert (cap_default, cap_ours) == (1024, gemm_caches.IDEEP_CACHE_ENTRIES)
    if default < 8 << 20:
        pytest.skip(f"this CPU's bf16 matmuls kept {default} bytes for 200 shapes: not through ideep's cache")
    assert ours < 0.8 * default


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_a_value_that_would_crash_ideep_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv(gemm_caches.VARIABLE, value)
    with pytest.raises(ValueError, match=rf"^LRU_CACHE_CAPACITY='{value}': ideep's GEMM cache needs a positive"):
        gemm_caches.bound_ideep_cache()
