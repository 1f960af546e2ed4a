"""Compiled layer_sweep, lookahead and hinted_sweep (placement.layer_sweep / lookahead / hinted_sweep): one state,
one driver, the policy chosen by ints[MODE].

Residents sit in an indexed min-heap by (z, key), z = log p - stamp log(decay) as the reference's heap entries (one
live entry per resident; the reference's stale entries never count). The heap does not change during a call: the
call's uses, admissions and evictions touch only its protected keys and its victims, so they are listed and applied
when the next call begins (a key's z is the same then: its rate and stamp change once per call, at its use). The
victim walk therefore reads the heap in (z, key) order without popping it: a small frontier heap holds the keys
whose parents were read (a binary heap's sorted order), so nothing is pushed back afterwards. The walk keeps the
reference's stop rules (its bound, and `scan` unprotected keys) and, as the reference does, what it found for the
call's later evictions; it starts over when the next call begins, or when lookahead's pending keys (protected too)
change. The hints come from the reference's own oracle draws (lookahead.noisy_future,
hinted_sweep.distance_predictions) indexed by call, then the carry's keys of the same calls (placement.carry), so
they equal its hints exactly.
The state layout and the estimate (rates, waits, posteriors) are in sweep_estimate.py. Floating point follows the
reference's operations in order (pow, exp, log are the same libm calls; decay ** d for
d < POWERS is read from a table of those same pow results).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from freetoken.placement.compiled.base import admission_order, is_protected, on_prefetch, observe_call  # noqa: F401
from freetoken.placement.compiled.heap import front_down, front_up, refile, remove_key
from freetoken.placement.compiled.setup import Setup
from freetoken.placement.compiled.sweep_estimate import (
    BYPASS, DEPTH, HEAP_N, HINTED, LAYER, LOG_DECAY, LOOKAHEAD, MIN_CONF, MODE, MODES, MOST_VISITS, NFOUND,
    NFRONT, NPRED, NSCANNED, NTOUCHED, NUM_E, NUM_L, POWERS, REACH, SCAN, STAMP, SWEEP, _FLOOR, _posterior, _powers,
    _sweep_wait, _use, _wait)
from freetoken.placement.carry import LiveCarry, check_carry
from freetoken.placement.layer_sweep import _SLACK


def setup(name: str, capacity: int, num_layers: int, num_experts: int, future=None, accuracy=0.8, depth: int = 1,
          min_confidence: float = 0.9, seed: int = 0, hint=None, decay: float = 0.9, bypass: bool = True,
          prior=None, scan: int = 64, carry=None) -> Setup:
    from freetoken.placement.layer_sweep import LayerSweep

    mode = MODES[name]
    # the reference validates the sweep's options and gives the starting rates and the warm set
    ref = LayerSweep(capacity, num_layers, num_experts, decay=decay, bypass=bypass, prior=prior, scan=scan)
    K = num_layers * num_experts
    acc = np.ones(1)
    predicted = np.zeros((1, 0), np.int64)
    offsets, call_layer = np.zeros(1, np.int64), np.zeros(0, np.int64)
    if mode != SWEEP:
        if mode == HINTED:
            from freetoken.placement.hinted_sweep import accuracies

            acc = np.asarray(accuracies(accuracy, depth), np.float64)
        if hint is not None:
            raise ValueError(f"{name}: a live hint object runs in the interpreted class (make_policy picks it)")
        if future is None:
            raise ValueError(f"{name} needs a router hint (live engine) or the future key stream (simulator) to "
                             f"build a noisy oracle from")
        keys = np.ascontiguousarray(future.keys, np.int64)
        if keys.size and (keys.min() < 0 or keys.max() >= K):
            raise ValueError(f"{name}: the future's keys must lie in [0, {K}) ({num_layers} layers x {num_experts} "
                             f"experts), got [{keys.min()}, {keys.max()}]")
        offsets = np.ascontiguousarray(future.offsets, np.int64)
        call_layer = keys[offsets[:-1]] // num_experts if offsets.size > 1 else np.zeros(0, np.int64)
        if mode == LOOKAHEAD:
            from freetoken.placement.lookahead import noisy_future

            predicted = noisy_future(future, num_experts, accuracy, depth, seed)[None, :]  # one row for every j
        else:
            from freetoken.placement.hinted_sweep import distance_predictions

            predicted = np.stack(distance_predictions(future, num_experts, tuple(acc), seed)) if keys.size else \
                np.zeros((depth, 0), np.int64)
        predicted = np.ascontiguousarray(predicted, np.int64)
    carry_keys, carry_offsets = _carry_arrays(name, carry, call_layer.size)
    warm = sorted(ref.slot_of, key=ref.slot_of.__getitem__)  # slot order
    ints = np.zeros(16, np.int64)
    ints[NFRONT] = -1  # no walk under way
    ints[BYPASS], ints[SCAN], ints[MODE], ints[NUM_L], ints[NUM_E] = bypass, scan, mode, num_layers, num_experts
    ints[DEPTH] = depth
    floats = np.array([decay, math.log(decay), min_confidence], np.float64)
    state = (np.asarray(ref._p, np.float64), np.zeros(K, np.int64), np.zeros(num_layers, np.int64),
             np.zeros(K, np.float64),  # rates, their stamps, visits per layer, z of residents
             np.zeros(capacity + 1, np.int64), np.full(K, -1, np.int64),  # heap of residents, position in it
             np.zeros(capacity + 2, np.int64),  # the walk's frontier: a heap of keys (at most one per key read, + 1)
             ints, floats, offsets, call_layer, predicted, acc,
             np.full(K, -1, np.int64),  # mark == ints[STAMP]: pending (lookahead) or predicted (hinted)
             np.full(num_layers, -1, np.int64), np.zeros(num_layers, np.float64), np.zeros(num_layers, np.float64),
             np.zeros(num_layers, np.int64),  # hinted layers: stamp, accuracy a, chance q, count n
             np.zeros(K, np.int64),  # hinted: the predicted keys, nearest first
             np.zeros(capacity + 1, np.int64), np.zeros(capacity + 1, np.float64),
             np.zeros(capacity + 1, np.float64),  # the walk: unprotected residents found, their bounds and waits
             np.zeros(K, np.int64), np.zeros(K, np.int64),  # keys the call touched (refiled when the next begins)
             _powers(decay, np.empty(POWERS, np.float64)),  # decay ** d
             np.zeros(capacity + 1, np.int64),  # the walk's scan: index of the longest wait in found[:i + 1]
             np.zeros(capacity + 1, np.float64),  # and the least bound in found[:i + 1]
             carry_keys, carry_offsets)  # the keys carried into each call (none: empty), placement.carry
    for k in warm:
        _push(state, k)
    return Setup(state, tuple(warm), prefetches=mode != SWEEP)


def _carry_arrays(name: str, carry, calls: int) -> tuple[np.ndarray, np.ndarray]:
    """(keys [N], offsets [calls + 1]) of the carry (None: nothing carried), checked against the future's calls."""
    if carry is None:
        return np.zeros(0, np.int64), np.zeros(calls + 1, np.int64)
    carry = check_carry(carry, name)
    if isinstance(carry, LiveCarry):
        raise ValueError(f"{name}: a live carry runs in the interpreted class (make_policy picks it)")
    if carry.num_calls != calls:
        raise ValueError(f"{name}: the carry holds {carry.num_calls} calls, the future {calls}")
    return np.ascontiguousarray(carry.keys, np.int64), np.ascontiguousarray(carry.offsets, np.int64)


