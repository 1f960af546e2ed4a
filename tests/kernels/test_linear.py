"""linear kernel vs its reference; the reference vs torch.nn.functional.linear."""

from __future__ import annotations

import sys

import pytest
import torch

from freetoken.kernels import linear, linear_ref
from freetoken.kernels.linear import MIN_N_TILES, TILE_CONFIGS, tile_config
from tests.kernels.tolerances import assert_close


# T = 1 and 7 take the decode tile row, 40 the middle one, 70 the large one (see TILE_CONFIGS);
# 140 x 300: a 2 x 3 grid of 128-tiles through the grouped program order
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("T,D_in,D_out", [(1, 96, 130), (7, 40, 50), (40, 72, 33), (70, 130, 20), (140, 16, 300)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_kernel_matches_reference(dtype, T, D_in, D_out, with_bias):
    g = torch.Generator().manual_seed(T + D_in + D_out)
    x = torch.randn(T, D_in, generator=g).to(dtype)
    w = (torch.randn(D_out, D_in, generator=g) / D_in**0.5).to(dtype)
    bias = torch.randn(D_out, generator=g).to(dtype) if with_bias else None
    assert_close(linear(x, w, bias), linear_ref(x, w, bias))


def test_every_tile_row_is_exercised():
    rows = [next(i for i, c in enumerate(TILE_CONFIGS) if T <= c[0]) for T in (1, 7, 40, 70)]
    assert sorted(set(rows)) == list(range(len(TILE_CONFIGS)))
    assert tile_config(1, 130)[1] == 32 and tile_config(1, 64 * MIN_N_TILES + 10)[1] == 64


def test_decode_with_wide_output_takes_full_width_tiles(monkeypatch):
    """The unhalved 64-wide decode tile (lm_head-like widths), reached here by lowering the tile-count threshold."""
    monkeypatch.setattr(sys.modules["freetoken.kernels.linear"], "MIN_N_TILES", 2)  # the package's `linear` is the function
    assert tile_config(1, 200)[1] == 64
    g = torch.Generator().manual_seed(8)
    x, w = torch.randn(1, 48, generator=g), torch.randn(200, 48, generator=g)
    assert_close(linear(x, w), linear_ref(x, w))


def test_strided_rows():
    buf = torch.randn(5, 64)
    x = buf[:, :40]  # row stride 64
    w = torch.randn(24, 40)
    assert_close(linear(x, w), linear_ref(x.contiguous(), w))


def test_reference_matches_torch():
    g = torch.Generator().manual_seed(7)
    x, w, b = torch.randn(3, 16, generator=g), torch.randn(8, 16, generator=g), torch.randn(8, generator=g)
    torch.testing.assert_close(linear_ref(x, w, b), torch.nn.functional.linear(x, w, b), rtol=1e-6, atol=1e-6)


def test_shape_mismatch_is_named():
    with pytest.raises(ValueError, match="w: shape"):
        linear(torch.randn(2, 8), torch.randn(4, 9))
