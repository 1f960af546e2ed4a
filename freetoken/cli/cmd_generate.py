"""ft generate: run the live engine on one prompt; text on stdout, a progress line (tok/s, hit rate) on stderr."""

from __future__ import annotations

import argparse
import sys
import time

from freetoken.paths import DEMO_MODEL
from freetoken.cli.common import LazyChoices, add_split_args, split_from_args

DTYPES = ("auto", "float32", "bfloat16", "float16")


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate with the live engine (expert cache driven by a placement policy)")
    p.add_argument("--model", default=str(DEMO_MODEL), help="local HF checkpoint directory (default: the demo)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="prompt text (default: a short demo prompt)")
    src.add_argument("--token-ids", help="prompt as comma-separated token ids, e.g. 1,2,3")
    p.add_argument("--chat", action="store_true", help="render --prompt as a user turn with the chat template")
    p.add_argument("--system", help="--chat: a system message")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--greedy", action="store_true", help="argmax decoding (same as --temperature 0)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--stop-token-ids", help="comma-separated ids that end generation (default: the model's eos)")
    p.add_argument("--policy", default="lru", metavar="NAME",
                   choices=LazyChoices("freetoken.placement", "POLICIES", sort=True),
                   help="placement policy: %(choices)s")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--capacity", type=int, help="GPU expert slots")
    size.add_argument("--fraction", type=float, help="GPU expert slots as a fraction of all experts "
                                                     "(default: 0.5)")
    add_split_args(p)
    p.add_argument("--profile-trace", help="frequency: trace whose expert counts choose the pinned experts")
    p.add_argument("--future-trace", help="belady: a trace recorded on the same input (the future it needs)")
    p.add_argument("--prefill-chunk", type=int, default=2048)
    p.add_argument("--kernels", choices=["triton", "reference"], default="triton")
    p.add_argument("--device", help="cuda | cpu (default: cuda when available)")
    p.add_argument("--dtype", choices=DTYPES, default="auto", help="weights dtype (default: the checkpoint's)")
    p.add_argument("--record-trace", help="write the run's routing trace here (.safetensors)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    p.set_defaults(run=run)


def _ids(text: str, what: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated integers, got {text!r}") from None


def build_engine(args: argparse.Namespace):
    import torch

    from freetoken.engine import CacheConfig, Engine
    from freetoken.trace.stats import expert_counts
    from sim.calls import trace_key_stream
    from freetoken.trace import load

    split = split_from_args(args)
    options = {}
    if args.policy == "frequency":
        if not args.profile_trace:
            raise ValueError("--policy frequency needs --profile-trace (a trace whose counts pick the pinned experts)")
        options["profile"] = expert_counts(load(args.profile_trace))
    if args.policy == "belady":
        if not args.future_trace:
            raise ValueError("--policy belady needs --future-trace (a trace recorded on the same input)")
        options["future"] = trace_key_stream(load(args.future_trace), args.prefill_chunk)
    fraction = 0.5 if args.capacity is None and args.fraction is None else args.fraction
    cache = CacheConfig(args.policy, capacity=args.capacity, fraction=fraction, split=split, options=options)
    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    return Engine.from_pretrained(args.model, cache, dtype=dtype, kernels=args.kernels, device=args.device,
                                  prefill_chunk=args.prefill_chunk)


def prompt_ids(args: argparse.Namespace, engine) -> list[int]:
    from freetoken.models.tokenizer import chat_prompt

    if args.token_ids is not None:
        if args.chat:
            raise ValueError("--chat applies to --prompt text, not --token-ids")
        ids = _ids(args.token_ids, "--token-ids")
        if not ids:
            raise ValueError("--token-ids: give at least one token id")
        return ids
    text = args.prompt if args.prompt is not None else "The experts"
    tok = engine.tokenizer
    if args.chat:
        return chat_prompt(tok, text, args.system)
    if tok is None:
        raise ValueError(f"{args.model}: no tokenizer.json, so --prompt cannot be encoded; use --token-ids")
    ids = list(tok.encode(text, add_special_tokens=False))
    if not ids:
        raise ValueError("--prompt encodes to no tokens")
    return ids


def run(args: argparse.Namespace) -> int:
    from freetoken.cli.common import print_json
    from freetoken.engine import SamplingParams
    from freetoken.placement.device import placement_line
    from freetoken.trace import save

    if args.max_tokens <= 0:
        raise ValueError(f"--max-tokens must be positive, got {args.max_tokens}")
    sampling = SamplingParams(temperature=0.0 if args.greedy else args.temperature, top_p=args.top_p,
                              top_k=args.top_k, greedy=args.greedy, seed=args.seed)
    engine = build_engine(args)
    ids = prompt_ids(args, engine)
    stops = None if args.stop_token_ids is None else _ids(args.stop_token_ids, "--stop-token-ids")
    store = engine.store
    sys.stderr.write(f"experts: {store.format}, {store.expert_bytes / 2**20:.2f} MiB each\n")
    sys.stderr.write(placement_line(engine.cache.policy) + "\n")
    tok = engine.tokenizer
    out: list[int] = []
    shown = ""
    live = sys.stderr.isatty()
    t0 = time.perf_counter()
    for token in engine.generate(ids, sampling, max_tokens=args.max_tokens, stop_token_ids=stops):
        out.append(token)
        if not args.json and tok is not None:
            text = tok.decode(out, skip_special_tokens=True)
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text
        if live:
            sys.stderr.write("\r" + _progress(engine, len(out)))
            sys.stderr.flush()
    wall = time.perf_counter() - t0
    text = tok.decode(out, skip_special_tokens=True) if tok is not None else ""
    if args.record_trace:
        save(engine.trace(), args.record_trace)
    c, s = engine.counters, engine.stats
    if args.json:
        print_json({"token_ids": out, "text": text, "prompt_tokens": len(ids), "hits": c.hits, "misses": c.misses,
                    "fetched": c.fetched, "cpu": c.cpu, "evictions": c.evictions, "hit_rate": c.hit_rate,
                    "fetched_bytes": c.fetched_bytes, "capacity": engine.cache.capacity,
                    "tok_s": s.decode_tok_s, "prefill_tok_s": s.prefill_tok_s, "wall_s": wall,
                    "policy": args.policy, "split": args.split, "kernels": args.kernels,
                    "device": str(engine.device), "experts": store.format, "trace": args.record_trace})
    else:
        sys.stdout.write("\n" if tok is not None else " ".join(map(str, out)) + "\n")
    sys.stderr.write(("\r" if live else "") + _progress(engine, len(out)) + "\n")
    return 0


def _progress(engine, n: int) -> str:
    c, s = engine.counters, engine.stats
    return (f"{n} tokens  {s.decode_tok_s:.1f} tok/s decode  {s.prefill_tok_s:.1f} tok/s prefill  "
            f"hit rate {c.hit_rate:.1%}  fetched {c.fetched}  cpu {c.cpu}  evictions {c.evictions}")
