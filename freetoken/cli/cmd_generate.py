"""ft generate: run the live engine on one prompt; text on stdout, a progress line (tok/s, hit rate) on stderr."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from freetoken.paths import DEMO_MODEL
from freetoken.cli.common import add_cache_args, add_placement_args, cache_config_from_args
from freetoken.kv_dtype import KV_DTYPE_HELP, check_kv_dtype
from freetoken.quant.head import HEAD_HELP, check_lm_head

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
    p.add_argument("--temperature", type=float, help="default: generation_config.json's, else 1.0")
    p.add_argument("--top-p", type=float, help="default: generation_config.json's, else 1.0")
    p.add_argument("--top-k", type=int, help="default: generation_config.json's, else 0 (no cut)")
    p.add_argument("--min-p", type=float, help="drop tokens less likely than this x the most likely one; default: "
                                               "generation_config.json's, else 0")
    p.add_argument("--repetition-penalty", type=float, help="divide the prompt's and the output's tokens' positive "
                                                            "logits by it (multiply negative ones); default: "
                                                            "generation_config.json's, else 1")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtract this from a token's logit once it is in the output (OpenAI's; in [-2, 2])")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="subtract this per earlier occurrence in the output (OpenAI's; in [-2, 2])")
    p.add_argument("--logit-bias", help="comma-separated ID=BIAS pairs added to those tokens' logits (BIAS in "
                                        "[-100, 100]), e.g. 13=-100,42=5")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--stop-token-ids", help="comma-separated ids that end generation (default: the model's eos)")
    add_cache_args(p)
    p.add_argument("--threads", type=int, help="host threads of torch and the host kernels (CPU lane, CPU-only "
                                               "engine); default: torch's, the physical cores")
    p.add_argument("--max-context", type=int, help="context length the KV cache holds (default: the model's, at "
                                                   "most 4096)")
    p.add_argument("--kernels", choices=["auto", "triton", "host", "reference"], default="auto",
                   help="auto (default): Triton with CUDA, the host kernels on a CPU-only machine (C built for this "
                        "CPU; Triton would only interpret there); reference: the torch references in fp32 (slow, "
                        "for checking); triton on a CPU runs Triton's interpreter (slow, for checking kernels)")
    p.add_argument("--device", help="cuda | cpu (default: cuda when available)")
    add_placement_args(p)
    p.add_argument("--dtype", choices=DTYPES, default="auto", help="weights dtype (default: the checkpoint's)")
    p.add_argument("--kv-dtype", default="auto", help=KV_DTYPE_HELP)
    p.add_argument("--lm-head", default="checkpoint", help=HEAD_HELP)
    p.add_argument("--record-trace", help="write the run's routing trace here (.safetensors)")
    p.add_argument("--draft", choices=["ngram"], help="speculative decoding with a model-free drafter (n-gram prompt "
                                                      "lookup; greedy only: the output is plain greedy's)")
    p.add_argument("--draft-depth", type=int, default=4, help="--draft: tokens drafted per verify step (d; the "
                                                              "verify forward carries d + 1; default 4)")
    p.add_argument("--draft-ngram", type=int, default=3, help="--draft: longest context suffix matched (default 3)")
    p.add_argument("--router-hint", action="store_true",
                   help="run the early router (layer l + 1's on layer l's hidden state), record its predictions "
                        "and report their accuracy (on by itself with --policy-option hint=router)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    p.set_defaults(run=run)


def _ids(text: str, what: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated integers, got {text!r}") from None


def build_engine(args: argparse.Namespace, tokenizer=None):
    """The weights load here, last: what the flags and the checkpoint's small files decide is checked before
    (run, read_small_files)."""
    import torch

    from dataclasses import replace

    from freetoken.engine import Engine
    from freetoken.engine.runtime import resolve_device
    from freetoken.engine.kernelset import resolve_kernels
    from freetoken.placement.config import policy_options
    from freetoken.sim.run import future_stream

    cache = cache_config_from_args(args)  # belady & co.: the future is the recorded trace's calls at this chunk
    options = policy_options(cache, future=future_stream(cache))
    cache = replace(cache, options=options, profile=None, future=None)
    if args.threads is not None and args.threads <= 0:
        raise ValueError(f"--threads must be positive, got {args.threads}")
    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    check_kv_dtype(args.kv_dtype)
    resolve_device(args.device, "--device")
    args.kernels = resolve_kernels(args.kernels)
    if check_lm_head(args.lm_head) == "int8" and args.kernels != "host":  # (before the weights load)
        raise ValueError(f"--lm-head int8 is read by the host kernels (the CPU engine) only, not --kernels "
                         f"{args.kernels}")
    return Engine.from_pretrained(args.model, cache, dtype=dtype, tokenizer=tokenizer, kernels=args.kernels,
                                  device=args.device, max_context=args.max_context,
                                  router_hint=True if args.router_hint else None, kv_dtype=args.kv_dtype,
                                  placement=args.placement, eager=args.eager, threads=args.threads,
                                  lm_head=args.lm_head)


def host_line(kernels: str, threads: int) -> str | None:
    """Which host path a CPU run takes: this CPU's C kernels, the portable ones, or torch (and why)."""
    if kernels != "host":
        return None
    from freetoken.host import kernels as hk

    if not hk.available():
        return f"torch: {hk.unavailable_reason()}"
    path = "AVX512-BF16" if hk.path_a() else "portable"
    if q := hk.path_q():
        path += f" + int4 x int8 {q}"
    return f"C {path}, {threads} thread{'s' if threads > 1 else ''}"


