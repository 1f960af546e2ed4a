"""A weight's finite check reads the bits (freetoken/models/validate.py): the same verdict and count as torch's
isfinite / isnan on every weight dtype, specials at random places, the largest finite value and subnormals passing."""

from __future__ import annotations

import math

import pytest
import torch

from freetoken.models.config import CheckpointError
from freetoken.models.validate import SAMPLE, check_values


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("special", [math.nan, math.inf, -math.inf, None])
def test_the_bit_check_agrees_with_torch(dtype, special):
    gen = torch.Generator().manual_seed(0)
    t = torch.randn(300, 70, generator=gen).to(dtype)
    t[0, :3] = torch.tensor([torch.finfo(dtype).max, -torch.finfo(dtype).max, torch.finfo(dtype).tiny / 4]).to(dtype)
    if special is not None:
        t.view(-1)[torch.randperm(t.numel(), generator=gen)[:5]] = special
    bad = int((~torch.isfinite(t)).sum())
    if not bad:
        check_values("f", "w", t)
        return
    kind = "NaN" if bool(torch.isnan(t).any()) else "Inf"
    with pytest.raises(CheckpointError, match=rf"^f: tensor 'w' holds {kind} values \({bad} of the {t.numel()} "
                                              r"checked\)$"):
        check_values("f", "w", t)


def test_a_large_tensor_is_checked_on_a_strided_sample():
    t = torch.zeros(4 * SAMPLE, dtype=torch.bfloat16)
    t[4] = math.inf  # on the sample's stride of 4
    t[5] = math.nan  # off it
    with pytest.raises(CheckpointError, match=rf"holds Inf values \(1 of the {SAMPLE} checked\)"):
        check_values("f", "w", t)
