"""`ft bench cpu --against hf`: the CPU engine (device cpu, its default kernels) and HF transformers on the same
checkpoint, in one process, interleaved, best of N, in one dtype for both (bf16 by default, or fp32).

Families: Qwen3-MoE and the hybrid Qwen3.5-MoE (Gated DeltaNet layers), random weights of a shape small enough that
HF's 2048-token prefill stays short (or --model). Peak RSS: each side alone in a child (child_rss.py), ft as
`ft generate` with the same flags and dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from freetoken.calibrate.checkpoints import FAMILIES, RandomMoE, checkpoint_family, random_checkpoint
from freetoken.calibrate.cpu_bench import CpuBenchConfig, Log, Progress, machine, no_progress, rates
from freetoken.calibrate.cpu_race import matching_prefix, race
from freetoken.calibrate.sides import DTYPES, FT_MODES, EngineSide, HFSide, load_engine, load_hf, prompt_ids


@dataclass(frozen=True, slots=True)
class HFBenchConfig:
    base: CpuBenchConfig
    families: tuple[str, ...] = FAMILIES
    model: Path | None = None  # a checkpoint instead of the random ones (its family from its config)
    dtype: str = "bf16"  # both sides
    ft_mode: str = "all"  # a FT_MODES key
    shape: str = ""  # --shape overrides of the random models' fields

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.ft_mode not in FT_MODES:
            raise ValueError(f"--ft-mode {self.ft_mode!r} is not one of {', '.join(FT_MODES)}")
        bad = [f for f in self.families if f not in FAMILIES]
        if bad or not self.families:
            raise ValueError(f"--family {','.join(self.families)!r}: expected a comma-separated list of "
                             f"{', '.join(FAMILIES)}")

    def shapes(self) -> list[RandomMoE]:
        return [RandomMoE.hf_default(f).with_overrides(self.shape) for f in self.families]


def run_vs_hf(cfg: HFBenchConfig, log: Log = lambda s: None, progress: Progress = no_progress) -> dict:
    import gc

    from freetoken.calibrate import child_rss
    from freetoken.models.checkpoint import load_checkpoint

    b, mode, torch_dtype = cfg.base, FT_MODES[cfg.ft_mode], DTYPES[cfg.dtype]
    load_before = machine()
    if cfg.model is not None:
        models = [(checkpoint_family(Path(cfg.model)), Path(cfg.model))]
    else:
        models = []
        for shape in cfg.shapes():
            log(f"random {shape.family} {shape.slug} (built once, then cached under {b.work_dir})")
            models.append((shape.family, random_checkpoint(shape, b.work_dir)))
    prompts = {p: prompt_ids(p, b.seed) for p in b.prompt_tokens}
    first = prompts[b.prompt_tokens[0]]
    rows = []
    for family, model in models:
        ft_rss = hf_rss = None
        if b.rss:
            log(f"{family}: peak RSS of each side, alone in a child process")
            ft_rss = child_rss.ft_generate_rss(str(model), mode.flags, first, b.decode_tokens, b.threads[0],
                                               torch_dtype)
            hf_rss = child_rss.hf_rss(str(model), cfg.dtype, first, b.decode_tokens, b.threads[0])
        log(f"{family}: loading the engine ({mode.label}, {cfg.dtype}) and HF transformers ({cfg.dtype})")
        engine = load_engine(load_checkpoint(model), mode, b.threads[0], b.context, torch_dtype)
        hf = load_hf(model, cfg.dtype)
        for P, ids in prompts.items():
            sides = [side for T in b.threads for side in
                     (EngineSide(f"ft t{T}", engine, ids, b.decode_tokens, T),
                      HFSide(f"hf t{T}", hf, ids, b.decode_tokens, T))]
            log(f"{family}: racing on a {P}-token prompt: {b.warmup} warm-up + {b.reps} timed rounds")
            with progress(len(sides) * (b.warmup + b.reps), f"{family} {P}-token prompt") as tick:
                result = race(sides, b.reps, b.warmup, tick=tick)
            for T in b.threads:
                ft, ref = result.tallies[f"ft t{T}"], result.tallies[f"hf t{T}"]
                a, z = rates(ft, P, b.decode_tokens), rates(ref, P, b.decode_tokens)
                same = matching_prefix(ft.tokens, ref.tokens)
                rows.append({
                    "family": family, "model": str(model), "dtype": cfg.dtype, "ft_mode": mode.label, "threads": T,
                    "prompt_tokens": P, "decode_tokens": b.decode_tokens,
                    **{f"ft_{k}": v for k, v in a.items()}, **{f"hf_{k}": v for k, v in z.items()},
                    "prefill_vs_hf": a["prefill_tok_s"] / z["prefill_tok_s"],
                    "decode_vs_hf": a["decode_tok_s"] / z["decode_tok_s"],
                    "ft_peak_rss_bytes": ft_rss, "hf_peak_rss_bytes": hf_rss,
                    "peak_rss_vs_hf": ft_rss / hf_rss if ft_rss and hf_rss else None,
                    "matching_tokens": same, "same_tokens": f"{same}/{len(ref.tokens)}"})
        del engine, hf, result
        gc.collect()
    return {"against": "hf", "reps": b.reps, "warmup": b.warmup, "decode_tokens": b.decode_tokens,
            "dtype": cfg.dtype, "machine_before": load_before, "machine_after": machine(), "rows": rows}

