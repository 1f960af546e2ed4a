"""A DSA model's sequence behind the prefix cache (GLM-5): a piece carries, beside the KV of its positions, their
lightning-indexer keys (engine/dsa.py's DSAKVCache.index_k), which a resumed sequence's queries score to pick the
keys they attend to. Both are cut along the token axis anywhere, as plain KV is."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from freetoken.serve.engine_backend import EngineSequence


@dataclass(frozen=True, slots=True)
class DSAPiece:
    kv: torch.Tensor  # [L, 2, T, Hkv, Dh] as stored
    index: torch.Tensor  # [indexer layers, T, Di]

    @property
    def tokens(self) -> int:
        return self.kv.shape[2]


def slice_piece(piece: DSAPiece, start: int, stop: int) -> DSAPiece:
    return DSAPiece(piece.kv[:, :, start:stop], piece.index[:, start:stop])


class DSASequence(EngineSequence):
    def load(self, pieces: list[DSAPiece], tokens: list[int]) -> None:
        super().load([p.kv for p in pieces], tokens)
        index = torch.cat([p.index for p in pieces], dim=1)  # [Li, T, Di]
        for i, layer in enumerate(sorted(self.kv.index_k)):
            self.kv.index_k[layer][:index.shape[1]] = index[i]

    def read(self, start: int, stop: int) -> DSAPiece:
        index = torch.stack([self.kv.index_k[l][start:stop] for l in sorted(self.kv.index_k)]).clone()
        return DSAPiece(super().read(start, stop), index)
