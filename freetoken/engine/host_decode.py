"""A CPU-only engine's decode step (one sequence, or a batch of up to NATIVE_ROWS) in one host call
(freetoken/host/csrc/decode.c), where every layer is a plain attention + MoE layer: the same kernels, arguments and
roundings as the op-by-op Decoder.forward / forward_batch, so the same logits bit for bit, without the Python
between the ~10 calls of each layer. That Python runs with cold caches (each layer's weight stream evicts the
interpreter's working set: a placement plan takes 6.4 us warm, ~40 us there), and at short contexts it was a sixth
of a token's time. The layers' routing comes back in [L, B, K] buffers; the engine then records each layer's and
plans and counts the step's L calls in layer order, as its per-layer path would (HostDecode.run): a compiled policy
in one replay of the L calls (ExpertCache.account_step).

`reason(engine)` says in one line why an engine keeps the per-layer path (None: it takes this one); `ft generate`
and `ft serve` print it (decode_line).
"""

from __future__ import annotations

import ctypes
import weakref

import numpy as np
import torch

from freetoken.host import kernels as hk
from freetoken.host.native import DecodeArgs, DecodeLayer, act_kind, check


def reason(engine) -> str | None:
    """None when `engine`'s decode steps can run as one host call each, else why not."""
    from freetoken.engine.model import Decoder

    dec, cfg, cache = engine.decoder, engine.config, engine.cache
    if engine.kernels.name != "host":
        return f"kernel set {engine.kernels.name}"
    if not hk.available():
        return "the host kernels are not built here: torch runs them"
    if type(dec) is not Decoder or cache.device_moe is not None or not cache.executor.host_only:
        return "not a CPU-only engine with the plain decoder"
    if engine.hinting or cache.carry is not None:
        return "the router hint or the draft carry reads each layer as it runs"
    if tuple(cfg.moe_layers) != tuple(range(cfg.num_layers)):
        return "a dense layer"
    r = cfg.routing
    if r.score != "softmax" or r.n_group != 1 or cfg.num_experts > 4096:
        return "routing other than a plain softmax top-k"
    if dec.norm is None:
        return "no final norm"
    norms = {dec.norm.dtype}
    for l, lw in enumerate(dec.layers):
        if (dec.steps[l] is None or lw.deltanet is not None or lw.mla is not None
                or not isinstance(lw.router, torch.Tensor) or lw.router.dtype != dec.dtype
                or lw.shared_gate_up is not None or lw.router_bias is not None or lw.correction_bias is not None
                or lw.hash_table is not None or lw.input_norm is None or lw.post_norm is None):
            return f"layer {l} is not a plain attention + routed-experts layer"
        norms |= {lw.input_norm.dtype, lw.post_norm.dtype}
    if len(norms) != 1:
        return "norm weights of several dtypes"
    return None


def decode_line(engine) -> str:
    """What `ft generate` says about how a host-kernel engine's decode steps run."""
    why = reason(engine)
    if why is None:
        return "decode: one host call per token (every layer's kernels in C; then each MoE call's placement and counts)"
    return f"decode: layer by layer on the host ({why})"


def for_step(engine, kvs: list) -> HostDecode | None:
    """`engine`'s HostDecode (built at its first use) where the engine and these KV caches allow one (plain caches,
    at most NATIVE_ROWS sequences: more rows take torch's GEMM on the per-layer path), else None."""
    from freetoken.engine.kv import KVCache
    from freetoken.host.ops import NATIVE_ROWS

    if engine.one_call is None:
        engine.one_call = HostDecode(engine) if reason(engine) is None else False
    ok = (engine.one_call and len(kvs) <= NATIVE_ROWS and engine.decoder.on_layer is None
          and all(type(kv) is KVCache and not kv.fp8 for kv in kvs))
    return engine.one_call if ok else None


