"""What the HF-match tests of the newer families (Qwen3-Next / Qwen3.5, GLM / MiniMax, gpt-oss, DeepSeek) share:
a tiny random HF model, HF's answers on it (greedy tokens, logits, routing), the engine over its checkpoint, and the
checks every family runs against those answers. Tolerance as in test_hf_match.py: 1e-4 x max |logit|.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from freetoken.engine import CacheConfig, Engine, SamplingParams
from freetoken.models.checkpoint import Checkpoint, load_checkpoint

from .conftest import DECODE_STEPS, PROMPT
from .test_hf_match import CHUNK, SPLITS, assert_close, assert_grid, run_steps


@dataclass
class Model:
    path: Path
    ckpt: Checkpoint
    tokens: list[int]  # prompt + HF's greedy continuation (DECODE_STEPS + 1 tokens)
    logits: torch.Tensor  # [len(tokens), V] of HF's forward over tokens
    picks: np.ndarray | None = None  # [len(tokens), MoE layers, K]: HF's gate's top-k ids, sorted per token
    router_logits: list[torch.Tensor] | None = None  # per MoE layer [len(tokens), E], where HF returns them


def random_hf(model_type: str, **config):
    """HF's model of `model_type` with random weights (seed 0), in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config)).eval()


def hf_answers(hf, path: Path, gates=(), router_logits: bool = False) -> Model:
    """HF's greedy continuation of PROMPT and its logits over prompt + continuation, with the routing of that
    forward: the top-k ids `gates` return (their forward hooks' third output) or, with router_logits, HF's own."""
    picks = []
    hooks = [gate.register_forward_hook(lambda mod, args, out: picks.append(out[2])) for gate in gates]
    with torch.no_grad():
        gen = hf.generate(torch.tensor([PROMPT]), max_new_tokens=DECODE_STEPS + 1, do_sample=False,
                          min_new_tokens=DECODE_STEPS + 1)
        tokens = gen[0].tolist()
        picks.clear()
        extra = dict(output_router_logits=True) if router_logits else {}
        fwd = hf(input_ids=torch.tensor([tokens]), **extra)
    for h in hooks:
        h.remove()
    model = Model(path, load_checkpoint(path), tokens, fwd.logits[0].float())
    if hooks:
        model.picks = torch.stack(picks, dim=1).sort(dim=-1).values.numpy()  # [T, L, K]
    if router_logits:
        model.router_logits = [r.float() for r in fwd.router_logits]
    return model


def make_engine(model: Model, capacity: int, split: str, kernels: str = "host", ckpt: Checkpoint | None = None,
           chunk: int = CHUNK) -> Engine:
    """LRU over `capacity` slots in SPLITS[split]; the Triton kernels on CUDA when there is one."""
    return Engine(ckpt or model.ckpt, CacheConfig("lru", capacity=capacity, split=SPLITS[split]), kernels=kernels,
                  device="cuda" if kernels == "triton" and torch.cuda.is_available() else "cpu", prefill_chunk=chunk)


# the checks every family runs
def assert_logits_grid(model: Model, num_experts: int, what: str) -> None:
    """Logits = HF's at capacities 0, half and all of the MoE layers' experts, in every split."""
    L = len(model.ckpt.config.moe_layers)
    assert_grid(lambda capacity, split: make_engine(model, capacity, split), model.tokens[:-1], model.logits[:-1],
                (0, L * num_experts // 2, L * num_experts), what)


def assert_triton_matches(model: Model, capacity: int, upto: int, what: str, chunk: int = CHUNK) -> None:
    """The Triton path (interpreted on CPU) over the first `upto` tokens: HF's logits, with hits, fetches and the
    CPU lane all used (hybrid split)."""
    engine = make_engine(model, capacity, "hybrid", kernels="triton", chunk=chunk)
    assert_close(run_steps(engine, model.tokens[:upto]), model.logits[:upto], what)
    c = engine.counters
    assert c.hits > 0 and c.fetched > 0 and c.cpu > 0


def assert_greedy_is_hf(model: Model) -> None:
    engine = make_engine(model, 5, "hybrid")
    got = list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=DECODE_STEPS + 1, stop_token_ids=[]))
    assert got == model.tokens[len(PROMPT):]


def assert_routing_is_hf(model: Model, top_k: int) -> None:
    """The trace of a greedy run (capacity 3, offload) holds its tokens and HF's routing: the gate's picks as a set
    per token, or the top-k of HF's router logits in order."""
    engine = make_engine(model, 3, "offload")
    out = list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=DECODE_STEPS + 1, stop_token_ids=[]))
    trace = engine.trace()
    T = len(PROMPT) + DECODE_STEPS
    assert trace.token.tolist() == PROMPT + out[:-1]
    if model.picks is not None:
        assert trace.experts.shape == (T, len(model.ckpt.config.moe_layers), top_k)
        np.testing.assert_array_equal(np.sort(trace.experts, axis=-1), model.picks[:T])
    else:
        want = torch.stack([torch.topk(r[:T], top_k, dim=-1).indices for r in model.router_logits], dim=1)  # [T, L, K]
        np.testing.assert_array_equal(trace.experts, want.numpy())


def assert_moves_logits(engine: Engine, model: Model, what: str = "") -> None:
    """A feature dropped from `engine` moves its logits well past the tolerance (100x): the feature is in play."""
    logits = run_steps(engine, model.tokens[:-1])
    assert (logits - model.logits[:-1]).abs().max() > 100 * 1e-4 * model.logits.abs().max(), what
