"""ft bench cpu: the CPU engine against HF transformers (--against hf) or llama.cpp (--against llama.cpp) on the same
weights, prompt ids and threads, every side in one process, interleaved, best of N (freetoken/calibrate/cpu_race.py):
prefill and decode tok/s, peak RSS of each side alone in a child, greedy tokens compared; against llama.cpp also
bytes read per token and their share of the read bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from freetoken.cli.common import print_json

AGAINST = ("hf", "llama.cpp")
HF_ONLY = ("family", "dtype", "ft_mode")
LLAMA_ONLY = ("rows", "llama_cpp_src")


def register(sub) -> None:
    p = sub.add_parser("cpu", help="CPU engine vs HF transformers or llama.cpp: prefill / decode tok/s, bytes per "
                                   "token, peak memory, in one interleaved run")
    p.add_argument("--against", choices=AGAINST, default="hf", help="hf (default): HF transformers; llama.cpp: "
                   "llama-cpp-python on GGUF files made by llama.cpp's own converter and quantizer")
    p.add_argument("--model", help="checkpoint directory (default: random models built once into --work-dir)")
    p.add_argument("--family", help="--against hf: comma-separated families of the random models (default "
                                    "qwen3_moe,qwen3_5_moe)")
    p.add_argument("--prompt-tokens", help="comma-separated prompt lengths (default: hf 512,2048; llama.cpp 512)")
    p.add_argument("--decode-tokens", type=int, default=32, help="greedy tokens decoded per run (default 32)")
    p.add_argument("--reps", type=int, default=3, help="timed rounds; each side's fastest counts (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds before them (default 1)")
    p.add_argument("--threads", help="comma-separated thread counts, every side at each (default: hf the physical "
                                     "cores; llama.cpp 1 and the physical cores)")
    p.add_argument("--dtype", help="--against hf: bf16 (default) or fp32, both sides")
    p.add_argument("--ft-mode", help="--against hf: the engine's expert placement, all (default: --fraction 1) or "
                                     "cpu-moe (--cpu-moe)")
    p.add_argument("--rows", help="--against llama.cpp: which rows (default all): llama-bf16, llama-q8_0, "
                                  "llama-q4_0, llama-q4_k_m, ft-bf16-cpu-moe, ft-bf16-all, ft-gptq-cpu-moe, "
                                  "ft-gptq-all, ft-gptq-cpu-moe-head8 (--lm-head int8), ft-gptq-head-cpu-moe, "
                                  "ft-gptq-head-all (the checkpoint's LM head in int4 too)")
    p.add_argument("--shape", default="", help="random models' shape overrides, e.g. hidden=256,layers=2 (fields of "
                                               "freetoken.calibrate.checkpoints.RandomMoE)")
    p.add_argument("--llama-cpp-src", help="--against llama.cpp: a llama.cpp source tree with convert_hf_to_gguf.py "
                                           "(default $FT_LLAMA_CPP_SRC, else the installed llama-cpp-python's sdist, "
                                           "downloaded once)")
    p.add_argument("--work-dir", type=Path, help="built checkpoints and GGUF files (default "
                                                 "$XDG_CACHE_HOME/freetoken/bench-cpu)")
    p.add_argument("--no-rss", action="store_true", help="skip the peak-RSS child processes")
    p.add_argument("--out", help="write the results to this .csv or .json file")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.set_defaults(run=run)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected comma-separated integers") from None
    if not values:
        raise ValueError(f"{flag} {text!r}: give at least one value")
    return values


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def base_config(args: argparse.Namespace):
    """The settings both comparisons share, every mistake named by its flag before anything is built."""
    from freetoken.calibrate.cpu_bench import CpuBenchConfig, default_work_dir
    from freetoken.host.kernels import physical_cores
    from freetoken.io import folder_problem

    llama = args.against == "llama.cpp"
    for name in HF_ONLY if llama else LLAMA_ONLY:
        if getattr(args, name) is not None:
            raise ValueError(f"{_flag(name)} applies to --against {'hf' if llama else 'llama.cpp'} only")
    cores = physical_cores()
    prompt = _ints(args.prompt_tokens, "--prompt-tokens") if args.prompt_tokens else ((512,) if llama else (512, 2048))
    threads = (_ints(args.threads, "--threads") if args.threads else
               (tuple(dict.fromkeys((1, cores))) if llama else (cores,)))
    if args.out:
        from freetoken.calibrate.cpu_table import check_out

        check_out(args.out)
    work = args.work_dir or default_work_dir()
    problem = folder_problem(Path(work))
    if problem:
        raise ValueError(f"--work-dir {work}: cannot write ({problem})")
    if args.model is not None and args.shape:
        raise ValueError("--shape sets the random models' shape: drop it with --model")
    if args.model is not None and not Path(args.model).is_dir():
        raise ValueError(f"--model {args.model}: no such checkpoint directory")
    return CpuBenchConfig(prompt_tokens=prompt, decode_tokens=args.decode_tokens, reps=args.reps,
                          warmup=args.warmup, threads=threads, rss=not args.no_rss, work_dir=Path(work))


def run(args: argparse.Namespace) -> int:
    from freetoken.calibrate.cpu_table import write_out
    from freetoken.progress import progress

    base = base_config(args)

    def log(line: str) -> None:
        print(f"  {line}", file=sys.stderr)

    if args.against == "llama.cpp":
        from freetoken.calibrate.checkpoints import RandomMoE
        from freetoken.calibrate.llamacpp import require_llama_cpp
        from freetoken.calibrate.vs_llamacpp import ROWS, LlamaBenchConfig, parse_rows, run_vs_llamacpp

        require_llama_cpp()  # before anything is built
        cfg = LlamaBenchConfig(base, parse_rows(args.rows) if args.rows is not None else tuple(ROWS),
                               Path(args.model) if args.model else None, RandomMoE().with_overrides(args.shape),
                               args.llama_cpp_src)
        result = run_vs_llamacpp(cfg, log, progress)
    else:
        from freetoken.calibrate.vs_hf import HFBenchConfig, run_vs_hf

        families = tuple(f.strip() for f in args.family.split(",") if f.strip()) if args.family else None
        if args.model and families:
            raise ValueError("--family picks the random models: drop it with --model (its config names its family)")
        cfg = HFBenchConfig(base, **({"families": families} if families else {}),
                            model=Path(args.model) if args.model else None, dtype=args.dtype or "bf16",
                            ft_mode=args.ft_mode or "all", shape=args.shape)
        cfg.shapes()  # --shape mistakes now, not after the first family ran
        result = run_vs_hf(cfg, log, progress)
    if args.out:
        write_out(args.out, result)
    if args.json:
        print_json(result)
    else:
        print_result(result)
        if args.out:
            print(f"results written to {args.out}")
    return 0


def print_result(result: dict) -> None:
    from freetoken.calibrate.cpu_table import HF_COLUMNS, LLAMA_COLUMNS, RATIO_COLUMNS, format_table

    load = (result["machine_before"]["load_average"][0], result["machine_after"]["load_average"][0])
    cores = result["machine_before"]["physical_cores"]
    head = (f"best of {result['reps']} interleaved rounds (after {result['warmup']} warm-up), "
            f"{result['decode_tokens']} decode tokens; {cores} physical cores, load average {load[0]:.1f} before, "
            f"{load[1]:.1f} after")
    if result["against"] == "hf":
        print(f"CPU engine vs HF transformers in one process, {result['dtype']} on both sides; {head}")
        print(format_table(HF_COLUMNS, result["rows"]))
        return
    int4 = result["machine_before"].get("int4_activations")
    print(f"ft vs llama.cpp on the same weights ({result['model']}); {head}"
          + (f"; ft's int4 matrices read {int4} activations (FT_HOST_INT8_ACTS)" if int4 else ""))
    for P, bw in result["read_bytes_s"].items():
        print(f"  read bandwidth measured in the run ({P}-token race): "
              + ", ".join(f"{k.removeprefix('t')} thread(s) {v / 1e9:.1f} GB/s" for k, v in bw.items()))
    print(format_table(LLAMA_COLUMNS, result["rows"]))
    if result["ratios"]:
        print("\nft / llama.cpp (bf16 vs bf16: the same weights; GPTQ int4 g128 vs Q4_0: about the same bytes)")
        print(format_table(RATIO_COLUMNS, result["ratios"]))
