"""The live engine behind the server: checkpoint -> memory plan -> expert cache of the planned size -> Engine.

Each request runs in its own KVCache; the prefix cache keeps [L, 2, T, Hkv, Dh] copies of finished sequences'
KV as stored (an fp8 cache's codes with their scales) on the engine's device, counted against the plan's KV tokens.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import torch

from freetoken.quant.packed import PackedWeight

from freetoken.serve.chat import ChatTokenizer, Prompt
from freetoken.serve.decoding import Decoder
from freetoken.serve.generation import CachedGeneration
from freetoken.placement.memory import MemoryPlan, ModelMemory, cache_rows
from freetoken.serve.prefix_cache import PrefixCache
from freetoken.serve.redact import hide_home


def _slice_positions(kv: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return kv[:, :, start:stop]  # [L, 2, T, Hkv, Dh] along T


class EngineSequence:
    forkable = True  # positions can be copied into another sequence (n > 1 shares the prompt's KV)

    def __init__(self, engine, request: int, max_tokens: int):
        self.engine, self.request, self.max_tokens = engine, request, max_tokens
        self._kv = None

    @property
    def kv(self):
        """Allocated at the first step (on the worker thread): what this request can fill, not the context."""
        if self._kv is None:
            self._kv = self.engine.new_kv(self.max_tokens)
        return self._kv

    @property
    def length(self) -> int:
        return 0 if self._kv is None else self._kv.length

    def mark(self, anchors: list[int]) -> None:
        """KV can be cut anywhere: nothing to remember."""

    def load(self, pieces: list, tokens: list[int]) -> None:
        kv = torch.cat(pieces, dim=2)  # [L, 2, T, Hkv, Dh]
        for layer in range(kv.shape[0]):
            self.kv.load(layer, 0, kv[layer])
        self.kv.commit(0, tokens)

    def forward(self, tokens: list[int], all_logits: bool = False, decode: bool = False) -> torch.Tensor:
        if decode:
            # left open: reading the token sampled from these logits is the step's one sync
            return self.engine.decode(tokens[0], self.kv, request=self.request, settle=False)[-1]
        logits = self.engine.prefill(tokens, self.kv, self.kv.length, request=self.request, all_logits=all_logits)
        return logits if all_logits else logits[-1]

    def read(self, start: int, stop: int) -> torch.Tensor:
        kv = self.kv
        return torch.stack([kv.read(l, start, stop) for l in range(len(kv.k))]).clone()  # [L, 2, T, Hkv, Dh]


def served_context(model_context: int, asked: int | None) -> int:
    """The model's own context unless --max-context asks for less (more than the model's is refused: positions it
    was not trained on); the memory plan may lower it further (use_plan)."""
    if asked is not None and asked > model_context:
        raise ValueError(f"--max-context {asked} is more than this model's context of {model_context} tokens "
                         f"(config.json max_position_embeddings)")
    return asked or model_context


def checkpoint_memory(ckpt, max_context: int, kv_dtype: str = "auto") -> ModelMemory:
    """min_slots: one layer's experts, the staging rows the engine's slot pool keeps beside the cache; KV bytes
    as the cache stores them (kv_dtype)."""
    from freetoken.engine.slots import ExpertStore
    from freetoken.kv_dtype import kv_bytes_per_token

    cfg = ckpt.config
    compute = ckpt.dense["model.embed_tokens.weight"].element_size()
    # an integer table at its bytes; a projection kept packed for the host counts as the device kernels hold it:
    # dequantized (the card's view too)
    dense = sum(t.shape[0] * t.shape[1] * compute if isinstance(t, PackedWeight) else t.nbytes
                for t in ckpt.dense.values())
    store = ExpertStore.from_checkpoint(ckpt)
    kv_rows = len(cfg.attention_layers) * cfg.num_kv_heads
    kv_per_token = kv_bytes_per_token(kv_rows, cfg.head_dim, kv_dtype, store.dtype.itemsize)
    kv_per_token += cfg.index_key_values() * store.dtype.itemsize  # DSA's indexer keys live beside the KV
    if cfg.v4 is not None:  # one key = value row per layer, compressed entries (engine/v4_kv.py)
        kv_per_token = math.ceil(cfg.v4.kv_values_per_token(cfg.num_layers, cfg.head_dim) * store.dtype.itemsize)
    expert = store.expert_bytes  # packed values and scales for a quantized checkpoint
    return ModelMemory(dense, kv_per_token, expert, cfg.num_moe_layers * cfg.num_experts, cfg.num_experts,
                       max_context, cfg.state_bytes(store.dtype.itemsize))


def expert_format(ckpt) -> str:
    """'bf16' / 'fp16' / 'fp32' for dense experts, the packed format ('gptq int4 g128', 'nvfp4') otherwise."""
    from freetoken.engine.slots import ExpertStore

    return ExpertStore.from_checkpoint(ckpt).format


class EngineBackend:
    def __init__(self, model_dir: Path, model_id: str, max_context: int | None = None, kv_dtype: str = "auto",
                 lm_head: str = "checkpoint"):
        from freetoken.models.checkpoint import load_checkpoint
        from freetoken.models.tokenizer import load_tokenizer

        self.lm_head = lm_head
        self.ckpt = load_checkpoint(model_dir, lm_head=lm_head)  # (an int8 head as it loads: the plan counts it)
        tokenizer = load_tokenizer(self.ckpt.path)
        if tokenizer is None:
            raise ValueError(f"{model_dir}: no tokenizer.json; the server needs the model's tokenizer")
        self.tokenizer = tokenizer
        self.chat = ChatTokenizer(tokenizer)
        self.model_id = model_id
        cfg = self.ckpt.config
        self.model_context = cfg.max_position_embeddings
        self.max_context = served_context(self.model_context, max_context)
        self.kv_dtype = kv_dtype
        self.expert_format = expert_format(self.ckpt)
        self.engine = None
        self.prefix_cache: PrefixCache | None = None
        self._requests = itertools.count()
        self.split_reason = ""
        self.cache_note = ""
        self.placement_asked = "auto"  # --placement as given; placement() says where the policy decides

    def model_memory(self) -> ModelMemory:
        return checkpoint_memory(self.ckpt, self.max_context, self.kv_dtype)

    def use_plan(self, plan: MemoryPlan, prefix_cache_tokens: int | None = None, policy: str = "lru",
                 split_mode: str = "auto", kernels: str | None = None, options: dict | None = None,
                 profile: str | None = None, capacity: int | None = None, fraction: float | None = None,
                 placement: str = "auto", eager: bool = False) -> None:
        """Builds the engine with the planned expert slots (or fewer, when capacity / fraction ask) and the
        resolved miss split; policy, options and profile as the one cache config takes them; placement and eager
        as the Engine takes them (and the lm_head the checkpoint was loaded with)."""
        from freetoken.calibrate.mode import resolve_split
        from freetoken.engine import Engine
        from freetoken.placement import cache_config
        from freetoken.serve.config import SERVE_NAMES
        from freetoken.engine.kernelset import resolve_kernels

        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        resolved = resolve_split(split_mode, gpu, self.expert_format)
        self.split_reason = hide_home(resolved.reason)
        self.placement_asked = placement
        kernels = resolve_kernels(kernels or "auto")
        self.max_context = min(self.max_context, plan.kv_tokens)  # one sequence must fit the planned KV
        self.kv_tokens = plan.kv_tokens
        slots, staging = cache_rows(plan, self.ckpt.config.num_experts)  # as the sim's planner splits them
        if capacity is not None or fraction is not None:
            cfg = self.ckpt.config
            asked = cache_config(SERVE_NAMES, capacity=capacity, fraction=fraction).slots_for(cfg.num_moe_layers,
                                                                                              cfg.num_experts)
            staging = 0 if asked >= plan.num_experts else cfg.num_experts  # one layer, as cache_rows splits
            if asked + staging > plan.expert_slots:
                raise ValueError(f"--capacity / --fraction ask for {asked} expert slots and {staging} staging rows; "
                                 f"the memory plan leaves {plan.expert_slots} (raise --device-budget or lower "
                                 f"--kv-floor)")
            slots = asked
        cache = cache_config(SERVE_NAMES, policy=policy, options=options or {}, profile=profile, capacity=slots,
                             split=resolved.split, staging=staging)
        self.cache_note = (f"{self.expert_format} experts, {policy}, {slots} slots + {staging} staging; "
                           f"KV cache {self.kv_dtype}{'; LM head int8' if self.lm_head == 'int8' else ''}")
        self.engine = Engine(self.ckpt, cache, kernels=kernels, max_context=self.max_context, record=False,
                             tokenizer=self.tokenizer, kv_dtype=self.kv_dtype, placement=placement, eager=eager,
                             lm_head=self.lm_head)
        tokens = plan.kv_tokens if prefix_cache_tokens is None else prefix_cache_tokens
        if not tokens:
            self.prefix_cache = None
        elif self.ckpt.config.linear_attention is not None or self.ckpt.config.v4 is not None:
            # pieces carry the state that cannot be cut (recurrent, V4's open compressor windows) at anchors
            from freetoken.serve import hybrid_sequence, v4_sequence

            pieces = v4_sequence if self.ckpt.config.v4 is not None else hybrid_sequence
            memory = self.model_memory()
            self.prefix_cache = PrefixCache(tokens, pieces.slice_piece,
                                            pieces.snapshots(memory.state_bytes, memory.kv_bytes_per_token))
        elif self.ckpt.config.dsa is not None:  # pieces carry the indexer keys beside the KV
            from freetoken.serve.dsa_sequence import slice_piece

            self.prefix_cache = PrefixCache(tokens, slice_piece)
        else:
            self.prefix_cache = PrefixCache(tokens, _slice_positions)

    @property
    def stop_token_ids(self) -> set[int]:
        return self.engine.default_stop_ids()

    def prefix_cache_budget(self) -> int:
        return self.prefix_cache.budget_tokens if self.prefix_cache else 0

    @property
    def generation_defaults(self):
        return self.engine.generation_defaults

    @property
    def family(self) -> str:
        return self.ckpt.config.family

    @property
    def vocab_size(self) -> int:
        return self.ckpt.config.vocab_size

    def generate(self, prompt: Prompt, decoder: Decoder, max_new: int,
                 stop_token_ids: set[int] | None = None) -> CachedGeneration:
        from freetoken.serve.dsa_sequence import DSASequence
        from freetoken.serve.hybrid_sequence import HybridSequence
        from freetoken.serve.v4_sequence import V4Sequence

        cfg = self.ckpt.config
        kind = V4Sequence if cfg.v4 is not None else HybridSequence if cfg.linear_attention is not None \
            else DSASequence if cfg.dsa is not None else EngineSequence
        seq = kind(self.engine, next(self._requests), len(prompt.tokens) + max_new)
        stops = self.stop_token_ids if stop_token_ids is None else stop_token_ids
        return CachedGeneration(seq, self.prefix_cache, prompt, decoder, max_new, stops,
                                self.engine.prefill_chunk)  # the engine's own chunks: the same numbers as solo

    def decode_logits(self, gens: list[CachedGeneration]) -> torch.Tensor:
        """One decode step of several started sequences together: their logits [B, V] (sampling is the
        caller's). If the step fails, every sequence's KV is cut back to where it was, so each can
        be stepped again alone (a hybrid model's recurrent states are written back only once the step succeeded)."""
        lengths = [g.seq.length for g in gens]
        try:
            return self.engine.decode_batch([g.generated[-1] for g in gens], [g.seq.kv for g in gens],
                                            [g.seq.request for g in gens], settle=False)  # [B, V]: left open
            # as a single step is: reading the tokens sampled from them waits for the step
        except BaseException:
            for g, n in zip(gens, lengths):
                if g.seq.length > n:
                    g.seq.kv.truncate(n)
            raise

    def placement(self) -> dict:
        """Where the expert-cache policy decides (device / host), which policy, what --placement asked, and the
        start-up lines that say so (placement, decode)."""
        cache = self.engine.cache
        return {"policy": cache.policy.name, "decides_on": "host" if cache.device_moe is None else "device",
                "asked": self.placement_asked, "line": cache.placement_line, "decode": self.engine.decode_line}

    def stats(self) -> dict:
        return {"backend": "engine", "split": self.split_reason, "placement": self.placement(),
                "expert_cache": self.engine.counters.to_dict(),
                "prefix_cache": self.prefix_cache.summary() if self.prefix_cache else None}

