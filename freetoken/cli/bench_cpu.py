"""ft bench cpu: the engine's CPU path (torch kernels, slot-grouped expert FFN) beside HF transformers on the same
random-weight checkpoint, each in its own process: prefill tok/s, decode tok/s and peak RSS, as ratios in one run.

Both sides run greedy on the same prompt ids; their tokens are compared as a check that they did the same work.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from freetoken.cli.common import print_json

# a small Qwen3-MoE: big enough that expert FFNs dominate, small enough to build and run in seconds on 2 cores
SHAPE = dict(hidden_size=512, intermediate_size=1024, moe_intermediate_size=256, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=4, head_dim=64, num_experts=32, num_experts_per_tok=4,
             norm_topk_prob=True, max_position_embeddings=4096, vocab_size=2048, tie_word_embeddings=False)


def register(sub) -> None:
    p = sub.add_parser("cpu", help="CPU engine vs HF transformers: prefill / decode tok/s and peak memory")
    p.add_argument("--model", help="checkpoint directory (default: a random Qwen3-MoE built in a temp folder)")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--fraction", type=float, default=0.5, help="engine: expert slots as a fraction of all experts")
    p.add_argument("--reps", type=int, default=3, help="timed runs per side after one warm-up (the fastest counts)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", choices=["engine", "hf"], help=argparse.SUPPRESS)
    p.set_defaults(run=run)


def build_random(out: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model("qwen3_moe", eos_token_id=None, bos_token_id=None, pad_token_id=0, **SHAPE)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    return out


def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _prompt(vocab: int, n: int) -> list[int]:
    import numpy as np

    return np.random.default_rng(0).integers(1, vocab, n).tolist()


def _best_of(reps: int, run_once) -> dict:
    """run_once() -> (prefill_s, decode_s, tokens); the fastest of `reps` runs after one warm-up (first-call
    allocations and lazy initialisation are not what this compares)."""
    run_once()
    runs = [run_once() for _ in range(reps)]
    return {"prefill_s": min(r[0] for r in runs), "decode_s": min(r[1] for r in runs), "tokens": runs[0][2]}


def worker_engine(args) -> dict:
    import time

    from freetoken.engine import CacheConfig, Engine

    engine = Engine.from_pretrained(args.model, CacheConfig("lru", fraction=args.fraction), kernels="reference",
                                    device="cpu", record=False)
    ids = _prompt(engine.config.vocab_size, args.prompt_tokens)

    def run_once():
        engine.reset()
        kv = engine.new_kv(args.prompt_tokens + args.decode_tokens + 1)
        t0 = time.perf_counter()
        logits = engine.prefill(ids, kv)
        prefill_s = time.perf_counter() - t0
        tokens = [int(logits[-1].argmax())]
        t0 = time.perf_counter()
        for _ in range(args.decode_tokens):
            tokens.append(int(engine.decode(tokens[-1], kv)[-1].argmax()))
        return prefill_s, time.perf_counter() - t0, tokens

    return {**_best_of(args.reps, run_once), "peak_rss": _peak_rss()}


def worker_hf(args) -> dict:
    import time

    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    ids = _prompt(model.config.vocab_size, args.prompt_tokens)

    @torch.inference_mode()
    def run_once():
        t0 = time.perf_counter()
        out = model(torch.tensor([ids]), use_cache=True)
        prefill_s = time.perf_counter() - t0
        past, tokens = out.past_key_values, [int(out.logits[0, -1].argmax())]
        t0 = time.perf_counter()
        for _ in range(args.decode_tokens):
            out = model(torch.tensor([[tokens[-1]]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            tokens.append(int(out.logits[0, -1].argmax()))
        return prefill_s, time.perf_counter() - t0, tokens

    return {**_best_of(args.reps, run_once), "peak_rss": _peak_rss()}


def _spawn(which: str, args, model: Path) -> dict:
    cmd = [sys.executable, "-m", "freetoken.cli", "bench", "cpu", "--worker", which, "--model", str(model),
           "--prompt-tokens", str(args.prompt_tokens), "--decode-tokens", str(args.decode_tokens),
           "--fraction", str(args.fraction), "--reps", str(args.reps)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise ValueError(f"the {which} run failed: {last.removeprefix('ft bench: error: ')}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> int:
    if min(args.prompt_tokens, args.decode_tokens, args.reps) <= 0:
        raise ValueError("--prompt-tokens, --decode-tokens and --reps must be positive")
    if not 0 <= args.fraction <= 1:
        raise ValueError(f"--fraction must lie in [0, 1], got {args.fraction}")
    if args.worker:
        print(json.dumps((worker_engine if args.worker == "engine" else worker_hf)(args)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(args.model) if args.model else build_random(Path(tmp) / "model")
        eng, hf = _spawn("engine", args, model), _spawn("hf", args, model)
    P, N = args.prompt_tokens, args.decode_tokens
    row = {
        "prompt_tokens": P, "decode_tokens": N, "fraction": args.fraction,
        "engine_prefill_tok_s": P / eng["prefill_s"], "hf_prefill_tok_s": P / hf["prefill_s"],
        "engine_decode_tok_s": N / eng["decode_s"], "hf_decode_tok_s": N / hf["decode_s"],
        "engine_peak_rss_mib": eng["peak_rss"] / 2**20, "hf_peak_rss_mib": hf["peak_rss"] / 2**20,
        "same_tokens": eng["tokens"] == hf["tokens"],
    }
    row["prefill_vs_hf"] = row["engine_prefill_tok_s"] / row["hf_prefill_tok_s"]
    row["decode_vs_hf"] = row["engine_decode_tok_s"] / row["hf_decode_tok_s"]
    row["peak_rss_vs_hf"] = eng["peak_rss"] / hf["peak_rss"]
    if args.json:
        print_json(row)
        return 0
    print(f"CPU engine vs HF transformers, {P}-token prompt, {N} decode tokens, expert cache {args.fraction:.0%}")
    print(f"  prefill  {row['engine_prefill_tok_s']:9.1f} tok/s vs {row['hf_prefill_tok_s']:9.1f}   "
          f"{row['prefill_vs_hf']:.2f}x  (target >= 0.5x)")
    print(f"  decode   {row['engine_decode_tok_s']:9.1f} tok/s vs {row['hf_decode_tok_s']:9.1f}   "
          f"{row['decode_vs_hf']:.2f}x  (target >= 1x)")
    print(f"  peak RSS {row['engine_peak_rss_mib']:9.0f} MiB   vs {row['hf_peak_rss_mib']:9.0f}       "
          f"{row['peak_rss_vs_hf']:.2f}x  (target <= 1.5x)")
    print(f"  greedy tokens equal: {row['same_tokens']}")
    return 0
