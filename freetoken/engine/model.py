"""The shared decoder: embedding, per layer (RMSNorm, GQA attention with rope over the KV cache, routed MoE or dense
MLP), final norm, LM head. Every device op is a call into the kernel set; torch only glues (views, residual adds).
Per-family options come from the ModelConfig: biases, attention sinks, sliding-window layers, YaRN rope, DeepSeek's
multi-head latent attention (mla.py) in place of q/k/v/o.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from freetoken.engine.dsa import DSAKVCache
from freetoken.engine.gated_deltanet import DeltaNetWeights, deltanet, load_deltanet
from freetoken.engine.hybrid_kv import HybridKV
from freetoken.engine.kernelset import KernelSet
from freetoken.engine.kv import KVCache
from freetoken.engine.mla import MLAWeights, load_mla, mla_attention, mla_attention_batch
from freetoken.engine.runtime import host_kernels_built
from freetoken.kernels.rope import yarn_inv_freq
from freetoken.models.checkpoint import Checkpoint
from freetoken.models.family import ATTN
from freetoken.quant.packed import PackedWeight, cat_rows


# (MoE layer index, normed hidden [T, D], the residual it was normed from [T, D]) -> MoE output [T, D]: the expert
# cache's entry point (the residual feeds the next layer's early router: the live router hint)
MoEFn = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    wqkv: torch.Tensor | None = None  # [H Dh + 2 Hkv Dh, D] q, k, v rows in one matrix (one launch); None with MLA
    wo: torch.Tensor | None = None
    mla: MLAWeights | None = None
    deltanet: DeltaNetWeights | None = None  # a Gated DeltaNet layer instead of attention (no KV)
    out_gate: torch.Tensor | None = None  # [H Dh, D]: attention output *= sigmoid(h @ out_gate^T) (Qwen3-Next)
    bqkv: torch.Tensor | None = None  # [H Dh + 2 Hkv Dh] (zeros where a checkpoint has only some of the three)
    bo: torch.Tensor | None = None
    sinks: torch.Tensor | None = None  # [H] fp32: per-head logits joining the softmax denominator (gpt-oss)
    window: int | None = None  # sliding-window attention: the last `window` keys
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    router: torch.Tensor | None = None  # [E, D] on MoE layers
    router_bias: torch.Tensor | None = None  # [E]
    correction_bias: torch.Tensor | None = None  # [E] fp32: added to the router scores for the choice (DeepSeek-V3)
    hash_table: torch.Tensor | None = None  # [V, K] long: a hash-routed layer's picks per token id (DeepSeek-V4)
    dense_gate_up: torch.Tensor | None = None  # [1, 2F, D] on dense layers (expert_ffn with one slot)
    dense_down: torch.Tensor | None = None  # [1, D, F]
    shared_gate_up: torch.Tensor | None = None  # [1, 2F, D] the always-on shared expert of a MoE layer
    shared_down: torch.Tensor | None = None  # [1, D, F]
    shared_gate: torch.Tensor | None = None  # [1, D] sigmoid gate on the shared expert's output


class Decoder:
    def __init__(self, ckpt: Checkpoint, kernels: KernelSet, device: torch.device, dtype: torch.dtype | None = None):
        cfg, fam = ckpt.config, ckpt.family
        self.cfg, self.kernels, self.device = cfg, kernels, torch.device(device)
        self.on_layer: Callable[[int], None] | None = None  # told each layer's index, then L (launch_count)

        packed_ok = kernels.name == "host" and host_kernels_built()

        def dev(name: str) -> torch.Tensor:
            t = ckpt.dense[name]
            if isinstance(t, PackedWeight):  # a quantized projection: kept packed for the host kernels
                if packed_ok:
                    return t
                t = t.to_float(0).to(dtype or ckpt.dense["model.embed_tokens.weight"].dtype)
            return t.to(self.device, dtype or t.dtype).contiguous()

        def opt(name: str) -> torch.Tensor | None:
            return dev(name) if name in ckpt.dense else None

        def norm(name: str) -> torch.Tensor | None:
            """An RMSNorm weight; stored as w - 1 (norm_unit_offset): 1 + w in fp32, as HF's (1 + w.float())."""
            if not cfg.norm_unit_offset or name not in ckpt.dense:
                return opt(name)
            return (ckpt.dense[name].float() + 1.0).to(self.device).contiguous()

        self.embed = dev("model.embed_tokens.weight")  # [V, D]
        self.dtype = self.embed.dtype
        self.norm = norm("model.norm.weight")
        self.lm_head = self.embed if cfg.tie_word_embeddings else dev("lm_head.weight")
        self.layers: list[LayerWeights] = []
        for l in range(cfg.num_layers):
            a = ATTN.format(l=l)
            lw = LayerWeights(
                norm(f"model.layers.{l}.input_layernorm.weight"), norm(f"model.layers.{l}.post_attention_layernorm.weight"))
            if cfg.is_linear(l):
                lw.deltanet = load_deltanet(cfg, l, dev)
            elif cfg.mla is not None:
                lw.mla = load_mla(cfg, l, dev, opt)
            else:
                wq, wk, wv, lw.wo = (dev(a + p + ".weight") for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
                lw.wqkv = cat_rows([wq, wk, wv]) if isinstance(wq, PackedWeight) else None
                if lw.wqkv is None:  # plain tensors (a packed set that cannot share one matrix is dequantized)
                    wq, wk, wv = (self._plain(w) for w in (wq, wk, wv))
                    if cfg.attention_output_gate:  # q_proj rows per head: q (Dh), then its gate (Dh)
                        rows = wq.view(cfg.num_heads, 2, cfg.head_dim, -1)
                        wq, lw.out_gate = (rows[:, i].reshape(-1, rows.shape[-1]).contiguous() for i in (0, 1))
                    lw.wqkv = torch.cat([wq, wk, wv]).contiguous()  # the three projections as one decode launch
                elif cfg.attention_output_gate:  # the gate rows interleave with q's: split them as plain tensors
                    wq = self._plain(wq)
                    rows = wq.view(cfg.num_heads, 2, cfg.head_dim, -1)
                    wq, lw.out_gate = (rows[:, i].reshape(-1, rows.shape[-1]).contiguous() for i in (0, 1))
                    lw.wqkv = torch.cat([wq, self._plain(wk), self._plain(wv)]).contiguous()
                del wq, wk, wv
                biases = [opt(a + p + ".bias") for p in ("q_proj", "k_proj", "v_proj")]
                if any(b is not None for b in biases):
                    sizes = (cfg.num_heads * cfg.head_dim,) + (cfg.num_kv_heads * cfg.head_dim,) * 2
                    dtype = next(b.dtype for b in biases if b is not None)
                    lw.bqkv = torch.cat([torch.zeros(n, dtype=dtype, device=self.device) if b is None
                                         else b for b, n in zip(biases, sizes)])
                lw.bo = opt(a + "o_proj.bias")
                lw.window = cfg.window(l)
                lw.q_norm, lw.k_norm = norm(fam.q_norm.format(l=l)), norm(fam.k_norm.format(l=l))
            if cfg.attention_sinks:
                lw.sinks = ckpt.dense[fam.sinks.format(l=l)].to(self.device, torch.float32).contiguous()
            def mlp(prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
                """A SwiGLU MLP as one expert_ffn slot: gate_up [1, 2F, D], down [1, D, F]."""
                gate, up, down = fam.mlp_tensors(prefix)
                return torch.cat([dev(gate), dev(up)])[None].contiguous(), dev(down)[None].contiguous()

            if cfg.moe_index(l) >= 0:
                m = fam.moe_prefix.format(l=l)
                lw.router = dev(m + fam.router)
                if cfg.routing.fp32:  # HF keeps this gate in fp32 whatever the model's dtype
                    lw.router = lw.router.float()
                if cfg.router_bias:
                    lw.router_bias = dev(m + fam.router_bias)
                if cfg.routing.correction_bias:
                    lw.correction_bias = ckpt.dense[m + fam.correction_bias].to(self.device, torch.float32).contiguous()
                if cfg.shared_expert_intermediate:
                    lw.shared_gate_up, lw.shared_down = mlp(m + fam.shared_expert)
                if cfg.shared_expert_gate:
                    lw.shared_gate = dev(m + fam.shared_expert_gate)
            else:
                lw.dense_gate_up, lw.dense_down = mlp(fam.dense_prefix.format(l=l))
            self.layers.append(lw)
        self.sm_scale = 1.0 / math.sqrt(cfg.head_dim)
        rotary_dim = cfg.rotary_dim or cfg.head_dim
        if cfg.mla is not None:  # the unpadded q . k width, and rope on the rope dims only
            self.sm_scale = cfg.mla.qk_head_dim ** -0.5 * cfg.mla.softmax_mscale
            rotary_dim = cfg.mla.qk_rope_head_dim
        self.rope = {}  # apply_rope's scaled-rope options: YaRN's frequencies and cos/sin scale
        if cfg.rope_yarn is not None:
            y = cfg.rope_yarn
            inv_freq, scale = yarn_inv_freq(cfg.rope_theta, rotary_dim, y.factor, y.original_max_position_embeddings,
                                            y.beta_fast, y.beta_slow, y.truncate, y.attention_factor)
            self.rope = {"inv_freq": inv_freq.to(self.device), "scale": scale}
        self.rotary_dim = rotary_dim
        self.norm_kw = {"round_normed": False} if cfg.norm_unit_offset else {}  # HF's (1 + w) norm rounds once
        # the host kernels' one-call decode attention (norms, rope, KV write, attention) where a layer allows it
        self.steps = [self._step_layer(lw) for lw in self.layers] if kernels.name == "host" else [None] * len(self.layers)

    def _step_layer(self, lw: LayerWeights):
        """The layer as freetoken.host's attention_step reads it, or None where a feature of the layer needs the
        op-by-op path (latent / linear attention, an output gate, clipped qkv) or the host kernels are not built."""
        from freetoken.host import kernels as hk
        from freetoken.kernels.rope import _inv_freq

        cfg = self.cfg
        if lw.wqkv is None or lw.out_gate is not None or cfg.clip_qkv is not None or not hk.available() \
                or cfg.qk_norm not in ("none", "head", "full") or self.rotary_dim % 2 or self.rotary_dim > 1024:
            return None
        inv_freq = self.rope.get("inv_freq")
        inv_freq = _inv_freq(cfg.rope_theta, self.rotary_dim, "cpu") if inv_freq is None else inv_freq
        full = cfg.qk_norm == "full"
        return hk.StepLayer(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, self.sm_scale,
                            inv_freq.float().contiguous(), self.rotary_dim, float(self.rope.get("scale", 1.0)),
                            lw.q_norm, lw.k_norm, full, cfg.rms_norm_eps,
                            True if full else self.norm_kw.get("round_normed", True), lw.sinks, lw.window)

    def _plain(self, w):
        """A kept-packed projection as a plain tensor in the compute dtype."""
        return w.to_float(0).to(self.embed.dtype).contiguous() if isinstance(w, PackedWeight) else w

    def new_kv(self, max_tokens: int, kv_dtype: str = "auto") -> KVCache:
        """kv_dtype: auto (the model's dtype), bf16 or fp8 (freetoken/kernels/kv_fp8.py)."""
        cfg = self.cfg
        if cfg.dsa is not None:
            return DSAKVCache(cfg, max_tokens, self.dtype, self.device, kv_dtype)
        if cfg.linear_attention is not None:
            return HybridKV(cfg, max_tokens, self.dtype, self.device, kv_dtype)
        return KVCache(cfg.num_layers, max_tokens, cfg.num_kv_heads, cfg.head_dim, self.dtype, self.device,
                       kv_dtype=kv_dtype)

    def forward(self, token_ids: list[int], kv: KVCache, start_pos: int, moe: MoEFn,
                all_logits: bool = False) -> torch.Tensor:
        """Run T tokens at positions [start_pos, start_pos + T); logits [T, V] (all_logits) or [1, V] (last)."""
        cfg, ks = self.cfg, self.kernels
        T = len(token_ids)
        kv.check_room(start_pos, T)
        ids = torch.tensor(token_ids, dtype=torch.long)
        if T and (int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size):
            raise ValueError(f"token ids must lie in [0, {cfg.vocab_size}), got {ids.min().item()}..{ids.max().item()}")
        x = self.embed[ids.to(self.device)]  # [T, D]
        positions = torch.arange(start_pos, start_pos + T, dtype=torch.int64, device=self.device)
        y = None  # the last sublayer's output: the next norm adds it into the residual x
        for l, lw in enumerate(self.layers):
            if self.on_layer is not None:
                self.on_layer(l)
            if T == 1 and self.fused_qkv(l, kv, x, y):  # the input norm and the qkv projection in one kernel
                x, qkv = ks.add_norm_linear(x, y, lw.input_norm, cfg.rms_norm_eps, lw.wqkv, lw.bqkv, **self.norm_kw)
                y = self._attend_qkv(l, lw, qkv, kv, start_pos, positions)
            else:
                x, h = self._add_norm(x, y, lw.input_norm)
                if lw.deltanet is not None:
                    y = deltanet(ks, cfg, lw.deltanet, h, kv.conv[l], kv.state[l])
                elif lw.mla is not None:
                    y = mla_attention(ks, cfg, lw.mla, l, h, kv, start_pos, positions, self.sm_scale, self.rope)
                else:
                    y = self._attention(l, lw, h, kv, start_pos, positions)
            x, h = self._add_norm(x, y, lw.post_norm)
            y = self._ffn(l, lw, x, h, moe)
        if self.on_layer is not None:
            self.on_layer(len(self.layers))
        kv.commit(start_pos, token_ids)
        if not all_logits:
            x, y = x[-1:], None if y is None else y[-1:]
        return ks.linear(self._add_norm(x, y, self.norm)[1], self.lm_head)

    def forward_batch(self, token_ids: list[int], kvs: list[KVCache], moe: MoEFn) -> torch.Tensor:
        """One decode step of B sequences, token i at position kvs[i].length of its own KV cache: everything on
        [B, D] (one MoE call per layer over the union of their experts); attention in one host call per layer with
        the host kernels (per sequence otherwise); latent attention (MLA, DSA) projects the batch at once and
        attends per sequence; Gated DeltaNet steps the B sequences' states stacked, written back once the whole
        step has run (a failed step leaves every sequence as it was). Logits [B, V].
        """
        cfg, ks = self.cfg, self.kernels
        starts = [kv.length for kv in kvs]
        for kv, start in zip(kvs, starts):
            kv.check_room(start, 1)
        ids = torch.tensor(token_ids, dtype=torch.long)
        if int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size:
            raise ValueError(f"token ids must lie in [0, {cfg.vocab_size}), got {ids.min().item()}..{ids.max().item()}")
        x = self.embed[ids.to(self.device)]  # [B, D]
        positions = torch.tensor(starts, dtype=torch.int64, device=self.device)  # [B]
        stacked = []  # (layer, conv [B, C, K - 1], state [B, Hv, Dk, Dv]) of the DeltaNet layers, stepped
        y = None  # the last sublayer's output: the next norm adds it into the residual x
        for l, lw in enumerate(self.layers):
            if self.on_layer is not None:
                self.on_layer(l)
            x, h = self._add_norm(x, y, lw.input_norm)
            if lw.deltanet is not None:
                conv = torch.stack([kv.conv[l] for kv in kvs])
                state = torch.stack([kv.state[l] for kv in kvs])
                y = deltanet(ks, cfg, lw.deltanet, h, conv, state, batch=True)
                stacked.append((l, conv, state))
            elif lw.mla is not None:
                y = mla_attention_batch(ks, cfg, lw.mla, l, h, kvs, starts, positions, self.sm_scale, self.rope)
            else:
                y = self._attention_batch(l, lw, h, kvs, starts, positions)
            x, h = self._add_norm(x, y, lw.post_norm)
            y = self._ffn(l, lw, x, h, moe)
        if self.on_layer is not None:
            self.on_layer(len(self.layers))
        for l, conv, state in stacked:
            for b, kv in enumerate(kvs):
                kv.conv[l].copy_(conv[b])
                kv.state[l].copy_(state[b])
        for kv, start, token in zip(kvs, starts, token_ids):
            kv.commit(start, [token])
        return ks.linear(self._add_norm(x, y, self.norm)[1], self.lm_head)

    def _attention_batch(self, l: int, lw: LayerWeights, h: torch.Tensor, kvs: list[KVCache], starts: list[int],
                         positions: torch.Tensor) -> torch.Tensor:
        """Plain attention of a decode batch h [B, D] -> [B, D]."""
        step = self.steps[l]
        if step is not None and not kvs[0].fp8:  # the host kernels: one call for the batch
            return self._out(lw, h, self._attention_step(step, lw, h, kvs, starts, l))
        q, k, v = self._project(lw, h, positions)
        if self.kernels.name == "host":
            o = self._attend_batch(l, lw, kvs, starts, q, k, v)  # [B, H, Dh]
        else:
            o = torch.cat([self._attend(l, lw, kv, start, q[i:i + 1], k[i:i + 1], v[i:i + 1])
                           for i, (kv, start) in enumerate(zip(kvs, starts))])  # [B, H, Dh]
        return self._out(lw, h, o)

    def _add_norm(self, x: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor):
        """(x + y, RMSNorm(x + y)) [T, D] each (y None: x as is): one add_rms_norm launch where the kernel set has
        it, the residual add and rms_norm otherwise."""
        ks, eps = self.kernels, self.cfg.rms_norm_eps
        if y is not None and ks.add_rms_norm is not None and y.dtype == x.dtype:
            return ks.add_rms_norm(x, y, weight, eps, **self.norm_kw)
        x = x if y is None else x + y
        return x, ks.rms_norm(x, weight, eps, **self.norm_kw)

    def _ffn(self, l: int, lw: LayerWeights, x: torch.Tensor, h: torch.Tensor, moe: MoEFn) -> torch.Tensor:
        """The layer's MLP half on the residual x [T, D] and its post-attention norm h: routed MoE (+ shared
        expert) or the dense MLP."""
        if lw.router is None:
            return self._one_mlp(h, lw.dense_gate_up, lw.dense_down, None)
        out = moe(self.cfg.moe_index(l), h, x)
        return out + self._shared_expert(lw, h) if lw.shared_gate_up is not None else out

    def _one_mlp(self, h: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                 scale: torch.Tensor | None) -> torch.Tensor:
        """A dense SwiGLU MLP through expert_ffn: every token picks slot 0 with weight `scale` [T, 1] (or 1)."""
        T = h.shape[0]
        slot0 = torch.zeros((T, 1), dtype=torch.int32, device=self.device)
        if scale is None:
            scale = torch.ones((T, 1), dtype=torch.float32, device=self.device)
        return self.kernels.expert_ffn(h, slot0, scale, gate_up, down)

    def _shared_expert(self, lw: LayerWeights, h: torch.Tensor) -> torch.Tensor:
        scale = None
        if lw.shared_gate is not None:  # Qwen2-MoE: sigmoid(h @ w_gate) per token, as the expert's routing weight
            scale = torch.sigmoid(self.kernels.linear(h, lw.shared_gate).float())  # [T, 1]
        return self._one_mlp(h, lw.shared_gate_up, lw.shared_down, scale)

    def _attention(self, l: int, lw: LayerWeights, h: torch.Tensor, kv: KVCache, start_pos: int,
                   positions: torch.Tensor) -> torch.Tensor:
        step = self.steps[l]
        if step is not None and h.shape[0] == 1 and not kv.fp8:  # a decode token on the host: one call
            return self._out(lw, h, self._attention_step(step, lw, h, [kv], [start_pos], l))
        if self.fused_prologue(lw, kv):  # q / k norms, rope and the KV writes in one kernel
            return self._attend_qkv(l, lw, self.kernels.linear(h, lw.wqkv, lw.bqkv), kv, start_pos, positions)
        return self._out(lw, h, self._attend(l, lw, kv, start_pos, *self._project(lw, h, positions)))

    def _attend_qkv(self, l: int, lw: LayerWeights, qkv: torch.Tensor, kv: KVCache, start_pos: int,
                    positions: torch.Tensor) -> torch.Tensor:
        """Attention from the qkv projection [T, (H + 2 Hkv) Dh] through qk_norm_rope (fused_prologue) -> [T, D]."""
        cfg = self.cfg
        norms = (lw.q_norm, lw.k_norm) if cfg.qk_norm == "head" else (None, None)
        q = self.kernels.qk_norm_rope(qkv, cfg.num_heads, cfg.num_kv_heads, *norms, cfg.rms_norm_eps, positions,
                                      cfg.rope_theta, kv.k[l], kv.v[l], start_pos, self.rotary_dim, **self.rope,
                                      **self.norm_kw)
        o = self.kernels.attention(q, kv.k[l], kv.v[l], start_pos, self.sm_scale, sinks=lw.sinks, window=lw.window)
        return self._out(lw, None, o)  # (no output gate under fused_prologue)

    def fused_qkv(self, l: int, kv: KVCache, x: torch.Tensor, y: torch.Tensor | None) -> bool:
        """Whether a decode token's input norm and qkv projection run as one add_norm_linear: a plain attention
        layer with the fused prologue, not the host kernels' one-call step, and a kernel set that has it."""
        lw = self.layers[l]
        return (self.kernels.add_norm_linear is not None and lw.deltanet is None and lw.mla is None
                and self.steps[l] is None and self.fused_prologue(lw, kv) and (y is None or y.dtype == x.dtype))

    def fused_prologue(self, lw: LayerWeights, kv: KVCache) -> bool:
        """Whether attention's prologue runs as one qk_norm_rope call: per-head or no q / k norm, no clipping, no
        output gate, a plain (not fp8) cache, and a kernel set that has it."""
        cfg = self.cfg
        return (self.kernels.qk_norm_rope is not None and cfg.qk_norm in ("head", "none") and cfg.clip_qkv is None
                and lw.out_gate is None and not kv.fp8)

    def _attention_step(self, step, lw: LayerWeights, h: torch.Tensor, kvs: list[KVCache], starts: list[int],
                        l: int) -> torch.Tensor:
        """The qkv projection, then q / k norms, rope, the KV writes and attention in one host call -> [B, H, Dh]."""
        from freetoken.host.kernels import attention_step

        qkv = self.kernels.linear(h, lw.wqkv, lw.bqkv)  # [B, (H + 2 Hkv) Dh]
        return attention_step(qkv, step, starts, [kv.k[l] for kv in kvs], [kv.v[l] for kv in kvs])

    def _project(self, lw: LayerWeights, h: torch.Tensor, positions: torch.Tensor):
        """q [T, H, Dh], k and v [T, Hkv, Dh] of normed h [T, D], rope applied at positions [T]."""
        cfg, ks = self.cfg, self.kernels
        T, H, Hkv, Dh = h.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q, k, v = ks.linear(h, lw.wqkv, lw.bqkv).split([H * Dh, Hkv * Dh, Hkv * Dh], dim=1)  # row-strided views
        if cfg.qk_norm == "full":  # OLMoE: over the whole projection
            q, k = ks.rms_norm(q, lw.q_norm, cfg.rms_norm_eps), ks.rms_norm(k, lw.k_norm, cfg.rms_norm_eps)
        if cfg.clip_qkv is not None:
            c = cfg.clip_qkv
            q, k, v = q.clamp(-c, c), k.clamp(-c, c), v.clamp(-c, c)
        q, k, v = q.view(T, H, Dh), k.view(T, Hkv, Dh), v.view(T, Hkv, Dh)
        if cfg.qk_norm == "head":  # Qwen3: per head
            q = ks.rms_norm(q.reshape(T * H, Dh), lw.q_norm, cfg.rms_norm_eps, **self.norm_kw).view(T, H, Dh)
            k = ks.rms_norm(k.reshape(T * Hkv, Dh), lw.k_norm, cfg.rms_norm_eps, **self.norm_kw).view(T, Hkv, Dh)
        q = ks.apply_rope(q.contiguous(), positions, cfg.rope_theta, self.rotary_dim, **self.rope)
        k = ks.apply_rope(k.contiguous(), positions, cfg.rope_theta, self.rotary_dim, **self.rope)
        return q, k, v

    def _attend(self, l: int, lw: LayerWeights, kv: KVCache, start_pos: int, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> torch.Tensor:
        """Writes k, v [T, Hkv, Dh] at start_pos, then attention of q [T, H, Dh] over the cache -> [T, H, Dh]."""
        kv.write(l, start_pos, k, v)
        return self.kernels.attention(q.contiguous(), kv.k[l], kv.v[l], start_pos, self.sm_scale, sinks=lw.sinks,
                                      window=lw.window, **kv.scales(l))

    def _attend_batch(self, l: int, lw: LayerWeights, kvs: list[KVCache], starts: list[int], q: torch.Tensor,
                      k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Each sequence's k, v [1, Hkv, Dh] written at its position, then one attention call for the batch."""
        from freetoken.host.ops import attention_decode_batch

        for i, (kv, start) in enumerate(zip(kvs, starts)):
            kv.write(l, start, k[i:i + 1], v[i:i + 1])
        scales = [kv.scales(l) for kv in kvs]
        fp8 = {"k_scales": [s["k_scale"] for s in scales], "v_scales": [s["v_scale"] for s in scales]} \
            if scales[0] else {}
        return attention_decode_batch(q.contiguous(), [kv.k[l] for kv in kvs], [kv.v[l] for kv in kvs], starts,
                                      self.sm_scale, lw.sinks, lw.window, **fp8)

    def _out(self, lw: LayerWeights, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """o [T, H, Dh] -> the output projection [T, D] (gated by sigmoid(h @ out_gate) where the model has one)."""
        o = o.reshape(o.shape[0], -1)
        if lw.out_gate is not None:
            o = o * torch.sigmoid(self.kernels.linear(h, lw.out_gate))
        return self.kernels.linear(o, lw.wo, lw.bo)
