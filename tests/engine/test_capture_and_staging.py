"""CUDA-graph capture without torch.cuda.graph's per-capture housekeeping, and the CPU lane's staging buffers: what
can be checked without CUDA. The capture is driven through stand-ins for torch.cuda's stream calls: it reserves the
split-K counters before capture_begin and never synchronizes, empties a cache or collects garbage. The staging's
CPU path is the plain `.to` it replaced, bit for bit."""

from __future__ import annotations

import contextlib
import gc

import torch

from freetoken.engine import graph_capture
from freetoken.engine.lane_staging import LaneStaging
from freetoken.kernels import linear_decode


class _Stream:
    device = torch.device("cpu")

    def __init__(self, log):
        self.log = log

    def wait_stream(self, other):
        self.log.append("wait")


class _Graph:
    def __init__(self, log):
        self.log = log

    def capture_begin(self, pool=None, capture_error_mode="global"):
        self.log.append("begin")

    def capture_end(self):
        self.log.append("end")


def test_capture_reserves_counters_first_and_skips_housekeeping(monkeypatch):
    log = []

    def forbidden(*a, **k):
        raise AssertionError("per-capture housekeeping")

    for name in ("synchronize", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, forbidden)
    monkeypatch.setattr(gc, "collect", forbidden)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream(log))
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(graph_capture, "reserve_tile_counters", lambda device, stream: log.append("reserve"))
    with graph_capture.capture(_Graph(log), _Stream(log)):
        log.append("work")
    assert log == ["reserve", "wait", "begin", "work", "end", "wait"]


def test_reserved_counters_are_the_ones_a_launch_uses():
    cpu = torch.device("cpu")
    assert linear_decode.reserve_tile_counters(cpu) is linear_decode.tile_counters(cpu)
    assert not linear_decode.tile_counters(cpu).any()


def test_staging_without_cuda_copies_into_kept_decode_buffers():
    from freetoken.engine.lane_staging import STATIC_ROWS

    staging = LaneStaging(pin=False)
    x = torch.randn(3, 8)
    h = staging.to_host("x", x, torch.bfloat16)
    assert torch.equal(h, x.to("cpu", torch.bfloat16)) and h.dtype == torch.bfloat16 and not h.is_pinned()
    x2 = torch.randn(3, 8)
    assert staging.to_host("x", x2, torch.bfloat16) is h and torch.equal(h, x2.to(torch.bfloat16))  # the same one
    assert staging.ready(torch.device("cpu")) is None
    y = torch.randn(3, 8)
    assert torch.equal(staging.to_device("y", y, torch.device("cpu"), torch.bfloat16), y.to(torch.bfloat16))
    assert staging.put("y", y) is staging.put("y", torch.randn(3, 8))  # a decode step's: kept (a graph reads it)
    big = torch.randn(STATIC_ROWS + 1, 8)  # a prefill chunk's: made per call, h itself where nothing is pinned
    assert staging.put("y", big) is big and staging.to_host("x", big, torch.float32) is not \
        staging.to_host("x", big, torch.float32)
    assert sorted(name for name, _, _ in staging._bufs) == ["x", "y"]