class _Batch:
    """The call's buffers and arguments for B sequences (fixed addresses); its attention steps point into the KV
    caches of its last call, repointed when other caches come."""

    def __init__(self, hd: HostDecode, B: int):
        dec, cfg = hd.decoder, hd.decoder.cfg
        L, D, K, E = cfg.num_layers, cfg.hidden_size, cfg.top_k, cfg.num_experts
        step = dec.steps[0]
        H, Hkv, Dh = step.heads, step.kv_heads, step.head_dim
        new = lambda *shape, dtype=dec.dtype: torch.zeros(*shape, dtype=dtype)  # noqa: E731
        self.x, self.y, self.h = new(B, D), new(B, D), new(B, D)
        self.qkv, self.q_buf, self.attn = new(B, (H + 2 * Hkv) * Dh), new(B, H * Dh), new(B, H * Dh)
        self.router_logits, self.logits = new(B, E), new(B, dec.lm_head.shape[0])
        self.ids, self.weights = new(L, B, K, dtype=torch.int32), new(L, B, K, dtype=torch.float32)
        self.positions = (ctypes.c_int64 * B)()
        self.steps = [hk.step_args(s) for s in dec.steps]
        self.layers = (DecodeLayer * L)()
        for l, (lw, (qkv, o, router, moe)) in enumerate(zip(dec.layers, hd.weights)):
            self.steps[l].positions = ctypes.addressof(self.positions)
            self.layers[l] = DecodeLayer(ctypes.pointer(qkv), ctypes.pointer(o), ctypes.pointer(router),
                                         ctypes.pointer(self.steps[l]), ctypes.pointer(moe), lw.input_norm.data_ptr(),
                                         lw.post_norm.data_ptr(), self.ids[l].data_ptr(), self.weights[l].data_ptr())
        self.args = DecodeArgs(B, L, D, E, K, act_kind(dec.dtype), act_kind(dec.norm.dtype),
                               int(dec.norm_kw.get("round_normed", True)), int(cfg.norm_topk_prob),
                               cfg.rms_norm_eps, cfg.routing.scale, self.layers, self.x.data_ptr(), self.y.data_ptr(),
                               self.h.data_ptr(), self.qkv.data_ptr(), self.q_buf.data_ptr(), self.attn.data_ptr(),
                               self.router_logits.data_ptr(), dec.norm.data_ptr(), ctypes.pointer(hd.head),
                               self.logits.data_ptr(), 0)
        self.kvs: tuple = ()  # weak references to the caches the steps point into (a finished one is not kept)

    def point_at(self, kvs: list) -> None:
        if len(self.kvs) == len(kvs) and all(r() is kv for r, kv in zip(self.kvs, kvs)):
            return
        for l, s in enumerate(self.steps):
            s.k_cache, s.v_cache = hk.pointers([kv.k[l] for kv in kvs]), hk.pointers([kv.v[l] for kv in kvs])
            s.kv_kind = act_kind(kvs[0].k[l].dtype)
        self.kvs = tuple(weakref.ref(kv) for kv in kvs)


class HostDecode:
    """The layers' weight descriptors for one engine, built once, and a _Batch per batch size seen."""

    def __init__(self, engine):
        dec, cfg, store = engine.decoder, engine.config, engine.store
        self.decoder = dec
        self.weights = [tuple(hk.linear_args(w, b) for w, b in ((lw.wqkv, lw.bqkv), (lw.wo, lw.bo), (lw.router, None)))
                        + (hk.moe_args(store.host_matrices(cfg.moe_index(l))),) for l, lw in enumerate(dec.layers)]
        self.head = hk.linear_args(dec.lm_head, None)
        self._batches: dict[int, _Batch] = {}

    def __call__(self, tokens: list[int], kvs: list, starts: list[int]) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """Sequence b's token at starts[b] of kvs[b] (plain caches, not fp8) -> (logits [B, V], ids [L, B, K] int32,
        weights [L, B, K] fp32), each a new array."""
        dec = self.decoder
        V = dec.cfg.vocab_size
        for kv, start in zip(kvs, starts):
            kv.check_room(start, 1)
        if min(tokens) < 0 or max(tokens) >= V:
            raise ValueError(f"token ids must lie in [0, {V}), got {min(tokens)}..{max(tokens)}")
        B = len(tokens)
        b = self._batches.get(B)
        if b is None:
            b = self._batches[B] = _Batch(self, B)
        b.point_at(kvs)
        torch.index_select(dec.embed, 0, torch.tensor(tokens), out=b.x)
        b.positions[:] = starts
        b.args.threads = hk.threads()
        check(hk.library().ft_decode(ctypes.byref(b.args)), "decode")
        for kv, start, token in zip(kvs, starts, tokens):
            kv.commit(start, [token])
        return b.logits.clone(), b.ids.numpy().copy(), b.weights.numpy().copy()

    def run(self, engine, tokens: list[int], kvs: list, starts: list[int], phase: int, request: int) -> torch.Tensor:
        """The sequences' tokens through `engine` (whose decoder this is): logits [B, V]; then each MoE call (the B
        tokens of a layer) recorded, planned and counted in layer order, as the per-layer path does after each
        layer's routing."""
        logits, ids, weights = self(tokens, kvs, starts)
        for layer in range(len(ids)):
            engine.routed_to_host(layer, ids[layer], weights[layer])
        engine.cache.account_step(ids, phase, request)
        return logits
