"""DeepSeek-V4's shape beyond ModelConfig's: its attention (sliding window + compressed KV), hyper-connections and
hash routing, read by models/deepseek_v4.py and run by engine/v4_*.py."""

from __future__ import annotations

from dataclasses import dataclass

from freetoken.models.config import CheckpointError, YarnRope

KINDS = ("sliding", "csa", "hca")  # sliding window only | + compressed sparse (indexer) | + heavily compressed


@dataclass(frozen=True, slots=True)
class V4Layout:
    """Per layer, attention over the last `window` cache rows (one shared K = V head, a sink per query head) and,
    on csa / hca layers, over compressed entries: one per csa_rate tokens (overlapping windows of 2 x csa_rate,
    index_topk of them picked per query by a lightning indexer) or per hca_rate tokens (all of them). The residual
    is hc_mult streams mixed by hyper-connections; hash_layers route by a token-id table."""

    q_lora_rank: int
    rope_dim: int  # the trailing dims of each head that take rope (pairs interleaved in the checkpoint)
    window: int
    o_groups: int
    o_lora_rank: int
    kinds: tuple[str, ...]  # one of KINDS per layer
    csa_rate: int
    hca_rate: int
    index_heads: int
    index_head_dim: int
    index_topk: int
    compress_rope_theta: float
    compress_yarn: YarnRope | None
    hc_mult: int
    hc_iters: int
    hc_eps: float
    hash_layers: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("q_lora_rank", "rope_dim", "window", "o_groups", "o_lora_rank", "csa_rate", "hca_rate",
                     "index_heads", "index_head_dim", "index_topk", "hc_mult", "hc_iters"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise CheckpointError(f"config.json: {name} must be a positive integer, got {value!r}")
        if self.rope_dim % 2 or self.rope_dim > self.index_head_dim:
            raise CheckpointError(f"config.json: qk_rope_head_dim {self.rope_dim} must be even and fit "
                                  f"index_head_dim {self.index_head_dim}")
        if not self.compress_rope_theta > 0 or not self.hc_eps > 0:
            raise CheckpointError(f"config.json: compress_rope_theta {self.compress_rope_theta} and hc_eps "
                                  f"{self.hc_eps} must be positive")
        bad = [k for k in self.kinds if k not in KINDS]
        if bad:
            raise CheckpointError(f"config.json: layer_types {bad[0]!r} is not one of sliding_attention, "
                                  "compressed_sparse_attention, heavily_compressed_attention")

    def rate(self, layer: int) -> int:
        """Source tokens per compressed entry of a layer, 0 on sliding-only layers."""
        return {"sliding": 0, "csa": self.csa_rate, "hca": self.hca_rate}[self.kinds[layer]]

    def compressed_values(self, head_dim: int) -> tuple[int, int]:
        """(values, tokens): the compressed entries every `tokens` source tokens add to a sequence's cache over all
        layers (indexer keys included): kv_values_per_token = head_dim + values / tokens exactly."""
        from math import lcm

        tokens = lcm(self.csa_rate, self.hca_rate)
        values = sum(tokens // self.csa_rate * (head_dim + self.index_head_dim) if k == "csa"
                     else tokens // self.hca_rate * head_dim if k == "hca" else 0 for k in self.kinds)
        return values, tokens

    def kv_values_per_token(self, num_layers: int, head_dim: int) -> float:
        """Cache values per token: every layer's key = value row, and the compressed entries (indexer keys included)
        in their per-token share."""
        values, tokens = self.compressed_values(head_dim)
        return num_layers * head_dim + values / tokens

    def state_values(self, head_dim: int) -> int:
        """Values one sequence's compressors hold between windows (the rows of the window in progress and, on csa
        layers, of the one before it, kv and gate): what a snapshot of the sequence copies."""
        out = 0
        for k in self.kinds:
            if k == "csa":
                out += 2 * 2 * self.csa_rate * 2 * (head_dim + self.index_head_dim)
            elif k == "hca":
                out += 2 * self.hca_rate * head_dim
        return out
