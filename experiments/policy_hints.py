"""The policy study's additions for router hints: decode time from the cost model, hinted_sweep's sensitivity
to the early router's accuracy and depth, and an offline probe of how far ahead a policy must see to near Belady.

Time: the replay log of a trace whose model has a card (the Mixtral logs), charged by sim.cost on one hardware
profile, token by token as decode steps (no prefill double buffering): prefetched copies ride the PCIe lane of
the call that issues them, beside that call's compute, as every other copy does in the cost model.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from freetoken.placement import Split
from freetoken.placement.policies.sweep.layer_sweep import FLOOR, POWERS, LayerSweep, power_table
from freetoken.placement.stream import NEVER, KeyStream, next_occurrence
from freetoken.trace import RoutingTrace
from freetoken.sim.run import SimConfig, simulate

HARDWARE = "rtx5090-ryzen"
HINT_FRACTIONS = (0.25, 0.50)
HINT_ACCURACIES = (0.6, 0.8, 0.9, 1.0)  # at distance 1; distance j: accuracy ** j
HINT_DEPTHS = (1, 2, 4)
REST_OF_TOKEN = "rest"  # depth = every later layer of the same token (perfect, eviction only)
WINDOW_TOKENS = (1, 4, 16, 64)  # the offline probe: exact next use known this many sweeps ahead


def replay(trace: RoutingTrace, policy: str, fraction: float, chunk: int, options: dict,
           profile: RoutingTrace | None = None, card: str | None = None,
           scenario: dict | None = None) -> tuple[int, int, int, int, float]:
    """(capacity, misses, prefetched, accesses, seconds of the whole trace on HARDWARE or nan without a card);
    scenario: SimConfig's batch / draft_depth / acceptance (time only for one sequence at a time)."""
    from freetoken.experiments.traces import stream_of

    config = SimConfig(policy, Split("offload"), fraction=fraction, prefill_chunk=chunk, options=options,
                       **(scenario or {}))
    plain = config.batch == 1 and not config.draft_depth
    result = simulate(trace, config, profile=profile, stream=stream_of(trace, chunk) if plain else None)
    t = result.total
    seconds = math.nan if card is None or not plain else decode_seconds(result.log, trace, chunk, card)
    return config.slots_for(trace.num_layers, trace.num_experts), t.misses, t.prefetched, t.accesses, seconds


class WindowedFuture(LayerSweep):
    """Offline probe, not an online policy: Belady within a window of `window` calls (the exact next use of a key
    needed inside it), layer_sweep's expected wait beyond it (every key outside the window ranks as later than every
    key inside). window = 0 is layer_sweep; an unbounded window is Belady with layer_sweep's start."""

    name = "windowed_future"

    def __init__(self, capacity: int, num_layers: int, num_experts: int, future: KeyStream, window: int,
                 decay: float = 0.9, prior=None):
        super().__init__(capacity, num_layers, num_experts, decay=decay, bypass=True, prior=prior)
        nxt = next_occurrence(future.keys)
        call_of = future.call_ids()
        self._next_call = np.where(nxt == NEVER, NEVER, call_of[np.minimum(nxt, len(call_of) - 1)])  # [N]
        self._offsets = future.offsets.tolist()
        first = np.full(num_layers * num_experts, NEVER, np.int64)
        np.minimum.at(first, future.keys, call_of)  # a warm-started key's first use
        self._due = first  # [L * E] next call that uses each key
        self.window, self._call = window, -1
        # numpy mirrors of layer_sweep's per-key rate and stamp (kept in step by _use), for the vectorised victim
        self._p_now = np.asarray(self._p, np.float64)  # [L * E]
        self._stamp_now = np.asarray(self._stamp, np.int64)  # [L * E]
        self._protected = np.zeros(num_layers * num_experts, bool)  # [L * E] scratch

    def begin_call(self, keys: list[int]) -> None:
        super().begin_call(keys)
        self._call += 1
        lo = self._offsets[self._call]
        self._due[keys] = self._next_call[lo:lo + len(keys)]

    def _use(self, key: int) -> None:
        super()._use(key)
        self._p_now[key], self._stamp_now[key] = self._p[key], self._stamp[key]

    def _score(self, key: int) -> float:
        gap = int(self._due[key]) - self._call
        return gap if gap <= self.window else self.window + self.wait(key)

    def victim(self, key: int, now: int, protected: set[int]) -> int | None:
        """The unprotected resident of highest score (ties: lowest key); None when `key` scores higher still."""
        resident = np.fromiter(self.slot_of, np.int64, len(self.slot_of))  # [R]
        mark = self._protected
        guarded = np.fromiter(protected, np.int64, len(protected))
        mark[guarded] = True
        cands = resident[~mark[resident]]
        mark[guarded] = False
        if not cands.size:
            return None
        scores = self._scores(cands)
        top = scores.max()
        best = int(cands[scores == top].min())
        return None if self._score(key) > top else best

    def _scores(self, keys: np.ndarray) -> np.ndarray:
        """[R] _score of each key, in numpy with _score's float operations in its order (so equal to it bit for
        bit: decay ** n from a table of Python's own powers, the rest elementwise IEEE arithmetic)."""
        L = self.num_layers
        layer = keys // self.num_experts  # [R]
        elapsed = np.asarray(self._visits, np.int64)[layer] - self._stamp_now[keys]
        powers = power_table(self.decay)[np.minimum(elapsed, POWERS - 1)]  # [R] (a copy)
        for i in np.flatnonzero(elapsed >= POWERS):  # past the table: Python's pow, as _score's
            powers[i] = self.decay ** int(elapsed[i])
        rate = self._p_now[keys] * powers
        wait = (layer - self._layer - 1) % L + 1 + L * (1.0 / np.maximum(rate, FLOOR) - 1.0)
        gap = self._due[keys] - self._call
        return np.where(gap <= self.window, gap.astype(np.float64), self.window + wait)


