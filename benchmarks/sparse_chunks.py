"""How the prefill chunk moves the logits of sparse-attention models: GLM-5 (DeepSeek sparse attention) and
DeepSeek-V4 (a lightning indexer over compressed entries), tiny random checkpoints (shapes and seeds no test uses).

Per model: HF transformers' one-shot forward over the prompt (the reference), HF run token by token over its cache
(what generate's decode steps do), and the engine (fp32 torch references) at several prefill chunks; for each, the
max |logit - one-shot| relative to max |logit|; and the queries whose index_topk-th and next index scores are
exactly equal (relu zeroed every indexer head of both keys): there top-k may pick either, so any two runs that
shape the scores differently may pick differently. GLM-5 twice: 4 indexer heads (ties happen), 16 (they do not).

    python benchmarks/sparse_chunks.py [--tokens 56] [--chunks 56,8,1] [--json PATH]
"""

from __future__ import annotations

import argparse
import json

import freetoken.kernels  # noqa: F401  (before transformers: the interpreter setting for any Triton import)
import torch

GLM5 = dict(hidden_size=96, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
            head_dim=16, vocab_size=160, num_experts_per_tok=2, n_routed_experts=8, moe_intermediate_size=32,
            n_shared_experts=1, first_k_dense_replace=1, n_group=4, topk_group=2, routed_scaling_factor=2.5,
            q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24, index_topk=8,
            index_head_dim=16, index_n_heads=4, indexer_types=["full", "shared", "full"], max_position_embeddings=128,
            initializer_range=0.1, eos_token_id=None, bos_token_id=None, pad_token_id=None)
V4 = dict(hidden_size=96, moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4, head_dim=32,
          q_lora_rank=24, num_experts_per_tok=2, n_routed_experts=8, vocab_size=160, sliding_window=8, o_groups=2,
          o_lora_rank=16, index_n_heads=8, index_head_dim=16, index_topk=4, hc_mult=4, partial_rotary_factor=0.25,
          compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
          layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
          mlp_layer_types=["hash_moe", "moe", "moe"], max_position_embeddings=128, initializer_range=0.1,
          eos_token_id=None, bos_token_id=None, pad_token_id=None)


def build(model_type: str, kw: dict, out, seed: int):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **kw)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.3)
            elif name.endswith("tid2eid"):
                b.copy_(torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(b.shape[0])]))
        for name, p in hf.named_parameters():
            if any(s in name for s in ("sinks", "position_bias", ".base", "scale")):
                p.add_(torch.randn(p.shape, generator=g) * 0.3)
    hf.save_pretrained(out)
    return hf


def hf_runs(hf, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(one-shot logits [T, V], token-by-token logits [T, V] over HF's own cache)."""
    from transformers import DynamicCache

    with torch.no_grad():
        one = hf(torch.tensor([tokens])).logits[0].float()
        cache, steps = DynamicCache(config=hf.config), []
        for t in tokens:
            out = hf(torch.tensor([[t]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits[0, -1].float())
    return one, torch.stack(steps)


def engine_logits(path, tokens: list[int], chunk: int) -> torch.Tensor:
    from freetoken.engine import Engine

    engine = Engine.from_pretrained(path, kernels="reference", device="cpu", prefill_chunk=chunk)
    return engine.prefill(tokens, engine.new_kv(len(tokens)), all_logits=True).float()


def tied_queries(path, tokens: list[int]) -> tuple[int, int]:
    """(queries whose k-th and (k+1)-th index scores are equal, queries that pick among more than k keys), from the
    engine's own index scores (one prefill of the whole prompt)."""
    import freetoken.engine.dsa as dsa
    import freetoken.engine.v4_compressor as v4c
    from freetoken.engine import Engine

    counts = [0, 0]
    real = dsa.top_indices

    def spy(scores, k):
        if scores.shape[1] > k:
            top = torch.sort(scores, dim=-1, descending=True).values[:, k - 1:k + 1]
            live = torch.isfinite(top[:, 1])
            counts[0] += int(((top[:, 0] == top[:, 1]) & live).sum())
            counts[1] += int(live.sum())
        return real(scores, k)

    dsa.top_indices, v4c.top_indices = spy, spy
    try:
        engine = Engine.from_pretrained(path, kernels="reference", device="cpu", prefill_chunk=len(tokens))
        engine.prefill(tokens, engine.new_kv(len(tokens)))
    finally:
        dsa.top_indices, v4c.top_indices = real, real
    return counts[0], counts[1]


def measure(name: str, hf, path, tokens: list[int], chunks: list[int]) -> list[dict]:
    one, steps = hf_runs(hf, tokens)
    scale = one.abs().max().item()
    ties, queries = tied_queries(path, tokens)
    rows = [{"model": name, "run": "HF token by token", "max_abs": (steps - one).abs().max().item()}]
    for chunk in chunks:
        got = engine_logits(path, tokens, chunk)
        rows.append({"model": name, "run": f"engine, prefill chunk {chunk}", "max_abs": (got - one).abs().max().item(),
                     "vs_first_chunk": (got - engine_logits(path, tokens, chunks[0])).abs().max().item()})
    for row in rows:
        row |= {"relative": row["max_abs"] / scale, "tied_queries": ties, "selecting_queries": queries}
    return rows


def main(argv: list[str] | None = None) -> int:
    import tempfile
    from pathlib import Path

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=56)
    p.add_argument("--chunks", default="56,8,1")
    p.add_argument("--json")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    chunks = [int(c) for c in args.chunks.split(",")]
    tokens = torch.randint(0, 160, (args.tokens,), generator=torch.Generator().manual_seed(11)).tolist()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, model_type, kw in (("GLM-5, 4 idx heads", "glm_moe_dsa", GLM5),
                                     ("GLM-5, 16 idx heads", "glm_moe_dsa", dict(GLM5, index_n_heads=16)),
                                     ("DeepSeek-V4", "deepseek_v4", V4)):
            path = Path(tmp) / name.replace(" ", "_").replace(",", "")
            rows += measure(name, build(model_type, kw, path, seed=7), path, tokens, chunks)
    for r in rows:
        same = f", vs chunk {chunks[0]}: {r['vs_first_chunk']:.2g}" if "vs_first_chunk" in r else ""
        print(f"{r['model']:20s} {r['run']:26s} max |logit - HF one-shot| = {r['max_abs']:.3g} "
              f"({r['relative']:.1e} of max |logit|){same}; tied top-k: {r['tied_queries']} of "
              f"{r['selecting_queries']} selecting queries")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
