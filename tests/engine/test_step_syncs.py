"""The decode step without a sync of its own: the recorder's device read is copied back without a wait and read
when the next forward ends (free: the token read between them waited) or when asked for (a wait, counted as a
sync); the step clock adds an unsettled CUDA step's event interval once a later read has passed it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.engine.engine import RunStats
from freetoken.engine.launch_count import LaunchCounter
from freetoken.engine.recorder import TraceRecorder
from freetoken.engine.step_clock import StepClock

L, K, E = 2, 2, 8


def device_forward(rec: TraceRecorder, ids: np.ndarray, gates: np.ndarray) -> None:
    """One forward whose MoE layers wrote their routing into the recorder's device buffer, as device_moe does."""
    T = ids.shape[0]
    rec.begin(list(range(T)), 1, 0, 0)
    for layer in range(L):
        view = rec.layer_view(layer, T, torch.device("cpu"))  # [2, T, K]
        view[0] = torch.from_numpy(ids[:, layer].astype(np.float32))
        view[1] = torch.from_numpy(gates[:, layer])


def test_the_device_read_lands_at_the_next_end_or_when_asked_and_only_the_ask_is_a_sync():
    rng = np.random.default_rng(0)
    rec = TraceRecorder(L, K, E, "toy")
    picks = lambda: np.stack([rng.permutation(E)[:K] for _ in range(L)])[None]  # noqa: E731  [1, L, K], distinct
    routes = [(picks(), rng.random((1, L, K)).astype(np.float32)) for _ in range(3)]
    counter = LaunchCounter("cpu")
    device_forward(rec, *routes[0])
    with counter.section("step"):
        assert rec.end()
    assert (rec._experts[0] == -1).all()  # copied back, not read yet
    device_forward(rec, *routes[1])
    with counter.section("step"):
        rec.end()  # reads the first forward's copy: no wait
    assert counter.syncs == {} and counter.copies == 2
    np.testing.assert_array_equal(rec._experts[0], routes[0][0])
    with counter.section("sample"):
        last = rec.last_experts  # the second forward's copy, asked for at once: a wait
    np.testing.assert_array_equal(last, routes[1][0])
    assert counter.syncs == {"sample:wait": 1}
    device_forward(rec, *routes[2])
    rec.end()
    trace = rec.trace()  # reads the last copy
    np.testing.assert_array_equal(trace.experts, np.concatenate([r[0] for r in routes]))
    np.testing.assert_allclose(trace.gates, np.concatenate([r[1] for r in routes]), atol=1e-3)


def test_a_device_forward_missing_a_layer_fails_when_its_copy_is_read():
    rec = TraceRecorder(L, K, E, "toy")
    rec.begin([0], 1, 0, 0)
    rec.layer_view(0, 1, torch.device("cpu"))[0] = 1.0  # layer 1 never routed: its ids stay -1
    rec.device_buffer(1, torch.device("cpu"))[0, :, 1] = -1.0
    rec.end()
    with pytest.raises(RuntimeError, match="a forward ended before every MoE layer routed"):
        rec.settle()


class FakeEvent:
    """A CUDA event on a fake clock: record() stamps the clock's time (ms)."""
    now = 0.0

    def __init__(self, enable_timing: bool = False):
        self.at = None

    def record(self):
        self.at = FakeEvent.now

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return other.at - self.at


def test_unsettled_cuda_steps_add_their_event_intervals_once_folded(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    clock, stats = StepClock(torch.device("cpu")), RunStats()
    clock.cuda = True  # (the CUDA branch, on the fake events)
    for start, stop in ((0.0, 7.5), (10.0, 12.0)):
        FakeEvent.now = start
        clock.begin(stats)  # folds the step before
        FakeEvent.now = stop
        clock.end(stats, 1, settled=False)
    assert stats.decode_tokens == 2 and stats.decode_s == pytest.approx(7.5e-3)  # the second is still open
    clock.fold(stats)
    assert stats.decode_s == pytest.approx(9.5e-3)
    clock.begin(stats)
    clock.end(stats, 3, settled=True)  # a settled step: the wall clock
    assert stats.decode_tokens == 5 and 9.5e-3 <= stats.decode_s < 1.0
