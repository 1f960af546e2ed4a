"""moe_union (one launch: a call's distinct experts in first-use order with token counts, and the recorder's write)
against its torch reference and the engine's torch form (engine/device_moe.call_union), interpreted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.engine.device_moe import call_union
from freetoken.kernels.moe_union import MAX_PICKS, moe_union, moe_union_ref


@pytest.mark.parametrize("T, K, E", [(1, 2, 8), (1, 8, 128), (3, 2, 4), (5, 3, 6), (8, 8, 16), (4, 4, 64)])
def test_moe_union_equals_reference(T, K, E):
    g = np.random.default_rng(T * 100 + K)
    ids = torch.from_numpy(np.stack([g.choice(E, K, replace=False) for _ in range(T)])).to(torch.int32)  # [T, K]
    weights = torch.from_numpy(g.random((T, K), dtype=np.float32))
    buf, buf_ref = torch.zeros(2, T, 3, K), torch.zeros(2, T, 3, K)  # a recorder buffer [2, T, L, K], layer 1
    got = moe_union(ids, E, weights, buf[:, :, 1])
    want = moe_union_ref(ids, E, weights, buf_ref[:, :, 1])
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
    assert torch.equal(buf, buf_ref) and buf[0, :, 1].tolist() == ids.float().tolist()
    assert torch.equal(moe_union(ids, E)[0], want[0])  # without recording
    torch.testing.assert_close(call_union(ids, E), want, rtol=0, atol=0)  # the engine's form for larger calls


def test_moe_union_rejects_a_call_too_large():
    ids = torch.zeros((MAX_PICKS + 1, 1), dtype=torch.int32)
    with pytest.raises(ValueError, match="use call_union"):
        moe_union(ids, 8)
