"""A hybrid model's sequence behind the prefix cache: cache anchors for recurrent state.

The KV of the full-attention layers can be cut at any token, the Gated DeltaNet layers' conv + recurrent states
cannot: they exist only where the sequence stood when it passed. So the sequence snapshots its states at the
prompt's anchors (message ends) as its prefill passes them, and a prefix-cache piece carries the states at its end
(HybridPiece.states) when one was taken there. A later request resumes from the deepest cached piece that has states
(PrefixCache's `snapshots`): a turn that appends, or edits after an anchor, prefills only from that anchor. Each
snapshot is charged its bytes in KV-token units against the prefix cache's budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from freetoken.serve.engine_backend import EngineSequence
from freetoken.serve.prefix_cache import Snapshots


@dataclass(frozen=True, slots=True)
class HybridPiece:
    kv: torch.Tensor  # [attention layers, 2, T, Hkv, Dh] as stored (fp8: uint8, Dh + 4 with the scales)
    states: dict | None  # the sequence's states after the piece's last token (StatefulKV.states_at), if kept

    @property
    def tokens(self) -> int:
        return self.kv.shape[2]


def slice_piece(piece: HybridPiece, start: int, stop: int) -> HybridPiece:
    """Positions [start, stop) of a piece; its states survive only if the slice keeps its end."""
    return HybridPiece(piece.kv[:, :, start:stop], piece.states if stop == piece.tokens else None)


def snapshots(state_bytes: int, kv_bytes_per_token: int) -> Snapshots:
    """How the prefix cache treats HybridPieces: a state is a restart point costing ceil(state / KV per token)."""
    return Snapshots(has_state=lambda p: p.states is not None, drop_state=lambda p: HybridPiece(p.kv, None),
                     cost_tokens=-(-state_bytes // kv_bytes_per_token))


class HybridSequence(EngineSequence):
    forkable = False  # its recurrent state exists only at snapshots: a follower prefills itself

    def __init__(self, engine, request: int, max_tokens: int):
        super().__init__(engine, request, max_tokens)
        self.layers = engine.config.attention_layers
        self.anchors: list[int] = []

    def mark(self, anchors: list[int]) -> None:
        self.anchors = sorted(set(anchors))

    def load(self, pieces: list[HybridPiece], tokens: list[int]) -> None:
        kv = torch.cat([p.kv for p in pieces], dim=2)  # [La, 2, T, Hkv, Dh]
        for i, layer in enumerate(self.layers):
            self.kv.load(layer, 0, kv[i])
        self.kv.commit(0, tokens)
        self.kv.load_states(pieces[-1].states)

    def forward(self, tokens: list[int], all_logits: bool = False, decode: bool = False) -> torch.Tensor:
        """Prefill stops at each anchor inside the new tokens to snapshot the states there."""
        if decode:
            return super().forward(tokens, decode=True)
        start, lo, parts = self.kv.length, 0, []
        for cut in [a - start for a in self.anchors if start < a <= start + len(tokens)]:
            parts.append(super().forward(tokens[lo:cut], all_logits))
            lo = cut
            self.kv.snapshot()
        if lo < len(tokens):
            parts.append(super().forward(tokens[lo:], all_logits))
        return torch.cat(parts) if all_logits else parts[-1]

    def read(self, start: int, stop: int) -> HybridPiece:
        kv = self.kv
        piece = torch.stack([kv.read(l, start, stop) for l in self.layers]).clone()
        return HybridPiece(piece, kv.states_at(stop))