def logit_bias_arg(text: str | None, vocab: int) -> tuple[tuple[int, float], ...]:
    """--logit-bias ID=BIAS,... -> ((id, bias), ...), each id in the vocabulary."""
    out = []
    for item in (text or "").split(","):
        if not item.strip():
            continue
        try:
            token, bias = item.split("=")
            token, bias = int(token), float(bias)
        except ValueError:
            raise ValueError(f"--logit-bias: expected ID=BIAS pairs, got {item!r}") from None
        if not 0 <= token < vocab:
            raise ValueError(f"--logit-bias: token id {token} is not in the vocabulary of {vocab}")
        out.append((token, bias))
    return tuple(out)


def draft_config(args: argparse.Namespace):
    """The --draft flags as a DraftConfig (None without --draft); a draft flag without --draft is an error."""
    from freetoken.engine.draft import DraftConfig

    if args.draft is None:
        for flag, value, default in (("--draft-depth", args.draft_depth, 4), ("--draft-ngram", args.draft_ngram, 3)):
            if value != default:
                raise ValueError(f"{flag} applies only with --draft ngram")
        return None
    if not args.greedy and args.temperature != 0:
        raise ValueError("--draft verifies greedily: add --greedy (or --temperature 0)")
    for flag, value, plain in (("--repetition-penalty", args.repetition_penalty, (None, 1.0)),
                               ("--presence-penalty", args.presence_penalty, (0.0,)),
                               ("--frequency-penalty", args.frequency_penalty, (0.0,)),
                               ("--logit-bias", args.logit_bias, (None,))):
        if value not in plain:
            raise ValueError(f"--draft keeps the tokens plain greedy decoding would choose: drop {flag}")
    if args.draft_depth < 1:
        raise ValueError(f"--draft-depth must be >= 1, got {args.draft_depth}")
    if args.draft_ngram < 1:
        raise ValueError(f"--draft-ngram must be >= 1, got {args.draft_ngram}")
    return DraftConfig(args.draft, depth=args.draft_depth, max_ngram=args.draft_ngram)


def check_room(prompt_tokens: int, args: argparse.Namespace, context: int) -> None:
    """The KV cache holds the prompt and every generated token but the last (sampled, never attended to)."""
    need = prompt_tokens + args.max_tokens - 1
    if need > context:
        have = (f"--max-context {context}" if args.max_context is not None else
                f"the default context of {context} tokens (--max-context sets it)")
        raise ValueError(f"{have} is too short: the prompt's {prompt_tokens} tokens and --max-tokens "
                         f"{args.max_tokens} need a context of {need}")


