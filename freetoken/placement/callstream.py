"""Router picks -> calls, in compiled code: the one call builder of the simulator and the live engine.

A CallStream holds every MoE-layer call of a run as flat columns (no Python object per call): call c needs the keys
keys[offsets[c]:offsets[c+1]] (key = layer * E + expert) in first-use order (token-major, then top-k rank), and
tokens[...] counts the (token, expert) pairs routed to each. Prefill runs are cut into chunks of `prefill_chunk`
tokens, one call per layer per chunk; decode is one call per layer per token. Built in one linear pass over the
trace with a per-call `seen` stamp array (no sort over the (token, expert) pairs), into arrays sized by an upper
bound that needs no pass over the picks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from freetoken.placement.call import DECODE, PREFILL, Call
from freetoken.placement.compiled.cache import jit
from freetoken.placement.compiled.notes import label
from freetoken.placement.stream import KeyStream

KEY_DTYPE = np.int32  # keys and per-key token counts of a CallStream


@jit(entry=True)
def fill_call(experts, lo, hi, layer, base, seen, pos, stamp, keys, tokens, w):
    """Distinct experts of experts[lo:hi, layer, :] in first-use order, written at keys[w:] as base + expert with
    their token counts; seen / pos are [E] scratch (seen[e] == stamp: e already written, at pos[e]). Returns the
    new write index."""
    K = experts.shape[2]
    for t in range(lo, hi):
        for k in range(K):
            e = experts[t, layer, k]
            if seen[e] != stamp:
                seen[e] = stamp
                pos[e] = w
                keys[w] = base + e
                tokens[w] = 1
                w += 1
            else:
                tokens[pos[e]] += 1
    return w


@jit(entry=True)
def _sizes(seg_lo, seg_hi, seg_prefill, chunk, L, E, K):
    """(calls, an upper bound on their accesses) without reading the picks: a call of n tokens needs at most
    min(E, n K) distinct experts (exact in decode, K per call)."""
    c = 0
    n = 0
    for s in range(seg_lo.size):
        step = chunk if seg_prefill[s] else 1
        for lo in range(seg_lo[s], seg_hi[s], step):
            c += L
            n += L * min(E, (min(lo + step, seg_hi[s]) - lo) * K)
    return c, n


@jit(entry=True)
def _build(experts, seg_lo, seg_hi, seg_prefill, chunk, seen, pos, keys, tokens, offsets, call_layer, call_seg):
    """One pass over the segments, writing every call (keys / tokens sized by _sizes' bound); returns the accesses
    written. seen [E] all -1, pos [E]: fill_call's scratch."""
    L, E = experts.shape[1], seen.size
    c = 0
    w = 0
    for s in range(seg_lo.size):
        step = chunk if seg_prefill[s] else 1
        for lo in range(seg_lo[s], seg_hi[s], step):
            hi = min(lo + step, seg_hi[s])
            for layer in range(L):
                offsets[c] = w
                call_layer[c] = layer
                call_seg[c] = s
                w = fill_call(experts, lo, hi, layer, layer * E, seen, pos, c, keys, tokens, w)
                c += 1
    offsets[c] = w
    return w


@dataclass(frozen=True, slots=True)
class CallStream:
    """Every call of a run as columns. keys [N] int32, tokens [N] int32 (a key < layers x experts, a count <= a
    chunk's pairs: int32 halves the largest arrays of a replay), offsets [C + 1] int64; per call: layer, phase,
    request [C]. num_layers: the layers it was built over (each chunk or token has a call on every one), so a replay
    checks its layers without a pass over `layer`."""

    keys: np.ndarray
    tokens: np.ndarray
    offsets: np.ndarray
    layer: np.ndarray
    phase: np.ndarray
    request: np.ndarray
    num_experts: int
    num_layers: int

    @property
    def num_calls(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_accesses(self) -> int:
        return int(self.keys.size)

    def sizes(self) -> np.ndarray:
        """[C]: distinct experts per call."""
        return np.diff(self.offsets)

    def key_stream(self) -> KeyStream:
        return KeyStream(self.keys, self.offsets)

    def call(self, c: int) -> Call:
        lo, hi = self.offsets[c], self.offsets[c + 1]
        layer = int(self.layer[c])
        return Call(layer, (self.keys[lo:hi] - layer * self.num_experts).tolist(), self.tokens[lo:hi].tolist(),
                    int(self.phase[c]), int(self.request[c]))

    def calls(self) -> Iterator[Call]:
        """Call objects, one by one (the interpreted path); experts are ids within the call's layer."""
        E = self.num_experts
        off = self.offsets.tolist()
        layer, phase, request = self.layer.tolist(), self.phase.tolist(), self.request.tolist()
        for c in range(self.num_calls):
            lo, hi = off[c], off[c + 1]
            keys = self.keys[lo:hi]
            base = layer[c] * E
            yield Call(layer[c], (keys - base).tolist(), self.tokens[lo:hi].tolist(), phase[c], request[c])


label(_sizes, "the call builder")
label(_build, "the call builder")


def empty_stream(num_experts: int) -> CallStream:
    """A stream of no call (what a compiled replay is loaded with before its first real one)."""
    return CallStream(np.zeros(0, KEY_DTYPE), np.zeros(0, KEY_DTYPE), np.zeros(1, np.int64), np.zeros(0, np.int64),
                      np.zeros(0, np.int8), np.zeros(0, np.int64), num_experts, 1)


def segments_of(request: np.ndarray, turn: np.ndarray, phase: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[start, end) of each run of consecutive tokens with the same request, turn and phase."""
    T = len(request)
    if T == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    change = (np.diff(request) != 0) | (np.diff(turn) != 0) | (np.diff(phase) != 0)
    cuts = np.concatenate([[0], np.flatnonzero(change) + 1, [T]]).astype(np.int64)
    return cuts[:-1], cuts[1:]


def call_stream(experts: np.ndarray, num_experts: int, request: np.ndarray, turn: np.ndarray, phase: np.ndarray,
                prefill_chunk: int) -> CallStream:
    """experts [T, L, K] of a run (with per-token request / turn / phase [T]) -> its CallStream."""
    if prefill_chunk <= 0:
        raise ValueError(f"prefill_chunk must be positive, got {prefill_chunk}")
    lo, hi = segments_of(request, turn, phase)
    prefill = np.asarray(phase)[lo] == PREFILL if lo.size else np.zeros(0, bool)
    _, L, K = experts.shape
    widest = min(int(prefill_chunk), int((hi - lo).max())) if lo.size else 0  # tokens of the largest call
    if widest * K >= 2 ** 31:  # a call's pairs fit 31 bits (lru_stream packs two counts in an int64)
        raise ValueError(f"prefill_chunk {prefill_chunk}: a call of {widest} tokens x top-k {K} would route 2^31 "
                         f"(token, expert) pairs or more")
    C, bound = _sizes(lo, hi, prefill, int(prefill_chunk), L, int(num_experts), K)
    keys, tokens = np.empty(bound, KEY_DTYPE), np.empty(bound, KEY_DTYPE)
    offsets, layer, seg = np.empty(C + 1, np.int64), np.empty(C, np.int64), np.empty(C, np.int64)
    N = _build(experts, lo, hi, prefill, int(prefill_chunk), np.full(num_experts, -1, np.int64),
               np.zeros(num_experts, np.int64), keys, tokens, offsets, layer, seg)
    keys.resize(N, refcheck=False)  # the bound's unused tail given back (a shrinking realloc, no copy)
    tokens.resize(N, refcheck=False)
    return CallStream(keys, tokens, offsets, layer, np.where(prefill[seg], PREFILL, DECODE).astype(np.int8),
                      np.asarray(request, np.int64)[lo][seg], int(num_experts), int(L))


def layer_calls(ids: np.ndarray, num_experts: int, phase: int, request: int = 0) -> CallStream:
    """ids [L, T, K] of one forward step (T tokens, stepping together, on every one of L MoE layers) -> its L calls,
    one per layer over all T tokens (the live engine's call: make_call's, for every layer in one pass). The ids go
    through the trace's int16 form, so the call builder runs the code compiled for traces."""
    L, T, K = ids.shape
    experts = np.ascontiguousarray(ids.transpose(1, 0, 2), np.int16)  # [T, L, K]
    bound = L * min(num_experts, T * K)
    keys, tokens = np.empty(bound, KEY_DTYPE), np.empty(bound, KEY_DTYPE)
    offsets, layer, seg = np.empty(L + 1, np.int64), np.empty(L, np.int64), np.empty(L, np.int64)
    one = np.zeros(1, np.int64)  # one segment of the T tokens, read as a prefill chunk of T: one call per layer
    N = _build(experts, one, one + T, np.ones(1, np.bool_), T, np.full(num_experts, -1, np.int64),
               np.zeros(num_experts, np.int64), keys, tokens, offsets, layer, seg)
    return CallStream(keys[:N], tokens[:N], offsets, layer, np.full(L, phase, np.int8), np.full(L, request, np.int64),
                      num_experts, L)


def make_call(layer: int, topk: np.ndarray, phase: int, request: int = 0) -> Call:
    """The live engine's call for one MoE layer: topk [T, K] expert ids of T tokens (T = 1 in decode), built by the
    same fill_call as the simulator's stream."""
    integer = isinstance(topk, np.ndarray) and topk.dtype.kind == "i"  # the engine's int32 ids: no int64 copy
    ids = topk if integer else np.asarray(topk, np.int64)
    ids = ids.reshape(-1, ids.shape[-1] if ids.ndim else 1)  # [T, K]
    if ids.shape[0] == 1:  # one token: ids are already distinct, in rank order
        flat = ids[0].tolist()
        return Call(layer, flat, [1] * len(flat), phase, request)
    ids = ids.astype(np.int64, copy=False)[:, None, :]  # [T, 1, K]
    n = ids.shape[0] * ids.shape[2]
    E = int(ids.max()) + 1 if n else 1
    keys, tokens = np.empty(n, np.int64), np.empty(n, np.int64)
    w = fill_call(ids, 0, ids.shape[0], 0, 0, np.full(E, -1, np.int64), np.zeros(E, np.int64), 0, keys, tokens, 0)
    return Call(layer, keys[:w].tolist(), tokens[:w].tolist(), phase, request)
