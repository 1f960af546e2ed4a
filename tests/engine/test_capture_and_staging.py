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
    assert linear_decode.reserve_tile_counters(cpu) is linear_decode._tile_counters(cpu)
    assert not linear_decode._tile_counters(cpu).any()


def test_staging_without_cuda_is_the_plain_copy():
    staging = LaneStaging(pin=False)
    x = torch.randn(3, 8)
    h = staging.to_host("x", x, torch.bfloat16)
    assert torch.equal(h, x.to("cpu", torch.bfloat16)) and h.dtype == torch.bfloat16
    assert staging.ready(torch.device("cpu")) is None
    y = torch.randn(3, 8)
    assert torch.equal(staging.to_device("y", y, torch.device("cpu"), torch.bfloat16), y.to(torch.bfloat16))
    assert not staging._bufs  # nothing pinned without CUDA
