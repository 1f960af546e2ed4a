"""Tiny random-weight checkpoints of each family, written with transformers' save_pretrained, and HF's answers.

Weights are drawn with initializer_range 0.1 (not HF's 0.02) so logits and router scores are far apart relative
to fp32 rounding: argmax and top-k picks then do not hinge on the last bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

FAMILY_KW = {
    "qwen3_moe": dict(num_experts=8, moe_intermediate_size=32, head_dim=16, norm_topk_prob=True),
    "mixtral": dict(num_local_experts=8),
    "olmoe": dict(num_experts=8, norm_topk_prob=False),
    "qwen2_moe": dict(num_experts=8, moe_intermediate_size=32, shared_expert_intermediate_size=40,
                      norm_topk_prob=False),
    "gpt_oss": dict(num_local_experts=8, head_dim=16, sliding_window=4),  # layer 0 slides; sinks, biases, YaRN
}
FAMILIES = tuple(FAMILY_KW)
PROMPT = [3, 17, 5, 99, 42, 7, 1, 2, 8, 100]
DECODE_STEPS = 8


def build_checkpoint(family: str, out: Path, seed: int = 0, **overrides) -> Path:
    """The family's tiny checkpoint (2 layers, 8 experts, top-2) written to `out`; overrides: config fields changed
    (e.g. num_hidden_layers)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = dict(hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=128, num_experts_per_tok=2, initializer_range=0.1,
                 eos_token_id=None, bos_token_id=None, pad_token_id=None, **FAMILY_KW[family])
    cfg = AutoConfig.for_model(family, **{**shape, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(out)
    return out


@dataclass
class HFReference:
    path: Path
    tokens: list[int]  # prompt + greedy continuation (DECODE_STEPS + 1 new tokens)
    logits: torch.Tensor  # [len(tokens), V] of HF's forward over tokens
    router_logits: list[torch.Tensor]  # per MoE layer [len(tokens), E]
    top_k: int


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory) -> dict[str, HFReference]:
    from transformers import AutoModelForCausalLM

    refs = {}
    for family in FAMILIES:
        path = build_checkpoint(family, tmp_path_factory.mktemp(family))
        hf = AutoModelForCausalLM.from_pretrained(path).eval()
        with torch.no_grad():
            out = hf.generate(torch.tensor([PROMPT]), max_new_tokens=DECODE_STEPS + 1, do_sample=False,
                              min_new_tokens=DECODE_STEPS + 1)
            tokens = out[0].tolist()
            fwd = hf(torch.tensor([tokens]), output_router_logits=True)
        refs[family] = HFReference(path, tokens, fwd.logits[0].float(), [r.float() for r in fwd.router_logits],
                                   hf.config.num_experts_per_tok)
    return refs


@pytest.fixture(scope="session")
def checkpoints(hf_models):
    from freetoken.models.checkpoint import load_checkpoint

    return {family: load_checkpoint(ref.path) for family, ref in hf_models.items()}


def hf_topk(ref: HFReference, upto: int) -> np.ndarray:
    """[T, L, K]: HF's routing (top-k of the softmaxed router logits) of the first `upto` tokens."""
    picks = [torch.topk(torch.softmax(r[:upto], -1), ref.top_k, dim=-1).indices for r in ref.router_logits]
    return torch.stack(picks, dim=1).numpy()


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny tensors: thread start-up dominates on a shared 2-core machine (8x slower with the default pool)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def policy_options(name: str, trace, prefill_chunk: int) -> dict:
    """What each policy's constructor needs from a probe run: expert counts (profile=), the future (future=),
    activation matrices (past=)."""
    import inspect

    from freetoken.trace.stats import expert_counts
    from freetoken.sim.calls import trace_key_stream
    from freetoken.placement import POLICIES

    params = inspect.signature(POLICIES[name].__init__).parameters
    options = {}
    if "profile" in params:
        options["profile"] = expert_counts(trace)
    if "future" in params:
        options["future"] = trace_key_stream(trace, prefill_chunk)
    if "past" in params:  # moe_infinity's offline library: the probe's requests, so matches drive prefetches
        from freetoken.placement.policies.moe_infinity import activation_matrices

        options["past"] = activation_matrices(trace)
    return options
