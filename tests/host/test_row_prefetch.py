"""Software prefetch of streamed weight rows: chosen per CPU vendor unless $FT_HOST_ROW_PREFETCH says otherwise, and
never a change in what the kernels compute (only in when the rows arrive)."""

from __future__ import annotations

import pytest
import torch

from freetoken.host import kernels as hk
from freetoken.quant.head import int8_head
from tests.host.conftest import native_or_skip

INTEL = "vendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\n"
AMD_ZEN4 = "vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx2 fma avx512f avx512bw\n"
AMD_ZEN3 = "vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 fma f16c\n"


def test_auto_follows_the_cpu(monkeypatch):
    monkeypatch.delenv("FT_HOST_ROW_PREFETCH", raising=False)
    assert hk.row_prefetch(INTEL) == hk.ROW_PREFETCH_INTEL > 0
    assert hk.row_prefetch(AMD_ZEN4) == 0
    assert hk.row_prefetch(AMD_ZEN3) == hk.ROW_PREFETCH_AMD_AVX2 > 0


@pytest.mark.parametrize("value, expected", [("off", 0), ("0", 0), ("8192", 8192), (" AUTO ", None)])
def test_the_variable_overrides_auto(monkeypatch, value, expected):
    monkeypatch.setenv("FT_HOST_ROW_PREFETCH", value)
    assert hk.row_prefetch(INTEL) == (hk.ROW_PREFETCH_INTEL if expected is None else expected)


@pytest.mark.parametrize("value", ["lots", "100", "-64"])
def test_a_bad_value_is_named(monkeypatch, value):
    monkeypatch.setenv("FT_HOST_ROW_PREFETCH", value)
    with pytest.raises(ValueError, match=f"FT_HOST_ROW_PREFETCH={value.strip().lower()!r}"):
        hk.row_prefetch(INTEL)


@pytest.fixture
def prefetch_restored():
    yield
    hk.set_row_prefetch(hk.row_prefetch())


@pytest.mark.parametrize("T", [1, 3])
def test_prefetch_leaves_every_result_bit_for_bit(T, prefetch_restored):
    native_or_skip()
    gen = torch.Generator().manual_seed(T)
    w = (torch.randn(300, 512, generator=gen) / 8).bfloat16()  # rows past the last one prefetched: never read
    head = int8_head(torch.randn(256, 512, generator=gen).bfloat16())
    x = torch.randn(T, 512, generator=gen).bfloat16()
    outs = []
    for nbytes in (0, 4096, 64):
        hk.set_row_prefetch(nbytes)
        outs.append((hk.linear(x, w), hk.linear(x, head)))
    ref = x.float() @ w.float().T
    assert ((outs[0][0].float() - ref).abs().max() / ref.abs().max()).item() < 8e-3  # the kernel itself is right
    for dense, int8 in outs[1:]:
        assert torch.equal(dense, outs[0][0]) and torch.equal(int8, outs[0][1])
