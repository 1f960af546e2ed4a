"""Small helpers shared by the subcommands.

Building the parser imports nothing heavy (no numpy, numba or torch: `ft --help` is instant); a command imports
what it needs when it runs, and flags whose choices live in a registry take them through LazyChoices.
"""

from __future__ import annotations

import importlib
import json
import sys


class LazyChoices:
    """argparse choices read from `module`.`name` (any iterable of names) the first time they are needed: checking
    a value, or a help page (give the flag a metavar, and %(choices)s in its help to list them)."""

    def __init__(self, module: str, name: str, sort: bool = False, where=None):
        """where: for a mapping, keep the keys whose value passes it (e.g. the policies needing no future)."""
        self._module, self._name, self._sort, self._where = module, name, sort, where
        self._names: list[str] | None = None

    def _get(self) -> list[str]:
        if self._names is None:
            found = getattr(importlib.import_module(self._module), self._name)
            names = [k for k, v in found.items() if self._where(v)] if self._where else list(found)
            self._names = sorted(names) if self._sort else names
        return self._names

    def __iter__(self):
        return iter(self._get())

    def __contains__(self, value) -> bool:
        return value in self._get()

    def __len__(self) -> int:
        return len(self._get())


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=None, default=_default)
    sys.stdout.write("\n")


def _default(o):
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def check_output(path: str, flag: str) -> None:
    """An output file's path mistakes, found before a run spends its time (atomic_path words the same ones)."""
    from pathlib import Path

    from freetoken.io import output_problem

    problem = output_problem(Path(path))
    if problem:
        raise ValueError(f"{flag} {path}: cannot write ({problem})".lstrip())


def add_split_args(p) -> None:
    """The miss-split flags, one definition for `ft sim` and `ft generate` so the two cannot drift."""
    p.add_argument("--split", choices=["offload", "hybrid", "cpu"],
                   help="misses: fetch over PCIe (offload, the default), compute on the CPU (cpu), or both (hybrid)")
    p.add_argument("--rule", choices=["balanced", "paper", "max_fetch"],
                   help="hybrid: how many misses to fetch (default balanced)")
    p.add_argument("--bp", type=float, help="hybrid: pinned PCIe bandwidth, GB/s")
    p.add_argument("--bh", type=float, help="hybrid: host expert-processing bandwidth, GB/s")
    p.add_argument("--max-fetch", type=int, help="hybrid --rule max_fetch: fetch at most this many")
    p.add_argument("--fetch-order", default="most_tokens", metavar="ORDER",
                   choices=LazyChoices("freetoken.placement.split", "FETCH_ORDERS", sort=True),
                   help="hybrid: which misses are fetched first: %(choices)s")
    p.add_argument("--stream-prefill", action="store_true",
                   help="prefill fetches stream through staging and leave the cache as decode left it")


def split_from_args(args, default_mode: str = "offload"):
    """A hybrid-only flag given with another split, or --max-fetch without --rule max_fetch, is an error."""
    from freetoken.placement import Split

    values = {k: getattr(args, k) for k in SPLIT_FLAGS if getattr(args, k) is not None}
    split = Split(args.split or default_mode, **{**SPLIT_DEFAULTS, **values}, fetch_order=args.fetch_order,
                  admit_prefill=not args.stream_prefill)
    return split  # CacheConfig refuses a flag this split does not read (split.check_used)