def probe(trace: RoutingTrace, window: int, fraction: float, chunk: int, decay: float, prior,
          card: str | None) -> tuple[int, int, int, int, float]:
    """replay()'s tuple for WindowedFuture (not in POLICIES: it is no policy a server could run)."""
    from freetoken.experiments.traces import stream_of
    from freetoken.sim.replay import replay as run

    stream = stream_of(trace, chunk)
    capacity = int(round(fraction * trace.num_keys))
    policy = WindowedFuture(capacity, trace.num_layers, trace.num_experts, stream.key_stream(), window,
                            decay=decay, prior=prior)
    result = run(stream.calls(), policy, Split("offload"))
    t = result.total
    seconds = math.nan if card is None else decode_seconds(result.log, trace, chunk, card)
    return capacity, t.misses, t.prefetched, t.accesses, seconds


def hint_rows(trace: RoutingTrace, fraction: float, chunk: int, decay: float, prior,
              card: str | None) -> list[tuple[str, tuple]]:
    """(label, replay tuple) for every hint variant, then the windowed-future probes."""
    out = [(label, replay(trace, "hinted_sweep", fraction, chunk, {"decay": decay, "prior": prior, **opts},
                          card=card)) for label, opts in variants(trace.num_layers)]
    for w in WINDOW_TOKENS:
        out.append((f"offline: next use known {w} token(s) ahead",
                    probe(trace, w * trace.num_layers, fraction, chunk, decay, prior, card)))
    return out


@functools.cache
def _card_and_hardware(card_name: str):
    """Read once per process: every row of a case charges the same card on the same hardware."""
    from freetoken.sim.hardware import load_hardware
    from freetoken.sim.model_card import load_model_card

    return load_model_card(card_name), load_hardware(HARDWARE)


def decode_seconds(log, trace: RoutingTrace, chunk: int, card_name: str) -> float:
    from freetoken.sim.cost import CostOptions, call_meta, charge

    from freetoken.experiments.traces import memo

    card, hw = _card_and_hardware(card_name)
    meta = memo(trace, ("call_meta", int(chunk)), lambda: call_meta(trace, chunk))
    times = charge(log, meta, card, hw, CostOptions(host="shared", double_buffer=False))
    return float(times.seconds.sum())


def variants(num_layers: int) -> list[tuple[str, dict]]:
    """(label, hinted_sweep options) of the sensitivity sweep, the rest-of-token information probe last."""
    out = [(f"a={a} depth={d}", {"accuracy": a, "depth": d, "min_confidence": 0.9})
           for a in HINT_ACCURACIES for d in HINT_DEPTHS if d < num_layers]
    if num_layers > 1:
        out.append((f"a=1.0 depth={REST_OF_TOKEN} no prefetch",
                    {"accuracy": 1.0, "depth": num_layers - 1, "min_confidence": math.inf}))
    return out