# the heap of residents, by (z, key)
@nb.njit(cache=True, inline="always")
def _push(p, key):
    """(Re)file `key` under its z now."""
    rate, stamp, z, floats = p[0], p[1], p[3], p[8]
    z[key] = math.log(max(rate[key], _FLOOR)) - stamp[key] * floats[LOG_DECAY]
    refile(p[4], p[5], p[7], HEAP_N, z, z, False, key)


@nb.njit(cache=True, inline="always")
def _touch(p, key):
    """List `key` (used, admitted or evicted in this call) for _settle."""
    listed, ints = p[23], p[7]
    if listed[key] == 0:
        listed[key] = 1
        p[22][ints[NTOUCHED]] = key
        ints[NTOUCHED] += 1


@nb.njit(cache=True, _nrt=False)  # called, not inlined: keeps the driver's compile short
def _settle(p, slot_of):
    """Apply the last call's changes to the heap: its evicted keys leave, its used and admitted keys are refiled
    under their z now (evictions first: the heap never holds more than the capacity)."""
    ints, touched, listed = p[7], p[22], p[23]
    n = ints[NTOUCHED]
    for i in range(n):
        key = touched[i]
        if slot_of[key] < 0:
            remove_key(p[4], p[5], p[7], HEAP_N, p[3], p[3], False, key)
    for i in range(n):
        key = touched[i]
        listed[key] = 0
        if slot_of[key] >= 0:
            _push(p, key)
    ints[NTOUCHED] = 0