# the expert cache: one flag vocabulary for ft sim / generate / serve (predict: the size and --n-cpu-moe), close to
# llama.cpp's (--cpu-moe, --n-cpu-moe N); the flags become one freetoken.placement.CacheConfig
DEFAULT_FRACTION = 0.5  # sim / generate without --capacity or --fraction: half the experts hold a GPU slot
CLI_NAMES = {"policy": "--policy", "capacity": "--capacity", "fraction": "--fraction", "split": "--split",
             "prefill_chunk": "--prefill-chunk", "options": "--policy-option", "profile": "--profile-trace",
             "future": "--future-trace", "expert_bytes": "--expert-bytes", "mode": "--split", "rule": "--rule",
             "bp": "--bp", "bh": "--bh", "max_fetch": "--max-fetch", "batch": "--batch",
             "draft_depth": "--draft-depth", "acceptance": "--acceptance", "draft_seed": "--draft-seed",
             "n_cpu_layers": "--n-cpu-moe",  # static_layers' option, as llama.cpp spells it
             "temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k", "seed": "--seed",  # sampling
             "min_p": "--min-p", "repetition_penalty": "--repetition-penalty",
             "presence_penalty": "--presence-penalty", "frequency_penalty": "--frequency-penalty",
             "logit_bias": "--logit-bias"}
SPLIT_FLAGS = {"rule": "--rule", "bp": "--bp", "bh": "--bh", "max_fetch": "--max-fetch"}  # hybrid only
SPLIT_DEFAULTS = {"rule": "balanced", "bp": 0.0, "bh": 0.0, "max_fetch": 0}


def add_policy_args(p, *, online: bool = False, future: bool = True) -> None:
    """--policy and its options; online: only the policies that read no future (a server's)."""
    keep = (lambda cls: not cls.needs_future) if online else None
    p.add_argument("--policy", metavar="NAME", choices=LazyChoices("freetoken.placement", "POLICIES", True, keep),
                   help="expert placement policy, one of %(choices)s (default lru; static_layers with --cpu-moe / "
                        "--n-cpu-moe)")
    cpu = p.add_mutually_exclusive_group()
    cpu.add_argument("--cpu-moe", action="store_true",
                     help="as llama.cpp: every routed expert on the CPU (static_layers, --split cpu unless given)")
    cpu.add_argument("--n-cpu-moe", "--n-cpu-layers", dest="n_cpu_moe", type=int, metavar="N",
                     help="as llama.cpp: the first N MoE layers' experts on the CPU, the rest resident "
                          "(static_layers, --split cpu unless given)")
    p.add_argument("--scope", choices=["per_layer", "global", "unified"],
                   help="frequency: pin per layer or globally; lru: one pool (unified) or a quota per layer")
    p.add_argument("--pool-split", choices=["equal", "profile"],
                   help="lru --scope per_layer: equal quotas, or by the experts each layer uses on --profile-trace")
    p.add_argument("--strategy", choices=["frequency", "uniform", "front_loading"],
                   help="frequency, ktransformers_dynamic: KTransformers' placement strategy (uniform and "
                        "front_loading need no profile)")
    p.add_argument("--policy-option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other option of the policy (e.g. decay=0.8, bypass=false, small=0.2); repeatable")
    p.add_argument("--profile-trace", "--profile", dest="profile_trace", metavar="TRACE",
                   help="frequency, ktransformers_dynamic, lru --pool-split profile: trace whose expert counts "
                        "they read; moe_infinity: its library of past requests"
                        + (" (sim default: the replayed trace, in-sample)" if future else ""))
    if future:
        p.add_argument("--future-trace", metavar="TRACE",
                       help="belady, lookahead, hinted_sweep: a trace recorded on the same input (the future they "
                            "read; sim default: the replayed trace)")


def add_size_args(p, default: str) -> None:
    """--capacity | --fraction: both given is the cache config's error (the same line as everywhere), not argparse's."""
    p.add_argument("--capacity", type=int, metavar="SLOTS", help=f"GPU expert slots (default: {default})")
    p.add_argument("--fraction", type=float, help="GPU expert slots as a fraction of all experts, in (0, 1]")


def add_placement_args(p) -> None:
    """--placement and --eager: where the engine's policy decides and how decode steps run (ft generate, ft serve)."""
    p.add_argument("--placement", choices=["auto", "device", "host"], default="auto",
                   help="where the policy decides: auto (default): on the device with CUDA for lru, static_layers "
                        "and frequency, else on the host; device (on a CPU: Triton's interpreter); host")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs for the decode step (they need CUDA and "
                                                        "the device placement)")


