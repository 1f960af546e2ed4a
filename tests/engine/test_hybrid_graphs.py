"""The hybrid split under decode graphs (engine/decode_graphs.py LaneParts): each MoE block replays as a front graph
(router .. decision, staged to the host), the host's lane, a back graph (gather, FFNs) and an add graph, here
through a CPU stand-in for capture. It must equal the eager engine: the same tokens, trace, counters and Plans, and
count 2-3 launches and one host wait per MoE layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.engine import CacheConfig, Engine, SamplingParams
from freetoken.engine.decode_graphs import LaneParts, MoEGraphs
from freetoken.placement import Split
from freetoken.placement.call import Plan

CHUNK = 4
STEPS = 6
PROMPT = [3, 17, 5, 9, 42, 7, 1, 2, 8, 10]
HYBRID = Split("hybrid", bp=2.0, bh=1.0)


@pytest.fixture(scope="module")
def ckpt(checkpoints):
    """conftest's Qwen3-MoE checkpoint: 2 layers, 8 experts, top-2."""
    return checkpoints["qwen3_moe"]


def _copy_into(dst, src) -> None:
    """A replay's outputs land in the captured ones (tensors, and tuples / dataclasses of them)."""
    if isinstance(dst, torch.Tensor):
        if dst is not src:
            dst.copy_(src)
    elif isinstance(dst, tuple):
        for d, s in zip(dst, src):
            _copy_into(d, s)
    elif dst is not None and hasattr(dst, "__slots__"):
        for name in dst.__slots__:
            _copy_into(getattr(dst, name), getattr(src, name))


class StandInGraph:
    """A CPU stand-in for a captured part: replay runs it and writes into the captured outputs, undoing what only
    its host side does (counters, the recorder's bookkeeping), as a real replay never runs that."""

    def __init__(self, engine, part, out, on_replay=None):
        self.engine, self.part, self.out, self.on_replay = engine, part, out, on_replay

    def replay(self):
        e = self.engine
        counts, marked = e.host.to_dict(), e.recorder._on_device
        _copy_into(self.out, self.part())
        for name, value in counts.items():
            setattr(e.host, name, value)
        e.recorder._on_device = marked
        if self.on_replay is not None:
            self.on_replay(self.out)


def stand_in_capture(engine, plans: list):
    """MoEGraphs._capture_part on the CPU: capturing runs nothing on a GPU, so here the part runs once for its
    outputs with the decision's state put back after it; front replays log their decision as a Plan."""
    dm = engine.cache.device_moe

    def capture_part(part):
        state = [t.clone() for t in dm.placement.state]
        totals, counts = dm.totals.clone(), engine.host.to_dict()
        out = part()
        for t, saved in zip(dm.placement.state, state):
            t.copy_(saved)
        dm.totals.copy_(totals)
        copies = engine.host.copies - counts["copies"]
        for name, value in counts.items():
            setattr(engine.host, name, value)
        log = None
        if hasattr(out, "kind"):  # a front: its decision, read back as the eager path keeps it
            log = lambda f: plans.append((f.experts.tolist(), f.kind.tolist(), f.slot.tolist(),  # noqa: E731
                                          f.evict[:int(f.counts[1])].tolist()))
        return StandInGraph(engine, part, out, log), out, copies

    return capture_part


def graph_engine(ckpt, plans: list) -> Engine:
    engine = Engine(ckpt, CacheConfig("lru", capacity=0, split=HYBRID), kernels="reference", device="cpu",
                    prefill_chunk=CHUNK, placement="device")
    dm = engine.cache.device_moe
    assert dm.cpu_lane and engine.graphs is None  # (no CUDA: eager)
    parts = LaneParts(lambda layer, h: engine._moe_device(layer, h, front=True), dm.lane, dm.back, dm.upload_buffer,
                      dm.finish)
    graphs = MoEGraphs(engine._moe_device, torch.device("cpu"), engine.host, capture=False, parts=parts)
    graphs.capture = True  # capture = the stand-in above (no CUDA here)
    graphs._capture_part = stand_in_capture(engine, plans)
    engine.graphs = graphs
    return engine


