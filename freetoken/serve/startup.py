"""Start-up: load the model behind a backend, plan memory (printed), size the prefix cache from the plan."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from freetoken.serve.config import DEMO_MODEL_ID, ServeConfig
from freetoken.serve.redact import hide_home
from freetoken.placement.memory import GiB, MemoryPlan, ModelMemory, plan_memory


def device_budget(cfg: ServeConfig) -> tuple[int, str]:
    """Bytes to plan against and the device's name: --device-budget, else the GPU's memory, else half the free RAM."""
    if cfg.device_budget_gb is not None:
        return int(cfg.device_budget_gb * GiB), "cuda" if torch.cuda.is_available() else "cpu (--device-budget)"
    if torch.cuda.is_available():  # free, not total: the CUDA context and other processes hold the rest
        return torch.cuda.mem_get_info()[0], torch.cuda.get_device_name()
    import psutil

    return psutil.virtual_memory().available // 2, "cpu (half the free RAM; set --device-budget)"


def hf_model_memory(model, max_context: int) -> ModelMemory:
    """Bytes of a transformers MoE model: routed experts apart from the dense rest."""
    cfg = model.config
    expert_params = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    num_experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", 1)
    layers = cfg.num_hidden_layers
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dtype_bytes = next(model.parameters()).element_size()
    kv = 2 * layers * getattr(cfg, "num_key_value_heads", cfg.num_attention_heads) * head_dim * dtype_bytes
    keys = max(1, layers * num_experts)
    return ModelMemory(total - expert_params, kv, max(1, expert_params // keys), keys,
                       getattr(cfg, "num_experts_per_tok", 1), max_context)


def load(cfg: ServeConfig, log=lambda s: print(s, file=sys.stderr, flush=True)):
    """-> (backend, memory plan)."""
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    model_dir, model_id = resolve_model(cfg)
    if cfg.backend == "hf":
        from freetoken.serve.hf_backend import HFBackend

        backend = HFBackend(model_dir, model_id, max_context=cfg.max_context)
        memory = hf_model_memory(backend.model, backend.max_context)
    else:
        from freetoken.serve.engine_backend import EngineBackend

        backend = EngineBackend(model_dir, model_id, max_context=cfg.max_context, kv_dtype=cfg.kv_dtype,
                                lm_head=cfg.lm_head)
        for note in backend.ckpt.notes:
            log(note)
        memory = backend.model_memory()
    budget, device = device_budget(cfg)
    plan = plan_memory(memory, budget, kv_floor=cfg.kv_floor, reserve_bytes=min(GiB, budget // 10), device=device)
    log(plan.table())
    if cfg.backend == "hf":
        backend.use_plan(plan, cfg.prefix_cache_tokens)
    else:
        backend.use_plan(plan, cfg.prefix_cache_tokens, policy=cfg.policy, split_mode=cfg.split,
                         options=cfg.policy_options, profile=cfg.profile, capacity=cfg.capacity,
                         fraction=cfg.fraction, placement=cfg.placement, eager=cfg.eager)
        from freetoken.placement.warmup import warm_policy

        warm_policy(backend.engine.cache.policy)  # compiled before the server says ready, not in its first request
    log(f"model {model_id!r} from {hide_home(str(model_dir))} ({cfg.backend} backend), prefix cache "
        f"{backend.prefix_cache_budget()} tokens")
    log(context_line(backend.max_context, backend.model_context, cfg.max_context, plan.kv_tokens))
    if getattr(backend, "cache_note", ""):
        log(f"expert cache: {backend.cache_note}; split {backend.split_reason}")
        log(backend.engine.cache.placement_line)  # where the policy decides, as ft generate says it
        log(backend.engine.decode_line)
    return backend, plan


def context_line(served: int, model: int, asked: int | None, kv_tokens: int) -> str:
    """What the server serves and what set it: the model's own, --max-context, or the memory plan's KV tokens."""
    if served == model:
        return f"context {served} tokens (the model's own)"
    why = "--max-context" if asked is not None and served == asked else \
        f"the memory plan's KV cache of {kv_tokens} tokens (raise --device-budget or --kv-floor)"
    return f"context {served} tokens (the model's is {model}; limited by {why})"


def build_service(backend, cfg: ServeConfig):
    from freetoken.serve.service import Service

    return Service(backend, cfg.max_running, cfg.max_waiting, cfg.tool_parser, cfg.reasoning_parser)


def resolve_model(cfg: ServeConfig) -> tuple[Path, str]:
    if cfg.model is not None:
        return cfg.model, cfg.served_name or cfg.model.resolve().name
    from freetoken.paths import DEMO_MODEL  # the shipped tiny demo checkpoint

    return DEMO_MODEL, cfg.served_name or DEMO_MODEL_ID


__all__ = ["MemoryPlan", "load"]
