"""`ft bench cpu --against llama.cpp`: ft and llama.cpp on the same weights, prompt ids and threads, in one process,
interleaved, best of N.

The weights: a random Qwen3-MoE (or --model), as llama.cpp's converter writes it in bf16 and as its quantizer makes
Q8_0 / Q4_0 / Q4_K_M of that; for ft the same bf16 checkpoint, and a GPTQ int4 g128 checkpoint made from it by
round-to-nearest (freetoken/calibrate/gptq.py): the int4 rows are the same weights at about the same bytes, not
bit-identical quantizations. Greedy tokens are compared only where the weights are the same (bf16).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from freetoken.calibrate.checkpoints import RandomMoE, cached, random_checkpoint
from freetoken.calibrate.cpu_bench import CpuBenchConfig, Log, Progress, machine, no_progress, rates
from freetoken.calibrate.cpu_race import matching_prefix, race
from freetoken.calibrate.sides import FT_MODES, EngineSide, load_engine, prompt_ids

GPTQ = "GPTQ int4 g128"
GPTQ_HEAD = "GPTQ int4 g128 + lm_head"  # the LM head quantized too: about the bytes of llama.cpp's Q4_0 file


@dataclass(frozen=True, slots=True)
class Row:
    engine: str  # "llama.cpp" | "ft"
    weights: str  # bf16, Q8_0, Q4_0, Q4_K_M | bf16, GPTQ int4 g128 (+ lm_head)
    mode: str | None = None  # ft: a FT_MODES key


ROWS = {
    "llama-bf16": Row("llama.cpp", "bf16"), "llama-q8_0": Row("llama.cpp", "Q8_0"),
    "llama-q4_0": Row("llama.cpp", "Q4_0"), "llama-q4_k_m": Row("llama.cpp", "Q4_K_M"),
    "ft-bf16-cpu-moe": Row("ft", "bf16", "cpu-moe"), "ft-bf16-all": Row("ft", "bf16", "all"),
    "ft-gptq-cpu-moe": Row("ft", GPTQ, "cpu-moe"), "ft-gptq-all": Row("ft", GPTQ, "all"),
    "ft-gptq-cpu-moe-head8": Row("ft", GPTQ, "cpu-moe-int8-head"),
    "ft-gptq-head-cpu-moe": Row("ft", GPTQ_HEAD, "cpu-moe"), "ft-gptq-head-all": Row("ft", GPTQ_HEAD, "all"),
}
# (ft row, llama.cpp row): same weights (bf16), or int4 at about the same bytes (GPTQ g128 vs Q4_0)
RATIOS = (("ft-bf16-cpu-moe", "llama-bf16"), ("ft-bf16-all", "llama-bf16"), ("ft-gptq-cpu-moe", "llama-q4_0"),
          ("ft-gptq-cpu-moe-head8", "llama-q4_0"),
          ("ft-gptq-all", "llama-q4_0"), ("ft-gptq-head-cpu-moe", "llama-q4_0"), ("ft-gptq-head-all", "llama-q4_0"))


def parse_rows(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    bad = [n for n in names if n not in ROWS]
    if bad or not names:
        raise ValueError(f"--rows {text!r}: expected a comma-separated list of {', '.join(ROWS)}")
    return names


@dataclass(frozen=True, slots=True)
class LlamaBenchConfig:
    base: CpuBenchConfig
    rows: tuple[str, ...] = tuple(ROWS)
    model: Path | None = None  # a bf16 Qwen3-MoE checkpoint; None: a random one of `shape`
    shape: RandomMoE = field(default_factory=RandomMoE)
    llama_cpp_src: str | None = None


def _artifact_dir(cfg: LlamaBenchConfig, model: Path) -> Path:
    """Where the GPTQ and GGUF files made from `model` go: beside a built model, else named by its path and the
    mtime of its config (a changed checkpoint gets new files)."""
    if cfg.model is None:
        return model.parent
    stamp = f"{model.resolve()}:{(model / 'config.json').stat().st_mtime_ns}"
    return cfg.base.work_dir / f"model-{hashlib.sha256(stamp.encode()).hexdigest()[:12]}"


def prepare(cfg: LlamaBenchConfig, log: Log) -> dict[str, Path]:
    """The files every asked-for row needs, built (or found in the cache): row weights -> path."""
    from freetoken.calibrate import llamacpp
    from freetoken.calibrate.checkpoints import checkpoint_family
    from freetoken.calibrate.gptq import write_gptq

    work = cfg.base.work_dir
    if cfg.model is None:
        log(f"random Qwen3-MoE {cfg.shape.slug} (built once, then cached under {work})")
        model = random_checkpoint(cfg.shape, work)
    else:
        model = Path(cfg.model)
        if checkpoint_family(model) != "qwen3_moe":
            raise ValueError(f"--model {model}: --against llama.cpp runs Qwen3-MoE checkpoints")
        raw = json.loads((model / "config.json").read_text())
        if "quantization_config" in raw or (raw.get("dtype") or raw.get("torch_dtype")) != "bfloat16":
            raise ValueError(f"--model {model}: --against llama.cpp starts from bf16 weights (the bf16 rows compare "
                             f"them as they are, the other rows are made from them)")
    folder = _artifact_dir(cfg, model)
    rows = [ROWS[r] for r in cfg.rows]
    paths = {"model": model}
    if any(r.engine == "ft" and r.weights == GPTQ for r in rows):
        log("GPTQ int4 g128 checkpoint of the same weights (round to nearest)")
        paths[GPTQ] = cached(folder / "gptq-int4-g128", lambda tmp: write_gptq(model, tmp, log=log))
    if any(r.engine == "ft" and r.weights == GPTQ_HEAD for r in rows):
        log("GPTQ int4 g128 checkpoint with the LM head quantized too")
        paths[GPTQ_HEAD] = cached(folder / "gptq-int4-g128-lm-head",
                                  lambda tmp: write_gptq(model, tmp, log=log, lm_head=True))
    kinds = list(dict.fromkeys(r.weights for r in rows if r.engine == "llama.cpp"))
    if kinds:
        bf16 = folder / "gguf" / "model-bf16.gguf"
        if not bf16.exists():
            src = llamacpp.converter_source(cfg.llama_cpp_src, work, log)
            log(f"GGUF bf16 with llama.cpp's converter ({src / llamacpp.CONVERTER})")
            bf16.parent.mkdir(parents=True, exist_ok=True)
            llamacpp.convert(src, model, bf16)
        paths["gguf bf16"] = bf16
        for kind in (k for k in kinds if k != "bf16"):
            out = folder / "gguf" / f"model-{kind.lower()}.gguf"
            if not out.exists():
                log(f"GGUF {kind} with llama_model_quantize")
                llamacpp.quantize(bf16, out, kind, max(cfg.base.threads))
            paths[f"gguf {kind}"] = out
    return paths


def _ensure_gguf_reader(cfg: LlamaBenchConfig, log: Log) -> None:
    """The `gguf` package reads tensor sizes: PyPI's, else the converter tree's gguf-py."""
    import sys

    try:
        import gguf  # noqa: F401
    except ImportError:
        from freetoken.calibrate import llamacpp

        sys.path.insert(0, str(llamacpp.converter_source(cfg.llama_cpp_src, cfg.base.work_dir, log) / "gguf-py"))


def run_vs_llamacpp(cfg: LlamaBenchConfig, log: Log = lambda s: None, progress: Progress = no_progress) -> dict:
    from freetoken.calibrate import child_rss, traffic
    from freetoken.calibrate.llamacpp import LlamaCppSide, require_llama_cpp
    from freetoken.models.checkpoint import load_checkpoint, read_config

    require_llama_cpp()
    b = cfg.base
    load_before = machine()
    paths = prepare(cfg, log)
    _ensure_gguf_reader(cfg, log)
    mcfg = read_config(paths["model"])[1]
    prompts = {p: prompt_ids(p, b.seed) for p in b.prompt_tokens}
    first = prompts[b.prompt_tokens[0]]

    def weights_path(row: Row) -> Path:
        if row.engine == "llama.cpp":
            return paths[f"gguf {row.weights}"]
        return paths[row.weights] if row.weights in (GPTQ, GPTQ_HEAD) else paths["model"]

    peak: dict[str, int | None] = {name: None for name in cfg.rows}
    fixed: dict[str, int] = {}  # ft mode -> the same run's peak on the tiny demo model: the process's own cost
    if b.rss:
        for name in cfg.rows:
            row, path = ROWS[name], weights_path(ROWS[name])
            log(f"peak RSS of {name}: a child process loads it and generates {b.decode_tokens} tokens")
            if row.engine == "llama.cpp":
                peak[name] = child_rss.llamacpp_rss(str(path), first, b.decode_tokens, b.threads[0])
                continue
            flags = FT_MODES[row.mode].flags
            peak[name] = child_rss.ft_generate_rss(str(path), flags, first, b.decode_tokens, b.threads[0])
            if row.mode not in fixed:  # (its placement alone: the demo model's head is too narrow for int8)
                placed = FT_MODES[row.mode].placement_flags
                log(f"peak RSS of ft generate {' '.join(placed)} on the tiny demo model (the process's fixed cost)")
                fixed[row.mode] = child_rss.ft_process_rss(placed, first, b.decode_tokens, b.threads[0])
    log("loading every side into this process")
    ckpts, loaded, moved = {}, {}, {}
    for name in cfg.rows:
        row, path = ROWS[name], weights_path(ROWS[name])
        if row.engine == "llama.cpp":
            loaded[name] = LlamaCppSide.load(name, path, first, b.decode_tokens, b.threads[0], context=b.context)
            moved[name] = traffic.gguf_traffic(path, mcfg.top_k, mcfg.num_experts, mcfg.vocab_size)
        else:
            if row.weights not in ckpts:  # one load per checkpoint, shared by its engines (--cpu-moe, --fraction 1)
                ckpts[row.weights] = load_checkpoint(path)
            engine = load_engine(ckpts[row.weights], FT_MODES[row.mode], b.threads[0], b.context)
            loaded[name] = EngineSide(name, engine, first, b.decode_tokens, b.threads[0])
            moved[name] = traffic.engine_traffic(engine)
    probe = traffic.ReadProbe(b.read_buffer_bytes, b.read_seconds)
    rows, ratios, read = [], [], {}
    for P, ids in prompts.items():
        sides = []
        for name in cfg.rows:
            for T in b.threads:
                side = loaded[name]
                sides.append(side.with_threads(f"{name} t{T}", T, ids) if isinstance(side, LlamaCppSide) else
                             EngineSide(f"{name} t{T}", side.engine, ids, b.decode_tokens, T))
        probes = {f"t{T}": (lambda T=T: probe(T)) for T in b.read_threads}
        log(f"racing {len(sides)} sides on a {P}-token prompt: {b.warmup} warm-up + {b.reps} timed rounds")
        with progress(len(sides) * (b.warmup + b.reps), f"{P}-token prompt") as tick:
            result = race(sides, b.reps, b.warmup, probes, tick)
        bw = {T: result.best_probe(f"t{T}") * 1e9 for T in b.read_threads}
        read[P] = {f"t{T}": v for T, v in bw.items()}
        for name in cfg.rows:
            row = ROWS[name]
            for T in b.threads:
                t = result.tallies[f"{name} t{T}"]
                r = {"row": name, "engine": row.engine, "weights": row.weights,
                     "mode": FT_MODES[row.mode].label if row.mode else None, "threads": T, "prompt_tokens": P,
                     "decode_tokens": b.decode_tokens, **rates(t, P, b.decode_tokens),
                     "bytes_per_token": moved[name].total, "bytes": moved[name].to_dict(),
                     "read_bytes_s": bw[T], "read_bytes_s_1thread": bw[1],
                     **_rss_fields(peak[name], fixed.get(row.mode), child_rss.checkpoint_bytes(
                         str(weights_path(row))))}
                r["read_pct"] = r["bytes_per_token"] * r["decode_tok_s"] / bw[T]
                ref = result.tallies.get(f"llama-bf16 t{T}")
                if row.weights == "bf16" and ref is not None and name != "llama-bf16":
                    r["matching_tokens"] = matching_prefix(t.tokens, ref.tokens)
                    r["tokens_vs_llama_bf16"] = f"{r['matching_tokens']}/{len(ref.tokens)}"
                rows.append(r)
        by = {(r["row"], r["threads"]): r for r in rows if r["prompt_tokens"] == P}
        for ft, llama in RATIOS:
            for T in b.threads:
                if (ft, T) in by and (llama, T) in by:
                    a, z = by[(ft, T)], by[(llama, T)]
                    ratios.append({"threads": T, "prompt_tokens": P, "ft": _label(ft), "against": _label(llama),
                                   "decode_ratio": a["decode_tok_s"] / z["decode_tok_s"],
                                   "prefill_ratio": a["prefill_tok_s"] / z["prefill_tok_s"]})
    return {"against": "llama.cpp", "model": str(paths["model"]), "files": {k: str(v) for k, v in paths.items()},
            "reps": b.reps, "warmup": b.warmup, "decode_tokens": b.decode_tokens,
            "read_bytes_s": read, "machine_before": load_before,
            "machine_after": machine(), "rows": rows, "ratios": ratios}


def _rss_fields(peak: int | None, fixed: int | None, checkpoint: int) -> dict:
    """Peak RSS against the checkpoint's bytes, whole process and net of the process's fixed cost (ft only: the
    same run on the demo model; a small checkpoint is dwarfed by the interpreter and torch, a real one is not)."""
    out = {"peak_rss_bytes": peak, "checkpoint_bytes": checkpoint, "fixed_rss_bytes": fixed,
           "rss_vs_checkpoint": peak / checkpoint if peak else None, "net_rss_vs_checkpoint": None}
    if peak and fixed:
        out["net_rss_vs_checkpoint"] = (peak - fixed) / checkpoint
    return out


def _label(name: str) -> str:
    row = ROWS[name]
    return " ".join(x for x in (row.engine, row.weights, FT_MODES[row.mode].label if row.mode else "") if x)
