"""Where expert weights live: the host expert store (all routed experts) and the device slot pool (the cache).

Slot pool rows [0, capacity) are the policy's slots; rows [capacity, capacity + staging) are staging buffers for
experts fetched but not kept (a Plan's fetch slot -1). Both sets sit in one tensor so one expert_ffn launch reads
hits and fetched experts alike by slot id.

Quantized checkpoints keep their experts packed in both places: per MoE layer a (gate, up, down) triple of
PackedWeights (freetoken/quant/packed.py), one slot per expert in the store and one per cache row in the pool, so a
fetch moves the packed bytes and expert_ffn_quant dequantizes inside the matmul.

Expert biases (gpt-oss) are plain per-expert tensors beside the weights, packed or not: b_gate_up[l] [E, 2I] and
b_down[l] [E, D] in the store, [S, 2I] / [S, D] rows in the pool, copied with the expert and counted in its bytes.

The host computes experts straight from the store (`host_moe`: the CPU lane, the cpu split, a CPU-only engine),
packed ones as stored: no dequantized copy is kept. On a CPU-only machine the pool aliases the store (`alias`): a
resident expert is one the policy holds, and nothing is copied.
"""

from __future__ import annotations

import numpy as np
import torch

from freetoken.host import grouped
from freetoken.host import kernels as host_kernels
from freetoken.host.native import packed_matrix
from freetoken.kernels.expert_ffn import glu_ref
from freetoken.quant.packed import PackedWeight

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


