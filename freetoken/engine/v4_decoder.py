"""DeepSeek-V4's decoder (transformers' DeepseekV4Model + lm head): the embedding copied into hc_mult residual
streams; per layer, hyper-connections (kernels/hyper_connection.py) collapse the streams into the attention block's
input and spread its output back, then again around the MoE block (every layer routed: hash layers by the token ids'
table, the others by top-k; a shared expert); the final head collapses the streams, RMSNorm, lm head.

Same contract as model.Decoder (forward, forward_batch, new_kv, layers[l].router / post_norm for Engine.route), so
the engine, its expert cache and the server drive it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from freetoken.engine.kernelset import KernelSet
from freetoken.engine.model import LayerWeights, MoEFn
from freetoken.engine.v4_attention import V4AttentionWeights, load_v4_attention, v4_attention
from freetoken.engine.v4_kv import V4KV
from freetoken.models.checkpoint import Checkpoint
from freetoken.quant.packed import PackedWeight


@dataclass(slots=True)
class HyperWeights:
    fn: torch.Tensor  # [(2 + N) N, N D] fp32 (the head's: [N, N D])
    base: torch.Tensor  # fp32
    scale: torch.Tensor  # [3] fp32 (the head's: [1])


@dataclass(slots=True)
class V4Layer(LayerWeights):
    attn: V4AttentionWeights | None = None
    hc_attn: HyperWeights | None = None
    hc_ffn: HyperWeights | None = None


class V4Decoder:
    def __init__(self, ckpt: Checkpoint, kernels: KernelSet, device: torch.device, dtype: torch.dtype | None = None):
        cfg = ckpt.config
        self.cfg, self.kernels, self.device = cfg, kernels, torch.device(device)
        dtype = dtype or ckpt.dense["model.embed_tokens.weight"].dtype

        def get(name: str) -> torch.Tensor:
            t = ckpt.dense[name]
            if isinstance(t, PackedWeight):
                t = t.to_float(0)
            return t.to(self.device, dtype if t.is_floating_point() else t.dtype).contiguous()

        def fp32(name: str) -> torch.Tensor:  # transformers keeps norms, hyper-connections and biases in fp32
            return ckpt.dense[name].to(self.device, torch.float32).contiguous()

        def hyper(prefix: str) -> HyperWeights:
            return HyperWeights(fp32(prefix + "fn"), fp32(prefix + "base"), fp32(prefix + "scale"))

        self.embed = get("model.embed_tokens.weight")  # [V, D]
        self.dtype = self.embed.dtype
        self.norm = fp32("model.norm.weight")
        self.lm_head = self.embed if cfg.tie_word_embeddings else get("head.weight")
        self.head = HyperWeights(fp32("model.hc_head.hc_fn"), fp32("model.hc_head.hc_base"),
                                 fp32("model.hc_head.hc_scale"))
        self.norm_kw: dict = {}
        self.layers: list[V4Layer] = []
        for l in range(cfg.num_layers):
            p, f = f"model.layers.{l}.", f"model.layers.{l}.ffn."
            lw = V4Layer(fp32(p + "attn_norm.weight"), fp32(p + "ffn_norm.weight"),
                         attn=load_v4_attention(cfg, l, get, self.device), hc_attn=hyper(p + "hc_attn_"),
                         hc_ffn=hyper(p + "hc_ffn_"))
            lw.router = get(f + "gate.weight")
            if l in cfg.v4.hash_layers:
                lw.hash_table = ckpt.dense[f + "gate.tid2eid"].to(self.device, torch.long)  # [V, K]
            else:
                lw.correction_bias = fp32(f + "gate.bias")
            if cfg.shared_expert_intermediate:
                s = f + "shared_experts."
                lw.shared_gate_up = torch.cat([get(s + "w1.weight"), get(s + "w3.weight")])[None].contiguous()
                lw.shared_down = get(s + "w2.weight")[None].contiguous()
            self.layers.append(lw)
        self.token_ids = torch.empty(0, dtype=torch.long, device=self.device)  # the current forward's (hash routing)

    def new_kv(self, max_tokens: int, kv_dtype: str = "auto") -> V4KV:
        return V4KV(self.cfg, max_tokens, self.dtype, self.device, kv_dtype)

    def forward(self, token_ids: list[int], kv: V4KV, start_pos: int, moe: MoEFn,
                all_logits: bool = False) -> torch.Tensor:
        """T tokens at positions [start_pos, start_pos + T): logits [T, V] (all_logits) or [1, V] (last)."""
        T = len(token_ids)
        kv.check_room(start_pos, T)
        positions = torch.arange(start_pos, start_pos + T, dtype=torch.int64, device=self.device)
        x = self._run(token_ids, [kv], [start_pos], [T], positions, moe)
        kv.commit(start_pos, token_ids)
        return self._logits(x if all_logits else x[-1:])

    def forward_batch(self, token_ids: list[int], kvs: list[V4KV], moe: MoEFn) -> torch.Tensor:
        """One decode step of B sequences (token i at position kvs[i].length of its own cache): every projection and
        the MoE once over the B rows, each sequence's compression and attention on its own cache. Logits [B, V].
        A compressor's window rows are addressed by position, so a failed step can be stepped again."""
        starts = [kv.length for kv in kvs]
        for kv, start in zip(kvs, starts):
            kv.check_room(start, 1)
        positions = torch.tensor(starts, dtype=torch.int64, device=self.device)
        x = self._run(token_ids, kvs, starts, [1] * len(kvs), positions, moe)
        for kv, start, token in zip(kvs, starts, token_ids):
            kv.commit(start, [token])
        return self._logits(x)

    def _run(self, token_ids: list[int], kvs: list[V4KV], starts: list[int], counts: list[int],
             positions: torch.Tensor, moe: MoEFn) -> torch.Tensor:
        """The layers over rows [N] -> the streams collapsed by the head, [N, D]."""
        cfg, ks, v = self.cfg, self.kernels, self.cfg.v4
        ids = torch.tensor(token_ids, dtype=torch.long)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size):
            raise ValueError(f"token ids must lie in [0, {cfg.vocab_size}), got {ids.min().item()}..{ids.max().item()}")
        self.token_ids = ids.to(self.device)
        x = self.embed[self.token_ids][:, None, :].expand(-1, v.hc_mult, -1).contiguous()  # [N, hc, D]
        for l, lw in enumerate(self.layers):
            post, comb, collapsed = self._hc(x, lw.hc_attn)
            h = ks.rms_norm(collapsed, lw.input_norm, cfg.rms_norm_eps)
            x = ks.hc_post(x, v4_attention(ks, cfg, lw.attn, l, h, kvs, starts, counts, positions), post, comb)
            post, comb, collapsed = self._hc(x, lw.hc_ffn)
            h = ks.rms_norm(collapsed, lw.post_norm, cfg.rms_norm_eps)
            y = moe(cfg.moe_index(l), h, collapsed)
            if lw.shared_gate_up is not None:
                y = y + self._shared(lw, h)
            x = ks.hc_post(x, y, post, comb)
        return ks.hc_head(x, self.head.fn, self.head.base, self.head.scale, cfg.rms_norm_eps, v.hc_eps)

    def _hc(self, x: torch.Tensor, w: HyperWeights):
        v = self.cfg.v4
        return self.kernels.hc_pre(x, w.fn, w.base, w.scale, self.cfg.rms_norm_eps, v.hc_eps, v.hc_iters)

    def _shared(self, lw: V4Layer, h: torch.Tensor) -> torch.Tensor:
        """The shared expert through expert_ffn (one slot, weight 1), with the routed experts' clamped activation."""
        T = h.shape[0]
        slot0 = torch.zeros((T, 1), dtype=torch.int32, device=self.device)
        ones = torch.ones((T, 1), dtype=torch.float32, device=self.device)
        return self.kernels.expert_ffn(h, slot0, ones, lw.shared_gate_up, lw.shared_down, glu=self.cfg.expert_glu,
                                       limit=self.cfg.glu_limit)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        ks = self.kernels
        return ks.linear(ks.rms_norm(x, self.norm, self.cfg.rms_norm_eps), self.lm_head)
