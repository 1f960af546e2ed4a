"""The compiled sweeps' state layout (the indices of their ints and floats) and their estimate: a key's decayed
use rate, its expected wait (layer_sweep's, lookahead's for a pending key, hinted_sweep's posterior given the
standing hint), as placement.layer_sweep / hinted_sweep compute them, operation for operation. The state tuple `p`
is built by sweep.setup."""

from __future__ import annotations

import numba as nb

from freetoken.placement.hinted_sweep import PRIOR_FLOOR
from freetoken.placement.layer_sweep import _FLOOR

SWEEP, LOOKAHEAD, HINTED = 0, 1, 2
MODES = {"layer_sweep": SWEEP, "lookahead": LOOKAHEAD, "hinted_sweep": HINTED}
# ints
HEAP_N, LAYER, MOST_VISITS, BYPASS, SCAN, MODE, NUM_L, NUM_E, STAMP, DEPTH, NPRED, NFOUND, NFRONT, REACH, \
    NTOUCHED, NSCANNED = range(16)
POWERS = 4096  # decay ** d tabled for d < POWERS (visits of a layer since a key's stamp)
# floats
DECAY, LOG_DECAY, MIN_CONF = range(3)


@nb.njit(cache=True)
def _powers(decay, out):
    """out[d] = decay ** d, the very pow the estimate would call."""
    for d in range(out.size):
        out[d] = decay ** float(d)
    return out


# the estimate
@nb.njit(cache=True, inline="always")
def _decayed(p, d):
    """decay ** d (d >= 0 visits)."""
    powers = p[24]
    return powers[d] if d < powers.size else p[8][DECAY] ** float(d)


@nb.njit(cache=True, inline="always")
def _rate(p, key):
    E = p[7][NUM_E]
    return p[0][key] * _decayed(p, p[2][key // E] - p[1][key])


@nb.njit(cache=True, inline="always")
def _distance(p, key):
    ints = p[7]
    return (key // ints[NUM_E] - ints[LAYER] - 1) % ints[NUM_L] + 1


@nb.njit(cache=True, inline="always")
def _sweep_wait(p, key):
    return _distance(p, key) + p[7][NUM_L] * (1.0 / max(_rate(p, key), _FLOOR) - 1.0)


@nb.njit(cache=True, inline="always")  # hot (per key read, per predicted key): a call copies the state tuple
def _posterior(p, key):
    """hinted_sweep: (r, p) of `key` given the standing hint."""
    ints = p[7]
    E = ints[NUM_E]
    layer = key // E
    rate = _rate(p, key)
    if p[14][layer] != ints[STAMP]:
        return rate, max(rate, _FLOOR)
    a, q, n = p[15][layer], p[16][layer], p[17][layer]
    rate = min(max(rate, PRIOR_FLOOR * n / E), 1.0)
    if p[13][key] == ints[STAMP]:
        num = rate * a
        den = rate * a + (1 - rate) * q
    else:
        num = rate * (1 - a)
        den = rate * (1 - a) + (1 - rate) * (1 - q)
    return (num / den if den > 0 else 0.0), rate


@nb.njit(cache=True, inline="always")
def _wait(p, key):
    """The policy's own wait of `key` (lookahead: a pending key waits only its distance)."""
    ints = p[7]
    mode = ints[MODE]
    if mode == LOOKAHEAD and p[13][key] == ints[STAMP]:
        return float(_distance(p, key))
    if mode == HINTED and p[14][key // ints[NUM_E]] == ints[STAMP]:
        r, rate = _posterior(p, key)
        return _distance(p, key) + (1.0 - r) * ints[NUM_L] / rate
    return _sweep_wait(p, key)


@nb.njit(cache=True, inline="always")
def _use(p, key):
    rate, stamp, floats = p[0], p[1], p[8]
    v = p[2][key // p[7][NUM_E]]
    decay = floats[DECAY]
    rate[key] = rate[key] * _decayed(p, v - stamp[key]) + (1.0 - decay)
    stamp[key] = v
