"""A DeepSeek-V4 sequence behind the prefix cache: cache anchors for its compressed KV.

Its per-token rows (one key = value row per layer) can be cut anywhere, its compressors' open-window rows cannot
(engine/v4_kv.py): like a hybrid model's recurrent state they exist only where the sequence stood. So it snapshots
them at the prompt's anchors (HybridSequence's prefill), and a prefix-cache piece carries, besides its rows, the
compressed entries whose windows close inside it (entry e closes at position (e + 1) m - 1) and the states at its
end where a snapshot was taken there. A piece knows its first position, so a slice finds its entries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from freetoken.serve.hybrid_sequence import HybridSequence
from freetoken.serve.prefix_cache import Snapshots


@dataclass(frozen=True, slots=True)
class V4Piece:
    start: int  # the absolute position of the piece's first token
    rows: torch.Tensor  # [L, T, Dh] the layers' key = value rows
    entries: dict[int, torch.Tensor]  # compressing layer -> its entries closed inside the piece [n, Dh]
    index_entries: dict[int, torch.Tensor]  # csa layer -> the indexer's [n, Di]
    rates: dict[int, int]  # compressing layer -> m
    states: dict | None  # the compressors' window rows after the piece's last token, if kept

    @property
    def tokens(self) -> int:
        return self.rows.shape[1]


def _closed(lo: int, hi: int, m: int) -> slice:
    """The entries whose windows close at positions [lo, hi)."""
    return slice(lo // m, hi // m)


def slice_piece(piece: V4Piece, start: int, stop: int) -> V4Piece:
    """Positions [start, stop) of a piece (relative): its rows, the entries closing there, its states only if the
    slice keeps its end."""
    lo, hi = piece.start + start, piece.start + stop

    def cut(table: dict) -> dict:
        out = {}
        for layer, t in table.items():
            m, base = piece.rates[layer], piece.start // piece.rates[layer]
            s = _closed(lo, hi, m)
            out[layer] = t[s.start - base:s.stop - base]
        return out

    return V4Piece(lo, piece.rows[:, start:stop], cut(piece.entries), cut(piece.index_entries), piece.rates,
                   piece.states if stop == piece.tokens else None)


def snapshots(state_bytes: int, kv_bytes_per_token: int) -> Snapshots:
    """A piece's states are a restart point costing ceil(state / KV per token) budget tokens."""
    return Snapshots(has_state=lambda p: p.states is not None,
                     drop_state=lambda p: V4Piece(p.start, p.rows, p.entries, p.index_entries, p.rates, None),
                     cost_tokens=-(-state_bytes // kv_bytes_per_token))


class V4Sequence(HybridSequence):
    """HybridSequence's anchors and snapshots over a V4KV."""

    def load(self, pieces: list[V4Piece], tokens: list[int]) -> None:
        kv = self.kv
        for p in pieces:
            for layer, rows in enumerate(p.rows):
                kv.k[layer][p.start:p.start + p.tokens, 0] = rows
            for table, target in ((p.entries, kv.entries), (p.index_entries, kv.index_entries)):
                for layer, t in table.items():
                    first = _closed(p.start, p.start + p.tokens, p.rates[layer]).start
                    target[layer][first:first + t.shape[0]] = t
        kv.commit(0, tokens)
        kv.load_states(pieces[-1].states)

    def read(self, start: int, stop: int) -> V4Piece:
        kv, v = self.kv, self.engine.config.v4
        rates = {l: v.rate(l) for l in kv.entries}
        rows = torch.stack([k[start:stop, 0] for k in kv.k]).clone()
        entries = {l: kv.entries[l][_closed(start, stop, m)].clone() for l, m in rates.items()}
        index = {l: kv.index_entries[l][_closed(start, stop, rates[l])].clone() for l in kv.index_entries}
        return V4Piece(start, rows, entries, index, rates, kv.states_at(stop))