@nb.njit(cache=True, inline="always")
def _end_walk(p):
    """Forget the walk: the next one reads the heap from its root."""
    ints = p[7]
    ints[NFRONT] = -1
    ints[NFOUND] = 0
    ints[NSCANNED] = 0


# hooks
@nb.njit(cache=True, inline="always")
def begin_call(p, st, c, keys):
    ints = p[7]
    mode = ints[MODE]
    E = ints[NUM_E]
    _settle(p, st[0])
    _end_walk(p)  # waits move with the layer
    if keys.size == 0:
        return
    layer = keys[0] // E
    if mode != SWEEP:
        offsets, call_layer = p[9], p[10]
        if c >= call_layer.size or call_layer[c] != layer or offsets[c + 1] - offsets[c] != keys.size:
            raise ValueError("a call differs from the future the oracle was given (calls must come in its order)")
        if mode == HINTED:
            _take_hint(p, c, layer)
    ints[LAYER] = layer
    visits = p[2]
    visits[layer] += 1
    ints[MOST_VISITS] = max(ints[MOST_VISITS], visits[layer])


@nb.njit(cache=True, _nrt=False)  # called, not inlined: keeps the driver's compile short
def _upcoming(p, c, layer, out):
    """The oracle's keys for the next `depth` calls after c while the sweep goes on, then the keys carried into the
    calls c + j inside the sweep (placement.carry.CarriedHint), nearest first, each once; returns the count."""
    ints, offsets, call_layer, predicted, mark = p[7], p[9], p[10], p[11], p[13]
    ints[STAMP] += 1  # a fresh mark: the keys below are the standing pending / predicted set
    stamp = ints[STAMP]
    n = 0
    reach = min(ints[DEPTH], ints[NUM_L] - 1 - layer, call_layer.size - 1 - c)  # distances inside the sweep
    for j in range(1, reach + 1):
        if call_layer[c + j] != layer + j:  # the oracle's sweep ends: the next token is unknown
            break
        row = predicted[0] if predicted.shape[0] == 1 else predicted[j - 1]
        n = _mark_keys(row, offsets[c + j], offsets[c + j + 1], mark, stamp, out, n)
    for j in range(1, reach + 1):
        n = _mark_keys(p[27], p[28][c + j], p[28][c + j + 1], mark, stamp, out, n)
    return n


@nb.njit(cache=True, inline="always")
def _mark_keys(keys, lo, hi, mark, stamp, out, n):
    """Append keys[lo:hi] not marked yet to out[n:]; returns the new count."""
    for i in range(lo, hi):
        k = keys[i]
        if mark[k] != stamp:
            mark[k] = stamp
            out[n] = k
            n += 1
    return n


