"""Router hints for lookahead / hinted_sweep: live from the engine's early router, or replayed from a trace.

The live hint (the mixtral-offloading / pre-gated MoE idea): while MoE layer l's call is planned, the engine runs
MoE layer l + 1's router, after l + 1's own pre-MoE RMSNorm, on the residual stream that layer l's MoE reads (the
hidden state after layer l's attention). The top-k it picks per token, merged over the call's tokens as a call's
experts are, are the predicted keys of the next call of the sweep. Layer 0 is never predicted (the last layer of
a sweep would need the next token, not sampled yet). Depth 1: one layer ahead.

A policy takes `hint=` an object with `upcoming(call) -> keys`:
- `LiveRouterHint`: what the engine fills in before each call's plan (CacheConfig option hint="router").
- `RecordedHint(trace, chunk)`: the predictions a live run recorded (the trace's `hint` field), call by call:
  a replay of that run makes its Plans exactly.
- `MeasuredHint(trace, chunk, seed)`: a synthetic hint at the per-layer accuracy a trace measured
  (`freetoken.trace.stats.hint_accuracy`): each true key of layer l kept with probability a_l, else a uniformly
  drawn other expert of the layer (lookahead's noise model), seeded.
In the simulator (`ft sim`), the option hint="recorded" or hint="measured" builds them from the replayed trace
(replay_hint). hinted_sweep with measure=True weighs any of these hints by the accuracy it has shown so far in the
run, which the engine can measure as well (sim = live), instead of an assumed one.
"""

from __future__ import annotations

import numpy as np

from freetoken.placement.call import Call
from freetoken.placement.callstream import call_stream, make_call
from freetoken.placement.policies.sweep.lookahead import noisy_keys
from freetoken.placement.stream import KeyStream

ROUTER = "router"  # the CacheConfig option value hint="router": the engine's early router, live
REPLAYED = ("recorded", "measured")  # hint= values the simulator builds from the replayed trace (replay_hint)


def predicted_keys(layer: int, ids: np.ndarray, num_experts: int) -> list[int]:
    """ids [T, K] predicted for MoE layer `layer` -> its keys, merged over tokens as make_call merges a call."""
    return [layer * num_experts + e for e in make_call(layer, ids, 0).experts]


class LiveRouterHint:
    """The engine's hint: set(layer + 1, keys) before layer's call is planned; upcoming(call) hands them over."""

    def __init__(self):
        self._layer, self._keys = -1, []

    def set(self, next_layer: int, keys: list[int]) -> None:
        self._layer, self._keys = next_layer, keys

    def upcoming(self, call: Call) -> list[int]:
        if self._layer != call.layer + 1:
            raise ValueError(f"router hint: call of layer {call.layer} planned, but the engine's hint is for "
                             f"layer {self._layer}")
        keys, self._layer, self._keys = self._keys, -1, []
        return keys


