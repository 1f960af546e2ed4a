"""A KV cache whose sequence also keeps state that summarises every token so far (Gated DeltaNet's conv and
recurrent states, DeepSeek-V4's compressor windows): unlike KV, such state cannot be cut back to an earlier length.
So a reuse of a shorter prefix restarts from a snapshot taken at that length (snapshot()), or from zero.
"""

from __future__ import annotations

import torch

from freetoken.engine.kv import KVCache

States = dict[str, torch.Tensor]


class StatefulKV(KVCache):
    """Subclasses allocate their state tensors and hand them to `keep_states` (name -> tensor, updated in place)."""

    def keep_states(self, states: States) -> None:
        self._states = states
        self.snapshots: dict[int, States] = {}  # length -> copies of the states after that many tokens

    def reusable(self, n: int) -> int:
        """The longest prefix <= n whose states exist: the current length, a snapshot, or nothing."""
        if n >= self.length:
            return self.length
        return max((s for s in self.snapshots if s <= n), default=0)

    def truncate(self, length: int) -> None:
        if length == self.length:
            return
        if length and length not in self.snapshots:
            raise ValueError(f"{type(self).__name__}: no state at length {length} (have {self.length} and "
                             f"snapshots {sorted(self.snapshots)}); reuse kv.reusable(n) tokens")
        super().truncate(length)
        saved = self.snapshots.get(length)
        if saved is None:
            for t in self._states.values():
                t.zero_()
        else:
            self.load_states(saved)
        self.snapshots = {s: v for s, v in self.snapshots.items() if s <= length}

    def snapshot(self) -> None:
        """Keep a copy of the states at the current length, so a later request can restart here."""
        self.snapshots[self.length] = self._copy()

    def states_at(self, length: int) -> States | None:
        """Copies of the states after `length` tokens: now, or a snapshot; None if neither."""
        return self._copy() if length == self.length else self.snapshots.get(length)

    def load_states(self, states: States) -> None:
        """Set the states to ones taken at the current length (a snapshot, a prefix cache's copy)."""
        for name, t in self._states.items():
            t.copy_(states[name])

    def state_bytes(self) -> int:
        """The states' bytes for one sequence (what a snapshot costs)."""
        return sum(t.numel() * t.element_size() for t in self._states.values())

    def _copy(self) -> States:
        return {name: t.clone() for name, t in self._states.items()}