def add_cache_args(p, *, future: bool = True) -> None:
    """Everything of the one cache config: policy + options, size, split, prefill chunk (ft sim, ft generate)."""
    from freetoken.defaults import DEFAULT_PREFILL_CHUNK

    add_policy_args(p, future=future)
    add_size_args(p, f"a fraction of {DEFAULT_FRACTION}; --cpu-moe: 0; --n-cpu-moe: every GPU layer's experts")
    add_split_args(p)
    p.add_argument("--prefill-chunk", type=int, default=DEFAULT_PREFILL_CHUNK, help="tokens per prefill call")


def policy_from_args(args) -> tuple[str, dict]:
    """(policy, options) from the policy flags; a flag the chosen policy does not read is an error naming it."""
    from freetoken.placement.config import policy_option_names

    cpu_flag = "--cpu-moe" if args.cpu_moe else "--n-cpu-moe" if args.n_cpu_moe is not None else None
    policy = args.policy or ("static_layers" if cpu_flag else "lru")
    options = parse_options(args.policy_option)
    given = {"n_cpu_layers": cpu_flag, "scope": "--scope" if args.scope is not None else None,
             "strategy": "--strategy" if args.strategy is not None else None,
             "split": "--pool-split" if args.pool_split is not None else None}
    values = {"n_cpu_layers": "all" if args.cpu_moe else args.n_cpu_moe, "scope": args.scope,
              "strategy": args.strategy, "split": args.pool_split}
    for option, flag in given.items():
        if flag is None:
            continue
        if option not in policy_option_names(policy):
            raise ValueError(f"{flag} does nothing for --policy {policy}")
        if option in options:
            raise ValueError(f"{flag} and --policy-option {option}=... say the same thing; give one")
        options[option] = values[option]
    return policy, options


def parse_options(items: list[str]) -> dict:
    """["decay=0.8", "bypass=false"] -> {"decay": 0.8, "bypass": False} (ints, floats, booleans, else strings)."""
    import ast

    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--policy-option {item!r}: expected KEY=VALUE")
        words = {"true": True, "false": False, "none": None, "null": None}
        if text.lower() in words:
            out[key] = words[text.lower()]
            continue
        try:
            out[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            out[key] = text
    return out


def check_cpu_moe(options: dict, model, config=None) -> None:
    """--n-cpu-moe N against the checkpoint's MoE layers, from its config.json before any weight loads. config: its
    ModelConfig where the caller has read it already (else read here, only when N is given)."""
    n = options.get("n_cpu_layers")
    if n is None or n == "all":  # --cpu-moe: every MoE layer, however many
        return
    from freetoken.models.checkpoint import read_config, resolve_dir
    from freetoken.placement.policies.static_layers import check_cpu_layers

    path = resolve_dir(model)
    layers = (config if config is not None else read_config(path)[1]).num_moe_layers
    check_cpu_layers(n, layers, f"{path / 'config.json'} has {layers} MoE layers")


def cache_config_from_args(args, config_class=None, **extra):
    """The one CacheConfig of ft sim / ft generate, its errors worded with the flags (--fraction, --policy, ...)."""
    from freetoken.placement import CacheConfig, cache_config

    policy, options = policy_from_args(args)
    cpu_moe = args.cpu_moe or args.n_cpu_moe is not None
    capacity, fraction = args.capacity, args.fraction
    if capacity is None and fraction is None:  # --cpu-moe keeps no expert on the GPU; --n-cpu-moe N the other layers
        capacity, fraction = (0, None) if args.cpu_moe else (None, 1.0 if cpu_moe else DEFAULT_FRACTION)
    split = split_from_args(args, default_mode="cpu" if cpu_moe else "offload")
    return cache_config(CLI_NAMES, config_class or CacheConfig, policy=policy, options=options, capacity=capacity, fraction=fraction, split=split,
                        prefill_chunk=args.prefill_chunk, profile=args.profile_trace,
                        future=getattr(args, "future_trace", None), **extra)
