"""A new policy is one file (tests/toy_policy.py, outside the package) and its registry line: it then runs compiled,
equal to its reference Plan by Plan over every split and capacity, in the simulator and through plan() alike."""

from __future__ import annotations

import pytest

from freetoken.placement import POLICIES, CompiledPolicy, is_compiled, make_policy
from tests.test_compiled_policies import SPLITS, check, synthetic
from tests.toy_policy import FIFO


@pytest.fixture
def fifo(monkeypatch):
    monkeypatch.setitem(POLICIES, "fifo", FIFO)  # the registry line
    return "fifo"


def test_the_toy_policy_runs_compiled_and_equals_its_reference(fifo):
    assert is_compiled(fifo) and isinstance(make_policy(fifo, 4, 2, 4), CompiledPolicy)
    assert type(make_policy(fifo, 4, 2, 4, reference=True)) is FIFO
    assert check(synthetic(1), 5, fifo, {}, list(SPLITS)) > 0


def test_the_toy_policy_is_not_lru(fifo):
    """FIFO and LRU differ on this trace (the check above is not LRU's by accident)."""
    from freetoken.sim.calls import trace_stream
    from freetoken.sim.replay import replay_stream

    trace = synthetic(1)
    stream = trace_stream(trace, 5)
    misses = {name: replay_stream(stream, make_policy(name, 12, trace.num_layers, trace.num_experts), SPLITS["offload"])
              .total.misses for name in (fifo, "lru")}
    assert misses[fifo] > misses["lru"]  # a hit does not save a key from FIFO


def test_a_subclass_of_a_compiled_policy_runs_its_own_reference(fifo, monkeypatch):
    """A subclass changes the decision: it does not inherit its parent's compiled half."""
    class NewestFirst(FIFO):
        def victim(self, key, now, protected):
            return next((k for k in reversed(self.queue) if k not in protected), None)

    monkeypatch.setitem(POLICIES, "newest", NewestFirst)
    assert not is_compiled("newest") and type(make_policy("newest", 4, 2, 4)) is NewestFirst
