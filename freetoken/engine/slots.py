"""Where expert weights live: the host expert store (all routed experts) and the device slot pool (the cache).

Slot pool rows [0, capacity) are the policy's slots; rows [capacity, capacity + staging) are staging buffers for
experts fetched but not kept (a Plan's fetch slot -1). Both sets sit in one tensor so one expert_ffn launch reads
hits and fetched experts alike by slot id.
"""

from __future__ import annotations

import torch


class ExpertStore:
    """gate_up[l]: [E, 2I, D] (gate rows, then up rows), down[l]: [E, D, I], per MoE layer, in host memory."""

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]]):
        if not layers:
            raise ValueError("expert store: no MoE layer")
        self.gate_up = [gu for gu, _ in layers]
        self.down = [d for _, d in layers]
        E, I2, D = self.gate_up[0].shape
        self.num_experts, self.intermediate, self.hidden = E, I2 // 2, D
        self.dtype = self.gate_up[0].dtype

    @property
    def num_layers(self) -> int:
        return len(self.gate_up)

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert (gate, up, down): what one fetch moves over PCIe."""
        return 3 * self.intermediate * self.hidden * self.gate_up[0].element_size()


class SlotPool:
    def __init__(self, capacity: int, staging: int, store: ExpertStore, device: torch.device):
        if capacity < 0 or staging < 0 or capacity + staging == 0:
            raise ValueError(f"slot pool needs capacity + staging > 0, got {capacity} + {staging}")
        S, I, D = capacity + staging, store.intermediate, store.hidden
        self.capacity, self.staging = capacity, staging
        self.w_gate_up = torch.zeros((S, 2 * I, D), dtype=store.dtype, device=device)  # [S, 2I, D]
        self.w_down = torch.zeros((S, D, I), dtype=store.dtype, device=device)  # [S, D, I]

    def load(self, slot: int, store: ExpertStore, layer: int, expert: int) -> None:
        """Copy one expert host -> slot (asynchronous from pinned memory on the current CUDA stream)."""
        self.w_gate_up[slot].copy_(store.gate_up[layer][expert], non_blocking=True)
        self.w_down[slot].copy_(store.down[layer][expert], non_blocking=True)