def prompt_ids(args: argparse.Namespace, tok) -> list[int]:
    from freetoken.models.tokenizer import chat_prompt

    if args.token_ids is not None:
        if args.chat:
            raise ValueError("--chat applies to --prompt text, not --token-ids")
        ids = _ids(args.token_ids, "--token-ids")
        if not ids:
            raise ValueError("--token-ids: give at least one token id")
        return ids
    text = args.prompt if args.prompt is not None else "The experts"
    if args.chat:
        return chat_prompt(tok, text, args.system)
    if tok is None:
        raise ValueError(f"{args.model}: no tokenizer.json, so --prompt cannot be encoded; use --token-ids")
    ids = list(tok.encode(text, add_special_tokens=False))
    if not ids:
        raise ValueError("--prompt encodes to no tokens")
    return ids


def read_small_files(args: argparse.Namespace):
    """What the checkpoint's small files decide, before its weights load: config.json (--n-cpu-moe, the default
    context), the tokenizer (the prompt against --max-context), generation_config.json (the sampling). ->
    (tokenizer, prompt ids, SamplingParams)."""
    from freetoken.cli.common import check_cpu_moe, policy_from_args
    from freetoken.defaults import context_length
    from freetoken.engine.sampling import load_generation_defaults, sampling_params
    from freetoken.models.checkpoint import read_config, resolve_dir
    from freetoken.models.tokenizer import load_tokenizer

    path = resolve_dir(args.model)
    config = read_config(path)[1]
    check_cpu_moe(policy_from_args(args)[1], path, config)
    sampling = sampling_params(load_generation_defaults(path), args.temperature, args.top_p, args.top_k,
                               greedy=args.greedy, seed=args.seed, min_p=args.min_p,
                               repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
                               frequency_penalty=args.frequency_penalty,
                               logit_bias=logit_bias_arg(args.logit_bias, config.vocab_size))
    tok = load_tokenizer(path)
    ids = prompt_ids(args, tok)
    check_room(len(ids), args, context_length(config, args.max_context))
    return tok, ids, sampling


