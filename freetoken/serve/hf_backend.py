"""A backend on a HF transformers model (any local checkpoint transformers can load): the server's reference
path, independent of freetoken's own engine, and what `ft serve --backend hf` runs."""

from __future__ import annotations

from pathlib import Path

import torch

from freetoken.engine.sampling import load_generation_defaults
from freetoken.serve.chat import ChatTokenizer, Prompt
from freetoken.serve.decoding import Decoder
from freetoken.serve.engine_backend import served_context
from freetoken.serve.generation import CachedGeneration
from freetoken.serve.prefix_cache import PrefixCache


def _slice_positions(kv: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return kv[:, :, :, start:stop]  # [L, 2, H, T, Dh] along T


class HFSequence:
    """KV as a transformers DynamicCache; prefix-cache pieces are [L, 2, H, T, Dh] tensors."""

    def __init__(self, model):
        from transformers import DynamicCache

        self.model = model
        self.forkable = not _recurrent(model.config)  # KV positions can be copied; recurrent state cannot
        # hybrid models need their cache built from the config (conv + recurrent layers beside the KV ones)
        self.cache = DynamicCache(config=model.config) if _recurrent(model.config) else DynamicCache()
        self.length = 0

    def mark(self, anchors: list[int]) -> None:
        """KV can be cut anywhere: nothing to remember."""

    def load(self, pieces: list, tokens: list[int]) -> None:
        kv = torch.cat(pieces, dim=3)  # [L, 2, H, T, Dh]
        for layer in range(kv.shape[0]):
            self.cache.update(kv[layer, 0][None].clone(), kv[layer, 1][None].clone(), layer)
        self.length = kv.shape[3]

    @torch.inference_mode()
    def forward(self, tokens: list[int], all_logits: bool = False, decode: bool = False) -> torch.Tensor:
        ids = torch.tensor([tokens], dtype=torch.long)
        out = self.model(input_ids=ids, cache=self.cache, use_cache=True)
        self.length += len(tokens)
        return out.logits[0] if all_logits else out.logits[0, -1]  # [T, V] | [V]

    def read(self, start: int, stop: int) -> torch.Tensor:
        k = torch.stack([layer.keys[0, :, start:stop] for layer in self.cache.layers])  # [L, H, T, Dh]
        v = torch.stack([layer.values[0, :, start:stop] for layer in self.cache.layers])
        return torch.stack([k, v], dim=1).clone()  # [L, 2, H, T, Dh]


def _recurrent(config) -> bool:
    """Does the model keep state beside its KV that cannot be sliced into pieces (linear-attention layers' recurrent
    state, DeepSeek-V4's compressors), in a cache built from its config?"""
    return "linear_attention" in (getattr(config, "layer_types", None) or []) or config.model_type == "deepseek_v4"


class HFBackend:
    def __init__(self, model_dir: Path, model_id: str, max_context: int | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.chat = ChatTokenizer(tokenizer)
        self.model_id = model_id
        self.model_context = int(getattr(self.model.config, "max_position_embeddings", 4096))
        self.max_context = served_context(self.model_context, max_context)
        eos = self.model.generation_config.eos_token_id if self.model.generation_config else None
        eos = eos if isinstance(eos, list) else [eos]
        self.stop_token_ids = {t for t in eos + [tokenizer.eos_token_id] if t is not None}
        self.prefix_cache: PrefixCache | None = None  # sized by use_plan
        self.generation_defaults = load_generation_defaults(model_dir)
        self.family = self.model.config.model_type
        self.vocab_size = int(self.model.config.vocab_size)

    def use_plan(self, plan, prefix_cache_tokens: int | None = None, **engine_options) -> None:
        """All weights stay resident here (no expert cache, engine_options unused); the plan's KV tokens bound
        the prefix cache."""
        self.max_context = min(self.max_context, plan.kv_tokens)  # one sequence must fit the planned KV
        self.kv_tokens = plan.kv_tokens
        tokens = plan.kv_tokens if prefix_cache_tokens is None else prefix_cache_tokens
        if _recurrent(self.model.config):
            tokens = 0  # recurrent layers' state cannot be sliced like KV: no prefix cache (the engine backend has one)
        self.prefix_cache = PrefixCache(tokens, _slice_positions) if tokens else None

    def prefix_cache_budget(self) -> int:
        return self.prefix_cache.budget_tokens if self.prefix_cache else 0

    def generate(self, prompt: Prompt, decoder: Decoder, max_new: int,
                 stop_token_ids: set[int] | None = None) -> CachedGeneration:
        return CachedGeneration(HFSequence(self.model), self.prefix_cache, prompt, decoder, max_new,
                                self.stop_token_ids if stop_token_ids is None else stop_token_ids)

    def stats(self) -> dict:
        return {"backend": "hf", "placement": None,  # no expert cache: nothing decides placements
                "prefix_cache": self.prefix_cache.summary() if self.prefix_cache else None}