class ExpertStore:
    """Dense: gate_up[l] [E, 2I, D] (gate rows, then up rows), down[l] [E, D, I], per MoE layer, in host memory.
    Packed (layers of (gate, up, down) PackedWeights): gate[l], up[l], down[l]; `dtype` is then the compute dtype
    the CPU lane dequantizes to."""

    def __init__(self, layers: list[tuple], dtype: torch.dtype | None = None, quant_format: str | None = None,
                 biases: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
                 glu: tuple[str, float, float] = ("silu", 1.702, 7.0)):
        """biases: per layer (gate_up [E, 2I], down [E, D]), cast to the compute dtype; glu: (kind, alpha, limit)
        of the experts' gated activation (kernels.expert_ffn.GLUS)."""
        if not layers:
            raise ValueError("expert store: no MoE layer")
        self.packed = isinstance(layers[0][0], PackedWeight)
        if self.packed:
            if dtype is None:
                raise ValueError("expert store: packed experts need the compute dtype")
            self.gate, self.up, self.down = ([layer[i] for layer in layers] for i in range(3))
            (I, D), E = self.gate[0].shape, self.gate[0].num_slots
            self._check_layers()
            self.dtype, self.format = dtype, quant_format or self.gate[0].kind
        else:
            self.gate_up = [gu for gu, _ in layers]
            self.down = [d for _, d in layers]
            E, I2, D = self.gate_up[0].shape
            I = I2 // 2
            self.dtype = self.gate_up[0].dtype
            self.format = DTYPE_NAMES.get(self.dtype, str(self.dtype).removeprefix("torch."))
        self.num_experts, self.intermediate, self.hidden = E, I, D
        self.b_gate_up = self.b_down = None
        if biases is not None:
            if len(biases) != len(layers):
                raise ValueError(f"expert store: biases for {len(biases)} layers, experts for {len(layers)}")
            for l, (bgu, bd) in enumerate(biases):
                if tuple(bgu.shape) != (E, 2 * I) or tuple(bd.shape) != (E, D):
                    raise ValueError(f"expert store: layer {l} biases {tuple(bgu.shape)} / {tuple(bd.shape)}, "
                                     f"expected ({E}, {2 * I}) / ({E}, {D})")
            self.b_gate_up = [bgu.to(self.dtype) for bgu, _ in biases]
            self.b_down = [bd.to(self.dtype) for _, bd in biases]
        kind, alpha, limit = glu
        self.glu = {"glu": kind, "alpha": float(alpha), "limit": float(limit)}  # expert_ffn's activation options
        self._host: dict[int, host_kernels.MoEMatrices] = {}  # per layer: what the host kernels read

    @classmethod
    def from_checkpoint(cls, ckpt, dtype: torch.dtype | None = None) -> ExpertStore:
        """dtype: the compute dtype (None: the checkpoint's); dense experts are cast to it, packed ones stay
        packed and are labelled by their format ('gptq int4 g128')."""
        cfg = ckpt.config
        options = dict(biases=ckpt.expert_biases, glu=(cfg.expert_glu, cfg.glu_alpha, cfg.glu_limit))
        if ckpt.quant is None:
            experts = ckpt.experts if dtype is None else [(g.to(dtype), d.to(dtype)) for g, d in ckpt.experts]
            return cls(experts, **options)
        from freetoken.quant import describe

        return cls(ckpt.experts, dtype or ckpt.dense["model.embed_tokens.weight"].dtype,
                   describe(ckpt.quant.expert_format),
                   **options)

    def _check_layers(self) -> None:
        """Every layer must fit the pool built from layer 0: same layout, shapes and dtypes per projection."""
        for name, ws in (("gate", self.gate), ("up", self.up), ("down", self.down)):
            want = _layout(ws[0])
            for l, w in enumerate(ws[1:], 1):
                if _layout(w) != want:
                    raise ValueError(f"expert store: layer {l} {name} is laid out as {_layout(w)}, layer 0 as {want}")

    @property
    def num_layers(self) -> int:
        return len(self.down)

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert (gate, up, down, and biases): what one fetch moves over PCIe (packed: values and
        scales)."""
        bias = 0 if self.b_gate_up is None else (2 * self.intermediate + self.hidden) * self.b_gate_up[0].element_size()
        if self.packed:
            return sum(w[0].nbytes_per_slot for w in (self.gate, self.up, self.down)) + bias
        return 3 * self.intermediate * self.hidden * self.gate_up[0].element_size() + bias

    def expert_weights(self, layer: int, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up [2I, D], down [D, I]) of one expert in the store's dtype, on the host; packed experts are
        dequantized on each call (a fresh copy, kept by nobody)."""
        if not self.packed:
            return self.gate_up[layer][expert], self.down[layer][expert]
        gate, up, down = (w[layer].to_float(expert).to(self.dtype) for w in (self.gate, self.up, self.down))
        return torch.cat([gate, up]), down

    def host_matrices(self, layer: int) -> host_kernels.MoEMatrices:
        """Layer `layer`'s experts as the host kernels read them, over the store's own tensors (no copy)."""
        m = self._host.get(layer)
        if m is None:
            biases = {}
            if self.b_gate_up is not None:
                biases = {"b_gate_up": self.b_gate_up[layer].float().contiguous(),
                          "b_down": self.b_down[layer].float().contiguous()}
            if self.packed:
                ws = (self.gate[layer], self.up[layer], self.down[layer])
                m = host_kernels.MoEMatrices(*(packed_matrix(w) for w in ws), self.num_experts, **self.glu,
                                             **biases, keep=ws)
            else:
                m = host_kernels.MoEMatrices.dense(self.gate_up[layer], self.down[layer], **self.glu, **biases)
            self._host[layer] = m
        return m

    def host_moe(self, layer: int, x: torch.Tensor, ids: np.ndarray, weights: torch.Tensor,
                 take: np.ndarray | None, cast: bool = False) -> torch.Tensor:
        """sum over each token's picks whose expert `take` marks (None: all) of w[t, k] * down(glu(gate x, up x)),
        computed on the host from the store -> fp32 [T, D] (cast: rounded to x's dtype). x [T, D] on the host in
        the store's dtype, ids [T, K] expert ids, weights [T, K] fp32, take [E] bool. One call into the host
        kernels; dense experts of a long prefill chunk (grouped.GEMM_TOKENS_PER_EXPERT tokens each on average) go
        to torch's grouped GEMM instead (grouped.grouped_experts, computed in the dtype as HF transformers does), as
        they do where the host kernels are not built; packed experts without the host kernels, expert by expert."""
        if host_kernels.available() and (self.packed or
                                         not grouped.gemm_sized(ids, take, self.num_experts, self.dtype)):
            take_t = None if take is None else torch.from_numpy(np.ascontiguousarray(take, np.uint8))
            return host_kernels.moe(self.host_matrices(layer), x, torch.from_numpy(np.ascontiguousarray(ids, np.int32)),
                                    weights, take_t, cast=cast)
        if take is None:
            take = np.zeros(self.num_experts, np.uint8)
            take[ids[ids >= 0]] = 1
        if not self.packed and grouped.available():
            out = grouped.grouped_experts(x, ids, weights, self.gate_up[layer], self.down[layer], take,
                                          *self._layer_biases(layer), self.glu)
        else:
            out = self._host_moe_torch(layer, x, ids, weights, take)
        return out.to(x.dtype) if cast else out

    def _layer_biases(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.b_gate_up is None:
            return None, None
        return self.b_gate_up[layer], self.b_down[layer]

    def _host_moe_torch(self, layer: int, x: torch.Tensor, ids: np.ndarray, weights: torch.Tensor,
                        take: np.ndarray) -> torch.Tensor:
        """host_moe in torch, expert by expert, in the store's dtype (torch accumulates in fp32), the routing weights
        and the sum in fp32."""
        I, dt = self.intermediate, self.dtype
        out = torch.zeros(x.shape, dtype=torch.float32)
        for e in np.flatnonzero(take):
            tok, k = np.nonzero(ids == e)
            if not len(tok):
                continue
            tok_t = torch.from_numpy(tok)
            gate_up, down = self.expert_weights(layer, int(e))  # [2I, D], [D, I]
            b_gate_up, b_down = self.expert_biases(layer, int(e))
            h = x[tok_t] @ gate_up.T  # [n, 2I]
            if b_gate_up is not None:
                h = h + b_gate_up
            h = glu_ref(h[:, :I].float(), h[:, I:].float(), **self.glu).to(dt)
            y = h @ down.T  # [n, D]
            if b_down is not None:
                y = y + b_down
            out.index_add_(0, tok_t, y.float() * weights[tok_t, torch.from_numpy(k)][:, None])
        return out

    def expert_biases(self, layer: int, expert: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(gate_up [2I], down [D]) biases of one expert on the host, or (None, None)."""
        if self.b_gate_up is None:
            return None, None
        return self.b_gate_up[layer][expert], self.b_down[layer][expert]


def _layout(w: PackedWeight) -> tuple:
    return (w.kind, w.shape, w.group, w.block, w.scale_code, w.global_op,
            tuple((n, t.dtype, tuple(t.shape[1:])) for n, t in w.tensors().items()))


class SlotPool:
    def __init__(self, capacity: int, staging: int, store: ExpertStore, device: torch.device, alias: bool = False):
        """alias: the pool of a CPU-only engine, where every expert is computed from the store: no rows are
        allocated and loads move nothing (the policy's residency is all there is to it)."""
        if capacity < 0 or staging < 0 or capacity + staging == 0:
            raise ValueError(f"slot pool needs capacity + staging > 0, got {capacity} + {staging}")
        S, I, D = capacity + staging, store.intermediate, store.hidden
        self.capacity, self.staging, self.packed, self.alias = capacity, staging, store.packed, alias
        self.glu = store.glu
        self.b_gate_up = self.b_down = None
        if alias:
            self.w_gate_up = self.w_down = self.gate = self.up = self.down = None
            return
        if self.packed:
            self.gate, self.up, self.down = (w[0].empty_slots(S, device) for w in (store.gate, store.up, store.down))
        else:
            self.w_gate_up = torch.zeros((S, 2 * I, D), dtype=store.dtype, device=device)  # [S, 2I, D]
            self.w_down = torch.zeros((S, D, I), dtype=store.dtype, device=device)  # [S, D, I]
        self.b_gate_up = self.b_down = None
        if store.b_gate_up is not None:
            self.b_gate_up = torch.zeros((S, 2 * I), dtype=store.dtype, device=device)  # [S, 2I]
            self.b_down = torch.zeros((S, D), dtype=store.dtype, device=device)  # [S, D]

    @property
    def weights(self) -> tuple:
        """What expert_ffn (dense: w_gate_up, w_down) or expert_ffn_quant (packed: gate, up, down) reads."""
        return (self.gate, self.up, self.down) if self.packed else (self.w_gate_up, self.w_down)

    @property
    def ffn_options(self) -> dict:
        """expert_ffn / expert_ffn_quant keyword arguments: the activation, and the biases where there are any."""
        if self.b_gate_up is None:
            return self.glu
        return {**self.glu, "b_gate_up": self.b_gate_up, "b_down": self.b_down}

    @property
    def nbytes(self) -> int:
        """Device bytes the pool holds, every slot and staging row (none when it aliases the store)."""
        if self.alias:
            return 0
        tensors = [t for w in self.weights for t in w.tensors().values()] if self.packed else list(self.weights)
        if self.b_gate_up is not None:
            tensors += [self.b_gate_up, self.b_down]
        return sum(t.numel() * t.element_size() for t in tensors)

    @property
    def tensors_per_expert(self) -> int:
        """Host -> device copies one load issues (none when the pool aliases the store)."""
        if self.alias:
            return 0
        weights = sum(len(w.tensors()) for w in self.weights) if self.packed else 2
        return weights + (2 if self.b_gate_up is not None else 0)

    def tensor_pairs(self, store: ExpertStore, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(host store [E, ...], pool [S, ...]) per expert tensor of `layer`: what one load moves, expert by expert
        (load) or as one gather of many (the device MoE)."""
        if self.packed:
            pairs = [(getattr(store, name)[layer].tensors()[t], tensor) for name in ("gate", "up", "down")
                     for t, tensor in getattr(self, name).tensors().items()]
        else:
            pairs = [(store.gate_up[layer], self.w_gate_up), (store.down[layer], self.w_down)]
        if self.b_gate_up is not None:
            pairs += [(store.b_gate_up[layer], self.b_gate_up), (store.b_down[layer], self.b_down)]
        return pairs

    def load(self, slot: int, store: ExpertStore, layer: int, expert: int) -> None:
        """Copy one expert host -> slot (asynchronous from pinned memory on the current CUDA stream)."""
        if self.alias:
            return
        for src, dst in self.tensor_pairs(store, layer):
            dst[slot].copy_(src[expert], non_blocking=True)