def run(args: argparse.Namespace) -> int:
    from freetoken.cli.common import check_output, parse_options, print_json
    from freetoken.placement.carry import DRAFTS
    from freetoken.trace import save

    if args.max_tokens <= 0:
        raise ValueError(f"--max-tokens must be positive, got {args.max_tokens}")
    if args.max_context is not None and args.max_context <= 0:
        raise ValueError(f"--max-context must be positive, got {args.max_context}")
    if args.system is not None and not args.chat:  # else dropped without a word
        raise ValueError("--system applies with --chat (a system turn of the chat template)")
    if args.record_trace:
        check_output(args.record_trace, "--record-trace")
    draft = draft_config(args)
    if draft is None and parse_options(args.policy_option).get("carry") == DRAFTS:
        raise ValueError("--policy-option carry=drafts hands the rejected drafts to the policy: add --draft ngram")
    tok, ids, sampling = read_small_files(args)
    engine = build_engine(args, tok)
    stops = None if args.stop_token_ids is None else _ids(args.stop_token_ids, "--stop-token-ids")
    store = engine.store
    for note in engine.checkpoint.notes:  # what loading left out (a multimodal checkpoint's vision tower)
        sys.stderr.write(note + "\n")
    if Path(args.model).resolve() == DEMO_MODEL.resolve():
        sys.stderr.write("demo model: tiny, random weights (its text is noise; it shows the engine, not a model)\n")
    host = host_line(args.kernels, engine.threads)
    sys.stderr.write(f"experts: {store.format}, {store.expert_bytes / 2**20:.2f} MiB each; kernels: {args.kernels}"
                     f"{f' ({host})' if host else ''}; KV cache: {args.kv_dtype}"
                     f"{'; LM head: int8' if args.lm_head == 'int8' else ''}\n")
    sys.stderr.write(engine.cache.placement_line + "\n" + engine.decode_line + "\n")
    from freetoken.placement.warmup import warm_policy

    warm_policy(engine.cache.policy)  # compiled before the clock starts, not inside the first prefill's time
    engine.count_launches = args.json and engine.kernels.name == "triton"  # the device kernels' count
    out: list[int] = []
    shown = ""
    live = sys.stderr.isatty()
    t0 = time.perf_counter()
    for token in engine.generate(ids, sampling, max_tokens=args.max_tokens, stop_token_ids=stops, draft=draft):
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
    signals = _signals(engine, draft)
    if args.json:
        print_json({"token_ids": out, "text": text, "prompt_tokens": len(ids), "hits": c.hits, "misses": c.misses,
                    "fetched": c.fetched, "cpu": c.cpu, "evictions": c.evictions, "hit_rate": c.hit_rate,
                    "fetched_bytes": c.fetched_bytes, "capacity": engine.cache.capacity,
                    "tok_s": s.decode_tok_s, "prefill_tok_s": s.prefill_tok_s, "wall_s": wall,
                    "policy": engine.cache.config.policy, "split": engine.cache.config.split.mode, "kernels": args.kernels,
                    "kv_dtype": args.kv_dtype, "lm_head": args.lm_head, "device": str(engine.device),
                    "experts": store.format,
                    "host_kernels": host, "threads": engine.threads,
                    "trace": args.record_trace, **signals, **_launch_counts(engine)})
    else:
        sys.stdout.write("\n" if tok is not None else " ".join(map(str, out)) + "\n")
    sys.stderr.write(("\r" if live else "") + _progress(engine, len(out)) + "\n")
    if "draft" in signals:
        d = signals["draft"]
        sys.stderr.write(f"draft ngram depth {d['depth']}: {d['accepted']} of {d['drafted']} drafted tokens accepted "
                         f"({d['acceptance']:.1%}) in {d['verify_steps']} verify steps\n")
        if d["carry_used"]:
            told = f"; {d['carry_told']} keys told to the policy" if "carry_told" in d else ""
            sys.stderr.write(f"drafts' carry: {d['carry_named']} of {d['carry_used']} experts of the verify steps "
                             f"named by the step before's rejected drafts ({d['carry_accuracy']:.1%}){told}\n")
    if "hint_accuracy" in signals:
        acc = signals["hint_accuracy"]
        sys.stderr.write("router hint accuracy per layer (share of the true top-k predicted): "
                         + " ".join("-" if a is None else f"{a:.2f}" for a in acc) + "\n")
    return 0


def _signals(engine, draft) -> dict:
    """The run's look-ahead signals: the drafter's acceptance and the router hint's per-layer accuracy."""
    from freetoken.trace.stats import hint_accuracy

    out = {}
    if draft is not None:
        st = engine.draft_stats
        out["draft"] = {"method": draft.method, "depth": draft.depth, "verify_steps": st.verify_steps,
                        "drafted": st.drafted, "accepted": st.accepted, "acceptance": st.acceptance,
                        "carry_used": st.carry_used, "carry_named": st.carry_named,
                        "carry_accuracy": st.carry_accuracy}
        if engine.cache.carry is not None:  # the policy reads the carry: the keys it added to the router hint's
            out["draft"]["carry_told"] = engine.cache.policy.hint.told
    if engine.hinting and engine.recorder is not None:
        out["hint_accuracy"] = [None if a != a else float(a) for a in hint_accuracy(engine.trace())]
    return out


def _launch_counts(engine) -> dict:
    """One decode token's GPU kernels and host syncs (engine/launch_count.py); None without a counted step (fewer
    than 3 tokens, or a kernel set other than Triton's: the host set launches none, the references are torch)."""
    from freetoken.engine.launch_count import StepCount

    if engine.step_count is not None:
        return engine.step_count.to_dict()
    return dict.fromkeys(StepCount.keys())


def _progress(engine, n: int) -> str:
    c, s = engine.counters, engine.stats
    return (f"{n} tokens  {s.decode_tok_s:.1f} tok/s decode  {s.prefill_tok_s:.1f} tok/s prefill  "
            f"hit rate {c.hit_rate:.1%}  fetched {c.fetched}  cpu {c.cpu}  evictions {c.evictions}")
