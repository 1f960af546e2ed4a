"""The compiled s3fifo / layer_sweep / lookahead / hinted_sweep fail on bad input with the reference's one-line
errors, and a live hint object keeps the interpreted class (it is asked per call, in Python)."""

from __future__ import annotations

import numpy as np
import pytest

from freetoken.placement import BUILTIN, Call, CompiledPolicy, KeyStream, Split, is_compiled, make_policy
from freetoken.placement.policies.sweep.lookahead import Lookahead

FUTURE = KeyStream(np.array([0, 1, 5, 6]), np.array([0, 2, 4]))  # layer 0: experts 0, 1; layer 1: experts 1, 2


def test_every_builtin_policy_is_compiled():
    assert all(is_compiled(name) for name in BUILTIN)
    for name in ("s3fifo", "layer_sweep"):
        assert isinstance(make_policy(name, 2, 2, 4), CompiledPolicy)
    for name in ("lookahead", "hinted_sweep"):
        assert isinstance(make_policy(name, 2, 2, 4, future=FUTURE), CompiledPolicy)


@pytest.mark.parametrize("name, options, message", [
    ("s3fifo", {"small": 1.5}, "s3fifo small must lie in"),
    ("layer_sweep", {"decay": 1.0}, "layer_sweep decay must lie in"),
    ("layer_sweep", {"scan": 0}, "layer_sweep scan must be"),
    ("layer_sweep", {"prior": np.ones((3, 4))}, "layer_sweep prior must be"),
    ("lookahead", {}, "needs a router hint"),
    ("lookahead", {"future": FUTURE, "accuracy": 1.5}, "lookahead accuracy must lie in"),
    ("lookahead", {"future": FUTURE, "depth": 0}, "lookahead depth must be"),
    ("lookahead", {"future": KeyStream(np.array([0, 9]), np.array([0, 2]))}, "must lie in"),
    ("hinted_sweep", {}, "needs a router hint"),
    ("hinted_sweep", {"future": FUTURE, "accuracy": [0.5, 0.5]}, "hinted_sweep accuracy must be"),
    ("hinted_sweep", {"future": FUTURE, "depth": 0}, "hinted_sweep depth must be"),
])
def test_bad_options_one_line(name, options, message):
    with pytest.raises(ValueError, match=message):
        make_policy(name, 2, 2, 4, **options)


@pytest.mark.parametrize("name", ["lookahead", "hinted_sweep"])
def test_calls_out_of_the_futures_order(name):
    pol = make_policy(name, 2, 2, 4, future=FUTURE)
    pol.plan(Call(0, [0, 1], [1, 1]), Split())
    with pytest.raises(ValueError, match="differs from the future"):
        pol.plan(Call(0, [0, 1], [1, 1]), Split())  # the future says layer 1 comes next


def test_live_hint_keeps_the_interpreted_class():
    class Hint:
        def upcoming(self, call):
            return []

    pol = make_policy("lookahead", 2, 2, 4, hint=Hint())
    assert type(pol) is Lookahead