class StreamHint:
    """Predictions indexed by call: call c is told the predicted keys of call c + 1 when that call is the next
    layer of the same sweep (the same tokens one layer on), nothing otherwise. Calls must come in stream order."""

    def __init__(self, truth: KeyStream, predicted: KeyStream, num_experts: int):
        if truth.num_calls != predicted.num_calls:
            raise ValueError(f"router hint: {predicted.num_calls} predicted calls for {truth.num_calls} calls")
        E = num_experts
        self._layer = (truth.keys[truth.offsets[:-1]] // E).tolist() if truth.num_calls else []  # [C]
        self._size = np.diff(truth.offsets).tolist()  # [C]
        self._keys, self._offsets = predicted.keys.tolist(), predicted.offsets.tolist()
        self._call = 0

    def upcoming(self, call: Call) -> list[int]:
        c, layer = self._call, self._layer
        if c >= len(layer) or layer[c] != call.layer or len(call.experts) != self._size[c]:
            raise ValueError(f"router hint: call {c} (layer {call.layer}) does not match the trace it was given")
        self._call = c + 1
        if c + 1 >= len(layer) or layer[c + 1] != call.layer + 1:  # the sweep ends: next token unknown
            return []
        return list(dict.fromkeys(self._keys[self._offsets[c + 1]:self._offsets[c + 2]]))


def _stream(trace, experts: np.ndarray, prefill_chunk: int) -> KeyStream:
    """experts [T, L, K] (the trace's own or predicted ones) as the keys of the trace's calls: the simulator's call
    stream, or for a drafted run (draft field) one call per forward span, verify calls of d + 1 tokens included."""
    if trace.draft is None:
        return call_stream(experts, trace.num_experts, trace.request, trace.turn, trace.phase,
                           prefill_chunk).key_stream()
    from freetoken.trace.stats import forward_spans

    keys: list[int] = []
    offsets = [0]
    for lo, hi in forward_spans(trace, prefill_chunk):
        for layer in range(trace.num_layers):
            keys += predicted_keys(layer, experts[lo:hi, layer], trace.num_experts)
            offsets.append(len(keys))
    return KeyStream(np.asarray(keys, np.int64), np.asarray(offsets, np.int64))


def _truth(trace, prefill_chunk: int) -> KeyStream:
    return _stream(trace, trace.experts, prefill_chunk)


class RecordedHint(StreamHint):
    """The live run's own predictions (trace.hint, -1 on layer 0), replayed call by call."""

    def __init__(self, trace, prefill_chunk: int):
        if trace.hint is None:
            raise ValueError("router hint: the trace holds no recorded hint (record it with the engine's router "
                             "hint on)")
        if (trace.hint[:, 1:] < 0).any():
            raise ValueError("router hint: the trace's hint misses some layers >= 1 (recorded with the hint off "
                             "for part of the run)")
        predicted = trace.hint.copy()
        predicted[:, 0] = trace.experts[:, 0]  # layer 0 is never predicted: a placeholder the calls never read
        super().__init__(_truth(trace, prefill_chunk), _stream(trace, predicted, prefill_chunk), trace.num_experts)


class MeasuredHint(StreamHint):
    """A synthetic hint at per-layer accuracies `accuracy` [L] (default: the trace's measured ones): each true key
    of layer l, or with probability 1 - a_l a uniformly drawn other expert of l (seeded)."""

    def __init__(self, trace, prefill_chunk: int, accuracy: np.ndarray | None = None, seed: int = 0):
        from freetoken.trace.stats import hint_accuracy

        acc = hint_accuracy(trace) if accuracy is None else np.asarray(accuracy, np.float64)
        if acc.shape != (trace.num_layers,):
            raise ValueError(f"router hint: {acc.shape} accuracies for {trace.num_layers} layers")
        acc = np.where(np.isnan(acc), 1.0, acc)  # a layer never predicted: never read either
        if not ((0 <= acc) & (acc <= 1)).all():
            raise ValueError(f"router hint: accuracies must lie in [0, 1], got {acc.tolist()}")
        E = trace.num_experts
        if E < 2 and (acc < 1).any():
            raise ValueError("router hint: accuracy < 1 needs at least 2 experts per layer to draw a wrong one from")
        truth = _truth(trace, prefill_chunk)
        self.accuracy = acc
        keys = noisy_keys(truth.keys, E, acc[truth.keys // E], np.random.default_rng(seed))  # [N]
        super().__init__(truth, KeyStream(keys, truth.offsets), E)


def replay_hint(kind: str, trace, prefill_chunk: int, seed: int = 0):
    """The simulator's hint for the option hint=kind: "recorded" (RecordedHint) or "measured" (MeasuredHint at the
    trace's measured accuracy, seeded); the live router needs the engine."""
    if kind == ROUTER:
        raise ValueError(f"options: hint={ROUTER!r} is the engine's early router, live only; a replay takes "
                         f"hint=recorded (the predictions a live run recorded) or hint=measured")
    if kind not in REPLAYED:
        raise ValueError(f"options: hint must be one of {', '.join(REPLAYED)} in a replay, got {kind!r}")
    if trace.hint is None:  # (MeasuredHint alone would take an unmeasured layer as never read: a perfect hint)
        raise ValueError(f"options: hint={kind} needs a trace with a recorded hint (record it with the engine's "
                         f"router hint on); this one holds none")
    return RecordedHint(trace, prefill_chunk) if kind == "recorded" else MeasuredHint(trace, prefill_chunk, seed=seed)