@nb.njit(cache=True, _nrt=False)  # called, not inlined: keeps the driver's compile short
def _take_hint(p, c, layer):
    """hinted_sweep: the oracle's keys for the next `depth` layers, per hinted layer its accuracy and chance q."""
    ints, acc = p[7], p[12]
    E = ints[NUM_E]
    order = p[18]
    n = _upcoming(p, c, layer, order)
    ints[NPRED] = n
    stamp = ints[STAMP]
    seen, a_of, q_of, n_of = p[14], p[15], p[16], p[17]
    reach = 0  # the furthest hinted layer's distance (the walk's bound)
    for i in range(n):
        hl = order[i] // E
        if seen[hl] != stamp:
            seen[hl] = stamp
            n_of[hl] = 0
        n_of[hl] += 1
        reach = max(reach, hl - layer)
    ints[REACH] = reach
    for j in range(1, reach + 1):  # once per hinted layer (the keys come layer by layer)
        hl = layer + j
        if seen[hl] == stamp:
            a = acc[j - 1]
            a_of[hl] = a
            q_of[hl] = min(1.0, n_of[hl] * (1 - a) / (E - 1))


@nb.njit(cache=True, inline="always")
def on_hit(p, key, now):
    _use(p, key)
    _touch(p, key)


@nb.njit(cache=True, inline="always")
def on_miss(p, key, now):
    _use(p, key)


@nb.njit(cache=True, inline="always")
def on_admit(p, key, now):
    _touch(p, key)


@nb.njit(cache=True, inline="always")
def on_evict(p, key):
    _touch(p, key)  # victim() took it out of the walk already


