"""The live engine: a loaded model, its expert cache, generation over a reusable KV cache, routing recorded.

    engine = Engine.from_pretrained(DIR, cache=CacheConfig("lru", fraction=0.5))  # freetoken.placement.CacheConfig
    for token in engine.generate(ids, SamplingParams(greedy=True), max_tokens=32): ...

A server drives the same object: generate() is an iterator (stream tokens as they come), a KVCache passed in is
reused and extended (its explicit length and token ids allow prefix reuse), counters say what the cache did.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from freetoken.engine.cache import CacheConfig, ExpertCache
from freetoken.engine.draft import DraftConfig, DraftStats, generate_drafted
from freetoken.engine.decode_graphs import LaneParts, MoEGraphs, decode_line
from freetoken.engine import host_decode
from freetoken.engine.host_counters import HostCounters, counted
from freetoken.engine.kernelset import kernel_set
from freetoken.engine.penalties import history_shaped
from freetoken.defaults import context_length
from freetoken.kv_dtype import check_kv_dtype
from freetoken.engine.kv import KVCache
from freetoken.engine.launch_count import LaunchCounter, StepCount, synchronize
from freetoken.engine.model import Decoder
from freetoken.engine.recorder import TraceRecorder
from freetoken.engine.runtime import host_kernels_built, host_kernels_note, resolve_device, set_host_threads
from freetoken.engine.v4_decoder import V4Decoder
from freetoken.engine.sampling import Sampler, SamplingParams, load_generation_defaults
from freetoken.engine.slots import ExpertStore
from freetoken.engine.step_clock import StepClock
from freetoken.host.gemm_caches import bound_ideep_cache
from freetoken.host.malloc import keep_freed_memory
from freetoken.models.checkpoint import Checkpoint, load_checkpoint
from freetoken.models.tokenizer import load_tokenizer
from freetoken.placement import DECODE, PREFILL
from freetoken.placement.router_hint import predicted_keys
from freetoken.quant.head import head_weights


COUNTED_STEP = 1  # generate()'s counted decode step: the second (the first captures the CUDA graphs)


@dataclass(slots=True)
class RunStats:
    prefill_tokens: int = 0
    decode_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s else 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s else 0.0


class Engine:
    def __init__(self, ckpt: Checkpoint, cache: CacheConfig | None = None, *, kernels: str = "triton",
                 device: str | torch.device | None = None, dtype: torch.dtype | None = None,
                 prefill_chunk: int | None = None, max_context: int | None = None,
                 keep_plans: bool = False, record: bool = True, tokenizer=None, pipeline: bool | None = None,
                 router_hint: bool | None = None, kv_dtype: str = "auto", placement: str = "auto",
                 eager: bool = False, threads: int | None = None, lm_head: str = "checkpoint"):
        """cache None: every expert resident. prefill_chunk None: the cache config's (one value for both).
        router_hint: run the early router (layer l + 1's on layer l's hidden state) and record its predictions in
        the trace; None: on when the policy takes it live (option hint="router"). It runs on the host placement path.
        kv_dtype: the KV cache's storage, auto (the model's dtype), bf16 or fp8 (e4m3 + scales).
        placement: where the policy decides (auto: the device on CUDA when it can; device; host; cache.PLACEMENTS).
        eager: no CUDA graphs for the decode step's MoE blocks (graphs need CUDA and the device placement).
        threads: host threads of torch and the host kernels alike (None: torch's, by default the physical cores).
        lm_head: the checkpoint's head, or int8 (quantized at load, read packed by the host kernels: quant/head.py)."""
        self.kv_dtype = check_kv_dtype(kv_dtype, "kv_dtype")
        self.threads = set_host_threads(threads)
        keep_freed_memory()  # prefill temporaries reuse freed heap instead of faulting fresh pages in
        bound_ideep_cache()  # before the first bf16 matmul: ideep reads it once
        if router_hint:
            if placement == "device":
                raise ValueError("the router hint runs on the host placement path: use placement 'auto' or 'host'")
            placement = "host"
        cache = cache or CacheConfig(fraction=1.0)
        if prefill_chunk is not None and prefill_chunk != cache.prefill_chunk:
            cache = replace(cache, prefill_chunk=prefill_chunk)  # validated again, the field named
        self.config, self.checkpoint = ckpt.config, ckpt
        self.device = resolve_device(device)
        self.host = HostCounters()  # launches, syncs, copies (the cost model's sim.overhead counts)
        ks = kernel_set(kernels)  # the host set runs no device kernels: nothing to count per call
        self.kernels = ks if ks.name == "host" else counted(ks, self.host)
        self.host_note = host_kernels_note(ks.name)
        self.decoder = (V4Decoder if ckpt.config.v4 is not None else Decoder)(ckpt, self.kernels, self.device, dtype)
        self.decoder.lm_head = head_weights(self.decoder.lm_head, lm_head, ks.name == "host" and host_kernels_built())
        self.store = ExpertStore.from_checkpoint(ckpt, dtype)  # packed experts stay packed
        self.cache = ExpertCache(self.store, cache, self.kernels, self.device, keep_plans, pipeline, host=self.host,
                                 placement=placement)
        self.prefill_chunk = cache.prefill_chunk
        self.hinting = self.cache.router_hint is not None if router_hint is None else router_hint
        if self.cache.router_hint is not None and not self.hinting:
            raise ValueError("the policy reads the router hint (hint='router'), so router_hint cannot be off")
        self.max_context = context_length(self.config, max_context)
        self.tokenizer = tokenizer
        self.generation_defaults = load_generation_defaults(ckpt.path)
        cfg = self.config
        self.recorder = TraceRecorder(cfg.num_moe_layers, cfg.top_k, cfg.num_experts, cfg.architecture) if record else None
        self.stats = RunStats()
        self.clock = StepClock(self.device)
        self.draft_stats = DraftStats()
        self._turns: dict[int, int] = {}
        self._phase, self._request = PREFILL, 0
        self._routed: list[np.ndarray] = []  # [T, K] per MoE layer of the current forward (carry, unrecorded)
        self.one_call = None  # host_decode.HostDecode once built; False: decode layer by layer (None: not asked)
        if self.cache.carry is not None and self.cache.device_moe is not None:
            raise ValueError("options: carry='drafts' runs on the host placement path: use placement 'auto' or 'host'")
        self.graphs = None
        if self.cache.device_moe is not None:
            dm = self.cache.device_moe
            parts = (LaneParts(functools.partial(self._moe_device, front=True), dm.lane, dm.back, dm.upload_buffer,
                               dm.finish) if dm.cpu_lane else None)
            self.graphs = MoEGraphs(self._moe_device, self.device, self.host, parts=parts)
        if self.graphs is not None and cfg.v4 is not None and cfg.v4.hash_layers:
            self.graphs.blocker = "hash-routed layers read each step's token ids"
        self.decode_line = (host_decode.decode_line(self) if ks.name == "host" and self.cache.device_moe is None
                            else decode_line(self.cache, self.graphs, eager))
        self.count_launches = False  # generate() counts one decode token's kernels and syncs into step_count
        self.step_count: StepCount | None = None
        if eager or (self.graphs is not None and self.graphs.reason(self.cache) is not None):
            self.graphs = None

    @classmethod
    def from_pretrained(cls, model: str | Path, cache: CacheConfig | None = None, *,
                        dtype: torch.dtype | None = None, tokenizer=None, **kw) -> Engine:
        """tokenizer: one already loaded (a caller that encoded its prompt before the weights); None: the
        checkpoint's."""
        ckpt = load_checkpoint(model, dtype=dtype, lm_head=kw.get("lm_head", "checkpoint"))
        return cls(ckpt, cache, tokenizer=tokenizer if tokenizer is not None else load_tokenizer(ckpt.path), **kw)

    # model calls
    def new_kv(self, max_tokens: int | None = None) -> KVCache:
        return self.decoder.new_kv(max_tokens or self.max_context, self.kv_dtype)

    def route(self, layer: int, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """MoE layer `layer`'s router on normed hidden h [T, D] -> (weights [T, K] fp32, ids [T, K] int32). h is cast
        to the router weight's dtype (fp32 where HF keeps the gate in fp32: Routing.fp32)."""
        cfg, ks = self.config, self.kernels
        lw = self.decoder.layers[cfg.moe_layers[layer]]
        if self.fused_router(lw):  # the projection and the top-k in one launch
            return ks.router_linear_topk(h, lw.router, cfg.top_k, cfg.norm_topk_prob)
        logits = ks.linear(h if h.dtype == lw.router.dtype else h.to(lw.router.dtype), lw.router,
                           lw.router_bias)  # [T, E]
        if lw.hash_table is not None:  # DeepSeek-V4's hash layers: the picks are the token ids' table rows
            ids = lw.hash_table[self.decoder.token_ids].to(torch.int32)  # [T, K]
            r = cfg.routing
            return ks.router_weights(logits, ids, cfg.norm_topk_prob, r.score, r.scale), ids
        return ks.router_topk(logits, cfg.top_k, cfg.norm_topk_prob, bias=lw.correction_bias, **cfg.routing.options())

    def fused_router(self, lw) -> bool:
        """Whether a layer's router is one router_linear_topk launch: the plain softmax top-k (no router or correction
        bias, no groups, no hash table, scale 1) and a kernel set that has it."""
        r = self.config.routing
        return (self.kernels.router_linear_topk is not None and lw.router_bias is None and lw.hash_table is None
                and lw.correction_bias is None and r.score == "softmax" and r.n_group == 1 and r.scale == 1.0)

    def _moe(self, layer: int, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.cache.device_moe is not None:
            if self.graphs is not None and self._phase == DECODE:
                y = self.graphs(layer, h)
                if self.recorder is not None:  # a replay wrote the routing on the device only
                    self.recorder.written(h.shape[0], h.device)
                return y
            return self._moe_device(layer, h)
        weights, ids = self.route(layer, h)  # [T, K] fp32, int32
        ids_host = (ids if ids.is_cpu else ids.cpu()).numpy()
        self.routed_to_host(layer, ids_host, weights)
        if self.hinting:
            self._hint_next(layer, x)
        return self.cache(layer, h, weights, ids_host, self._phase, self._request)

    def routed_to_host(self, layer: int, ids_host: np.ndarray, weights: torch.Tensor | np.ndarray) -> None:
        """A MoE layer's routing read back: counted, kept for the carry, recorded (weights [T, K])."""
        self.host.syncs += 1
        self.host.copies += 1
        if self.cache.carry is not None and self.recorder is None:  # the verify forward's routing, for the carry
            self._routed.append(ids_host)
        if self.recorder is not None:
            self.recorder.layer(layer, ids_host, weights if isinstance(weights, np.ndarray) else
                                weights.float().cpu().numpy())
            self.host.syncs += 1
            self.host.copies += 1

    def predict_next(self, layer: int, x: torch.Tensor) -> torch.Tensor | None:
        """The router hint: MoE layer layer + 1's router, after its own pre-MoE norm, on the residual x [T, D] that
        MoE layer `layer` reads -> predicted ids [T, K] int32 (None after the last MoE layer)."""
        cfg = self.config
        if layer + 1 >= cfg.num_moe_layers:
            return None
        lw = self.decoder.layers[cfg.moe_layers[layer + 1]]
        h = self.kernels.rms_norm(x, lw.post_norm, cfg.rms_norm_eps, **self.decoder.norm_kw)
        return self.route(layer + 1, h)[1]

    def _hint_next(self, layer: int, x: torch.Tensor) -> None:
        """Predict layer + 1's experts, record them, and hand them to the policy's hint (if it takes one)."""
        ids = self.predict_next(layer, x)
        keys: list[int] = []
        if ids is not None:
            ids_host = ids.cpu().numpy()
            self.host.syncs += 1
            self.host.copies += 1
            if self.recorder is not None:
                self.recorder.hint(layer + 1, ids_host)
            keys = predicted_keys(layer + 1, ids_host, self.config.num_experts)
        if self.cache.router_hint is not None:
            self.cache.router_hint.set(layer + 1, keys)

    def _moe_device(self, layer: int, h: torch.Tensor, front: bool = False):
        """The MoE half with the decision on the device: routing stays there (the recorder's buffer included).
        front: only the device work up to the staged decision (a decode graph's front part, LaneParts)."""
        weights, ids = self.route(layer, h)
        record = None if self.recorder is None else self.recorder.layer_view(layer, h.shape[0], h.device)
        dm = self.cache.device_moe
        return (dm.front if front else dm)(layer, h, weights, ids, self._phase, record)

    def _record_end(self) -> None:
        if self.recorder.end():  # copied back from the device buffer: one copy per forward, read without a wait
            self.host.copies += 1

    def forward(self, token_ids: list[int], kv: KVCache, start_pos: int, phase: int = PREFILL, request: int = 0,
                turn: int = 0, all_logits: bool = False) -> torch.Tensor:
        """One forward of T tokens (one MoE call per layer): logits [T, V] (all_logits) or [1, V]."""
        self._phase, self._request = phase, request
        self._routed = []
        if self.recorder is not None:
            self.recorder.begin(token_ids, phase, request, turn)
        native = host_decode.for_step(self, [kv]) if len(token_ids) == 1 else None
        if native is not None:  # the whole token in one host call, then each layer's placement and counts
            logits = native.run(self, token_ids, [kv], [start_pos], phase, request)
        else:
            logits = self.decoder.forward(token_ids, kv, start_pos, self._moe, all_logits)
        if self.recorder is not None:
            self._record_end()
        return logits

    def prefill(self, token_ids: list[int], kv: KVCache, start_pos: int = 0, request: int = 0, turn: int = 0,
                all_logits: bool = False) -> torch.Tensor:
        """The prompt in chunks of prefill_chunk tokens (the simulator's sim.calls chunks the same way)."""
        if not token_ids:
            raise ValueError("prefill needs at least one token")
        t0 = time.perf_counter()
        outs = []
        for lo in range(0, len(token_ids), self.prefill_chunk):
            chunk = token_ids[lo:lo + self.prefill_chunk]
            outs.append(self.forward(chunk, kv, start_pos + lo, PREFILL, request, turn, all_logits))
        self._sync()
        self.stats.prefill_tokens += len(token_ids)
        self.stats.prefill_s += time.perf_counter() - t0
        return torch.cat(outs) if all_logits else outs[-1]

    def decode_batch(self, tokens: list[int], kvs: list[KVCache], requests: list[int] | None = None,
                     settle: bool = True) -> torch.Tensor:
        """One decode step for several sequences, each in its own KV cache: logits [B, V]. Each MoE layer is one
        call over the union of their experts, with per-expert token counts, planned as a call of the first
        sequence's request (the recorded trace keeps each token's own). Every cache kind steps as one batch
        (Decoder.forward_batch). settle: as decode's."""
        requests = [0] * len(tokens) if requests is None else requests
        if not tokens or not len(tokens) == len(kvs) == len(requests):
            raise ValueError(f"decode_batch needs one KV cache and request per token, got {len(tokens)} tokens, "
                             f"{len(kvs)} caches, {len(requests)} requests")
        if len(tokens) == 1:
            return self.decode(tokens[0], kvs[0], requests[0], settle=settle)
        self.clock.begin(self.stats)
        self._phase, self._request = DECODE, requests[0]
        if self.recorder is not None:
            self.recorder.begin(tokens, DECODE, requests, [self._turns.get(r, 0) for r in requests])
        native = host_decode.for_step(self, kvs)
        logits = (native.run(self, tokens, kvs, [kv.length for kv in kvs], DECODE, requests[0]) if native is not None
                  else self.decoder.forward_batch(tokens, kvs, self._moe))
        if self.recorder is not None:
            self._record_end()
        if settle:
            self._sync()
        self.clock.end(self.stats, len(tokens), settle)
        return logits

    def decode(self, token: int, kv: KVCache, request: int = 0, turn: int = 0, settle: bool = True) -> torch.Tensor:
        """One decode step: logits [1, V]. settle: close the step with a device synchronize. generate() passes
        False: reading the token it samples is then the token's one sync (the step's time: step_clock.py)."""
        self.clock.begin(self.stats)
        logits = self.forward([token], kv, kv.length, DECODE, request, turn)
        if settle:
            self._sync()
        self.clock.end(self.stats, 1, settle)
        return logits

    def _sync(self) -> None:
        synchronize(self.device)  # counted by launch_count as the sync it is on CUDA

    def settle(self) -> None:
        """Wait for the device work issued so far (a caller that left its steps open, as a drafted loop does)."""
        self._sync()

    def last_routing(self) -> np.ndarray | None:
        """[T, L, K] the routing of the forward that just ended: the recorder's, else what _moe kept for a carry
        (None: neither records it)."""
        if self.recorder is not None:
            return self.recorder.last_experts
        return np.stack(self._routed, axis=1) if self.cache.carry is not None and self._routed else None

    # generation
    def generate(self, token_ids: list[int], sampling: SamplingParams | None = None, max_tokens: int = 64,
                 stop_token_ids: Iterable[int] | None = None, kv: KVCache | None = None, request: int = 0,
                 reuse_prefix: bool = True, draft: DraftConfig | None = None) -> Iterator[int]:
        """Yield sampled token ids one by one (the stop token included, then stop).

        kv: a cache to continue in; with reuse_prefix its longest common prefix with token_ids is kept and only
        the rest is prefilled (at least one token is always recomputed, for the logits). A hybrid model's cache
        keeps only what its recurrent state allows (kv.reusable: its current length or a snapshot, else nothing).
        draft: speculative decoding with a model-free drafter (greedy only; the output is plain greedy's)."""
        token_ids = [int(t) for t in token_ids]
        if not token_ids:
            raise ValueError("generate needs at least one prompt token")
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        kv = kv if kv is not None else self.new_kv()
        start = kv.reusable(min(kv.common_prefix(token_ids), len(token_ids) - 1)) if reuse_prefix else 0
        kv.truncate(start)
        kv.check_room(start, len(token_ids) - start + max_tokens - 1)
        stops = set(self.default_stop_ids() if stop_token_ids is None else stop_token_ids)
        sampler = Sampler(sampling or SamplingParams(), prompt=token_ids)  # (the penalty covers the whole prompt)
        if draft is not None and (not sampler.params.is_greedy or history_shaped(sampler.params)):
            raise ValueError("draft: verification keeps the tokens plain greedy decoding would choose; use greedy "
                             "sampling without repetition, presence or frequency penalties")
        if draft is None and self.cache.carry is not None:
            raise ValueError("options: carry='drafts' hands the rejected drafts to the policy; it needs drafting "
                             "(generate's draft=, ft generate --draft ngram)")
        if draft is not None and self.config.linear_attention is not None:
            raise ValueError("draft: a recurrent (linear-attention) state cannot drop rejected draft tokens")
        turn = self._turns.get(request, -1) + 1
        self._turns[request] = turn
        if draft is not None:
            return generate_drafted(self, token_ids[start:], start, kv, sampler, max_tokens, stops, request, turn,
                                    draft)
        return self._generate(token_ids[start:], start, kv, sampler, max_tokens, stops, request, turn)

    def _generate(self, prompt, start, kv, sampler, max_tokens, stops, request, turn) -> Iterator[int]:
        logits = self.prefill(prompt, kv, start, request, turn)
        counter = LaunchCounter(self.device, self.decoder) if self.count_launches else None
        for i in range(max_tokens):
            # the second decode step (the first captures graphs) and the sampling of its logits are counted
            with counter.section("sample") if counter and i == COUNTED_STEP + 1 else nullcontext():
                token = sampler(logits[-1])
            if counter and i == COUNTED_STEP + 1:
                self.step_count = counter.result()
            last = token in stops or i == max_tokens - 1
            if last:
                self.clock.fold(self.stats)  # the last step's time, before the caller reads the stats
            yield token
            if last:
                return
            with counter.section("step") if counter and i == COUNTED_STEP else nullcontext():
                logits = self.decode(token, kv, request, turn, settle=False)

    def default_stop_ids(self) -> set[int]:
        """config.json's eos ids, generation_config.json's (what HF generate stops at) and the tokenizer's."""
        ids = set(self.config.eos_token_ids) | set(self.generation_defaults.eos_token_ids)
        tok = self.tokenizer
        if tok is not None and tok.eos_token_id is not None:
            ids.add(int(tok.eos_token_id))
        return ids

    # results
    @property
    def counters(self):
        return self.cache.counters

    def trace(self, source: str = "live"):
        if self.recorder is None:
            raise ValueError("this engine was built with record=False")
        return self.recorder.trace(source)

    def reset(self) -> None:
        """Start a fresh run: new policy state, counters, recorded trace and timings (weights stay loaded)."""
        self.cache.reset()
        cfg = self.config
        if self.recorder is not None:
            self.recorder = TraceRecorder(cfg.num_moe_layers, cfg.top_k, cfg.num_experts, cfg.architecture)
        self.stats = RunStats()
        self.clock = StepClock(self.device)
        self.draft_stats = DraftStats()
        self._turns = {}
        if self.graphs is not None:  # captured against the old recorder's buffers
            self.graphs.clear()
        for f in ("launches", "syncs", "copies"):
            setattr(self.host, f, 0)