def test_hybrid_parts_replay_as_the_eager_engine_runs(ckpt):
    # no slots: each decode call's two misses split one fetched (through staging), one on the CPU lane, so every
    # replay runs all three parts
    cache = CacheConfig("lru", capacity=0, split=HYBRID)
    eager = Engine(ckpt, cache, kernels="reference", device="cpu", prefill_chunk=CHUNK, placement="device",
                   keep_plans=True)
    eager_out = list(eager.generate(PROMPT, SamplingParams(greedy=True), max_tokens=STEPS, stop_token_ids=[]))
    plans: list = []
    engine = graph_engine(ckpt, plans)
    kv = engine.new_kv(32)
    out = list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=STEPS, stop_token_ids=[], kv=kv))
    L = ckpt.config.num_layers
    assert out == eager_out and engine.graphs.replays == L * (STEPS - 2)  # the first decode step captures
    np.testing.assert_array_equal(engine.trace().experts, eager.trace().experts)
    np.testing.assert_array_equal(engine.trace().gates, eager.trace().gates)
    assert engine.counters == eager.counters and engine.counters.cpu > 0
    # Plan by Plan: the replayed fronts' decisions against the eager engine's last (STEPS - 2) decode steps
    replayed = [Plan.from_kinds(i % L, e, k, s, v, num_experts=ckpt.config.num_experts)
                for i, (e, k, s, v) in enumerate(plans)]
    assert replayed == eager.cache.plans[-len(replayed):] and len(replayed) == L * (STEPS - 2)
    assert any(p.cpu for p in replayed) and any(p.fetch for p in replayed)


def test_a_replayed_hybrid_step_counts_its_parts(ckpt):
    engine = graph_engine(ckpt, [])
    kv = engine.new_kv(32)
    out = list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=STEPS, stop_token_ids=[], kv=kv))
    before = engine.host.to_dict()
    engine.decode(out[-1], kv)
    step = {k: v - before[k] for k, v in engine.host.to_dict().items()}
    # hand-derived, per layer: attention 6 launches (as the offload graph's test) + front, back and add graphs;
    # the final norm and lm_head 2. One sync per layer (the lane's wait for the staged decision, x and weights);
    # copies per layer: those three down and the lane's result up; the recorder's one copy per step
    L = ckpt.config.num_layers
    assert step == {"launches": L * (6 + 3) + 2, "syncs": L, "copies": L * 4 + 1}
    # sim = live: the cost model's counts of the same step's calls (its last L), from the recorded trace
    from freetoken.sim.overhead import freetoken_work
    from freetoken.sim.run import SimConfig, simulate

    from .test_host_counters import shape_of

    log = simulate(engine.trace(), SimConfig("lru", HYBRID, capacity=0, prefill_chunk=CHUNK)).log
    work = freetoken_work(log, L, shape_of(engine), pipeline=False, cuda_graphs=False, record=True,
                          device_placement=True, cpu_split=True, moe_graphs=True)
    last = {"launches": work.launches, "syncs": work.syncs, "copies": work.copies}
    assert {k: int(v[-L:].sum()) for k, v in last.items()} == step


def test_hybrid_decode_line_names_the_parts(ckpt):
    from freetoken.engine.decode_graphs import decode_line

    engine = graph_engine(ckpt, [])
    line = decode_line(engine.cache, engine.graphs, eager=False)
    assert line.startswith("decode: eager (CUDA graphs need CUDA)")  # the reason comes first without CUDA
    engine.graphs.device = torch.device("cuda")  # what a CUDA engine would print (nothing runs here)
    line = decode_line(engine.cache, engine.graphs, eager=False)
    assert "in parts around the CPU lane" in line and "1, 2, 4, 8" in line


def test_a_failed_capture_leaves_decode_eager_and_right(ckpt, caplog):
    """A part that cannot be captured (here: the stand-in raises, as a driver would refuse an op) costs nothing but
    the graphs: the step had run eagerly already, decode goes on eagerly, one warning says why."""
    cache = CacheConfig("lru", capacity=0, split=HYBRID)
    eager = Engine(ckpt, cache, kernels="reference", device="cpu", prefill_chunk=CHUNK, placement="device")
    want = list(eager.generate(PROMPT, SamplingParams(greedy=True), max_tokens=STEPS, stop_token_ids=[]))
    engine = graph_engine(ckpt, [])

    def refuse(part):
        raise RuntimeError("operation not permitted when stream is capturing")

    engine.graphs._capture_part = refuse
    with caplog.at_level("WARNING", logger="freetoken.engine"):
        got = list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=STEPS, stop_token_ids=[]))
    assert got == want and engine.graphs.replays == 0 and engine.counters == eager.counters
    assert engine.graphs.blocker.startswith("graph capture failed: RuntimeError")
    assert sum("CUDA graph capture failed" in r.message for r in caplog.records) == 1