@nb.njit(cache=True, inline="always")
def prefetch_for(p, st, c, keys, out):
    ints = p[7]
    if ints[MODE] == LOOKAHEAD:
        _end_walk(p)  # the pending keys (protected) change
        return _upcoming(p, c, keys[0] // ints[NUM_E], out) if keys.size else 0
    return _confident(p, out) if ints[MODE] == HINTED else 0


@nb.njit(cache=True, _nrt=False)  # called, not inlined: keeps the driver's compile short
def _confident(p, out):
    """hinted_sweep: the predicted keys, nearest first, whose posterior reaches min_confidence."""
    ints, order, min_conf = p[7], p[18], p[8][MIN_CONF]
    n = 0
    if min_conf > 1.0:  # a posterior never exceeds 1 (num <= den): the hint only steers eviction
        return 0
    for i in range(ints[NPRED]):
        if _posterior(p, order[i])[0] >= min_conf:
            out[n] = order[i]
            n += 1
    return n


@nb.njit(cache=True, inline="always")  # one caller, _scan
def _walk_on(p, st, shift):
    """Read the heap on, in (z, key) order, up to the next unprotected resident and append it to the walk's found
    list; False at the end. The frontier holds the keys whose parent was read."""
    ints, z, heap, pos = p[7], p[3], p[4], p[5]
    mode, L, n = ints[MODE], ints[NUM_L], ints[HEAP_N]
    front, slot_of = p[6], st[0]
    found, bounds, waits = p[19], p[20], p[21]
    if ints[NFRONT] < 0:  # a fresh walk: from the root
        ints[NFRONT] = 0
        if n > 0:
            front[0] = heap[0]
            ints[NFRONT] = 1
    while ints[NFRONT] > 0:
        k = front[0]
        child = 2 * pos[k] + 1  # k's children in the heap take its place in the frontier
        m = ints[NFRONT]
        if child < n:
            front[0] = heap[child]
            front_down(front, m, z)
            if child + 1 < n:
                front[m] = heap[child + 1]
                front_up(front, m, z)
                m += 1
        else:
            m -= 1
            front[0] = front[m]
            front_down(front, m, z)
        ints[NFRONT] = m
        # skipped: protected (lookahead: pending too), or evicted earlier in this call (still on the heap)
        if is_protected(st, k) or slot_of[k] < 0 or (mode == LOOKAHEAD and p[13][k] == ints[STAMP]):
            continue
        log_p = z[k] + shift
        bound = np.inf
        if log_p > -700.0:
            bound = (ints[REACH] + L * math.exp(-log_p)) / _SLACK if mode == HINTED else L * math.exp(-log_p) * _SLACK
        i = ints[NFOUND]
        found[i], bounds[i] = k, bound
        waits[i] = _wait(p, k) if mode == HINTED else _sweep_wait(p, k)
        ints[NFOUND] = i + 1
        return True
    return False


@nb.njit(cache=True, _nrt=False)  # called, not inlined: keeps the driver's compile short
def _scan(p, st, to_beat):
    """The reference's scan of the walk: the index in found of the unprotected resident with the longest wait
    (ties: lowest key) among those read before a bound stops it or `scan` were read; -1 when there is none or the
    reference bypasses for a key waiting to_beat (-inf: never).

    The reference stops at the first bound under max(longest wait so far, to_beat). The scan here keeps its stop
    rule without to_beat (found[:NSCANNED] scanned; best[i], least[i]: the argmax and the least bound of
    found[:i + 1]), so a call's later evictions resume it: found only grows between evictions, and an eviction
    keeps the scan before its index. to_beat then only cuts it short: at the first bound under to_beat the
    reference stops with nothing found waiting longer than that bound (the scan passed it), so it bypasses; if no
    bound falls under to_beat, both stop where the scan does, with the same argmax."""
    ints, found, bounds, waits, best, least = p[7], p[19], p[20], p[21], p[25], p[26]
    i = ints[NSCANNED]
    if i > 0 and least[i - 1] < to_beat:
        return -1
    at = best[i - 1] if i > 0 else -1
    best_wait = waits[at] if at >= 0 else -np.inf
    low = least[i - 1] if i > 0 else np.inf
    shift = ints[MOST_VISITS] * p[8][LOG_DECAY]
    while i < ints[SCAN]:  # protected keys do not count
        if i == ints[NFOUND] and not _walk_on(p, st, shift):
            break
        if bounds[i] < best_wait:
            break  # heap order is ascending p: no later key waits longer
        if bounds[i] < to_beat:
            ints[NSCANNED] = i
            return -1
        w = waits[i]
        if w > best_wait or (at >= 0 and w == best_wait and found[i] < found[at]):
            at, best_wait = i, w
        best[i] = at
        low = min(low, bounds[i])
        least[i] = low
        i += 1
    ints[NSCANNED] = i
    return -1 if at < 0 or to_beat > best_wait else at


@nb.njit(cache=True, inline="always")
def victim(p, st, key, now):
    """The unprotected resident with the longest wait (ties: lowest key), walked from the least likely; -1 when
    `key` waits longer still (bypass, or a hinted prefetch)."""
    ints = p[7]
    found, bounds, waits = p[19], p[20], p[21]
    mode, E = ints[MODE], ints[NUM_E]
    if mode == HINTED:
        weigh = ints[BYPASS] != 0 or (p[13][key] == ints[STAMP] and p[14][key // E] == ints[STAMP])
    else:
        weigh = ints[BYPASS] != 0
    at = _scan(p, st, _wait(p, key) if weigh else -np.inf)
    if at < 0:
        return -1
    best = found[at]
    n = ints[NFOUND] - 1  # the victim leaves the walk (and the heap when the next call begins)
    for i in range(at, n):
        found[i], bounds[i], waits[i] = found[i + 1], bounds[i + 1], waits[i + 1]
    ints[NFOUND] = n
    ints[NSCANNED] = at  # the scan before the victim stands
    return best
