"""qk_norm_rope (per-head q / k norm, rope, KV writes in one launch) against the composition it replaces
(rms_norm_ref, apply_rope_ref, the cache writes), interpreted."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_ref
from freetoken.kernels.rope import yarn_inv_freq


@pytest.mark.parametrize("T, H, Hkv, Dh, rotary, norm, round_normed, dtype, yarn", [
    (1, 4, 2, 16, 16, True, True, torch.float32, False),
    (3, 4, 2, 16, 8, True, False, torch.float32, False),
    (2, 8, 1, 32, 32, False, True, torch.float32, True),
    (1, 4, 2, 16, 16, True, True, torch.bfloat16, False),
])
def test_qk_norm_rope_equals_composition(T, H, Hkv, Dh, rotary, norm, round_normed, dtype, yarn):
    g = torch.Generator().manual_seed(T * 7 + H)
    qkv = torch.randn(T, (H + 2 * Hkv) * Dh + 5, generator=g).to(dtype)[:, 5:]  # strided rows, as a view
    qn, kn = (torch.rand(Dh, generator=g).to(dtype) + 0.5 for _ in range(2)) if norm else (None, None)
    inv_freq, scale = yarn_inv_freq(1e4, rotary, 4.0, 64) if yarn else (None, 1.0)
    start, N = 5, 12
    positions = torch.arange(start, start + T)
    caches = [torch.zeros(N, Hkv, Dh, dtype=dtype) for _ in range(4)]
    got = qk_norm_rope(qkv, H, Hkv, qn, kn, 1e-6, positions, 1e4, caches[0], caches[1], start, rotary, inv_freq, scale,
                       round_normed)
    want = qk_norm_rope_ref(qkv, H, Hkv, qn, kn, 1e-6, positions, 1e4, caches[2], caches[3], start, rotary,
                            inv_freq, scale, round_normed)
    # bf16: two roundings in a row
    tol = dict(rtol=0, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=3e-2)
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(caches[0], caches[2], **tol)
    assert torch.equal(caches[1], caches[3])  # v: copied as is
    assert caches[0][:start].abs().sum() == 0 and caches[0][start + T:].abs().sum() == 0  # only its rows written
