"""The prefill double buffer: layer l+1's non-resident experts are copied into their staging set while layer l's
call finishes (before layer l+1's router), layer l+1 copies nothing more, and the output is the reference's."""

from __future__ import annotations

import numpy as np
import torch

from freetoken.engine import CacheConfig, Engine, SamplingParams
from freetoken.engine.executor import LiveExecutor
from freetoken.engine.kernelset import kernel_set
from freetoken.engine.slots import ExpertStore, SlotPool
from freetoken.placement import PREFILL, Plan, Split
from tests.engine.test_lane_order import moe_reference

E, D, I = 4, 16, 8


class LoadLog(SlotPool):
    def __init__(self, *args):
        super().__init__(*args)
        self.log: list[tuple[int, int, int]] = []  # (row, layer, expert)

    def load(self, slot, store, layer, expert):
        self.log.append((slot, layer, expert))
        super().load(slot, store, layer, expert)


def test_next_layer_streams_during_this_call():
    g = torch.Generator().manual_seed(0)
    store = ExpertStore([(torch.randn(E, 2 * I, D, generator=g) / 4, torch.randn(E, D, I, generator=g) / 4)
                         for _ in range(2)])
    pool = LoadLog(2, 2 * E, store, "cpu")  # 2 slots, two staging sets of E rows
    ex = LiveExecutor(store, pool, kernel_set("reference"), torch.device("cpu"), stream_prefill=True)
    assert ex.stream_prefill
    pool.load(0, store, 0, 1)  # layer 0's expert 1 resident in slot 0
    pool.log.clear()
    ids = np.array([[0, 1], [2, 1]])  # [T, K]
    x, weights = torch.randn(2, D, generator=g), torch.rand(2, 2, generator=g)
    # layer 0: expert 1 resident in slot 0, 0 and 2 staged; layer 1: nothing resident, 3 streamed beyond the call's
    y0 = ex.run(Plan(0, [1], [0], [0, 2], [-1, -1], []), x, weights, ids, PREFILL, stream_next=[0, 1, 2, 3])
    staged0 = [(2 + 0 * E + 0, 0, 0), (2 + 0 * E + 2, 0, 2)]  # set 0: row capacity + expert
    streamed1 = [(2 + 1 * E + e, 1, e) for e in range(4)]  # set 1
    assert pool.log == staged0 + streamed1  # layer 1's copies issued within layer 0's call
    y1 = ex.run(Plan(1, [], [], [0, 1, 2], [-1, -1, -1], []), x, weights, ids, PREFILL)
    assert pool.log == staged0 + streamed1  # nothing copied again
    torch.testing.assert_close(y0, moe_reference(store, x, weights, ids, 0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y1, moe_reference(store, x, weights, ids, 1), rtol=1e-5, atol=1e-5)


def test_engine_prefill_stream_keeps_the_tokens(tmp_path):
    from freetoken.models.checkpoint import load_checkpoint

    from .conftest import build_checkpoint

    ckpt = load_checkpoint(build_checkpoint("qwen3_moe", tmp_path / "m"))
    E = ckpt.config.num_experts
    cache = CacheConfig("lru", capacity=5, split=Split("offload", admit_prefill=False), staging=2 * E)
    outs = {}
    for stream in (False, True):
        engine = Engine(ckpt, cache, kernels="reference", device="cpu", prefill_chunk=4)
        engine.cache.executor.stream_prefill = stream
        outs[stream] = (list(engine.generate([3, 17, 5, 9, 42, 7, 1, 2], SamplingParams(greedy=True), max_tokens=4,
                                             stop_token_ids=[])), engine.counters, engine.host.copies)
    assert outs[True][0] == outs[False][0] and outs[True][1] == outs[False][1]
    assert outs[True][2] > outs[False][2]  # the double buffer moves every non-resident expert of the next layer
