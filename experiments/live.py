"""Run requests through the live engine, then replay the routing it recorded in the simulator: one row with both.

    python -m experiments.live policy=lru cache.fraction=0.25 live.checkpoint=/path/to/hf/moe
    python -m experiments.live -m experiment=sim_vs_live
The row holds the engine's cache counters (live_*), the simulator's counts on the recorded trace under the same
policy, split and capacity (sim_*), and the engine's measured tok/s. Needs freetoken.engine; without it the entry
point says so and exits.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import hydra
from omegaconf import DictConfig

from freetoken.paths import CONF_DIR
from freetoken.experiments.launchers import launch
from freetoken.experiments.results import config_hash
from freetoken.experiments.runner import RunOutput, build, config_columns, guarded, run_once

TABLE = "live"
GROUPS = ("policy", "split", "cache", "sim", "live")
COUNTS = ("calls", "accesses", "hits", "misses", "fetched", "cpu", "evictions", "prefetched", "cpu_tokens")
NO_ENGINE = ("engine not available: this build has no freetoken.engine, so nothing can run live; "
             "simulate instead with python -m experiments.replay")


def engine_available() -> bool:
    return importlib.util.find_spec("freetoken.engine") is not None


def validate(cfg: DictConfig) -> None:
    if not engine_available():
        raise ValueError(NO_ENGINE)
    from freetoken.experiments.specs import sim_config
    from freetoken.placement import POLICIES

    policy, split, cache, sim, _ = (build(cfg, key) for key in GROUPS)
    sim_config(policy, split, cache, sim)  # the groups together: the one cache config
    name = policy.name
    if POLICIES[name].needs_future:
        raise ValueError(f"policy.name: {name} needs the future key stream, which a live run does not have")


def tiny_checkpoint(results_dir: str, seed: int) -> Path:
    """A tiny random Qwen3-MoE checkpoint (2 MoE layers x 8 experts, top-2), made once per seed (parallel
    sweep workers wait on a lock for the first one to write it)."""
    import fcntl
    import shutil
    import tempfile

    root = Path(results_dir) / "checkpoints"
    path = root / f"tiny-qwen3-moe-seed{seed}"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (path / "config.json").is_file():
            return path
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.for_model("qwen3_moe", hidden_size=64, intermediate_size=48, moe_intermediate_size=32,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   vocab_size=128, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                                   initializer_range=0.1, eos_token_id=None, bos_token_id=None, pad_token_id=None)
        torch.manual_seed(seed)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=root))
        AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp)
        shutil.rmtree(path, ignore_errors=True)  # a partial directory from a killed run
        tmp.rename(path)  # whole or absent
    return path


def compute(cfg: DictConfig) -> RunOutput:
    import numpy as np

    from dataclasses import replace

    from freetoken.experiments.specs import sim_config
    from freetoken.engine import CacheConfig, Engine
    from freetoken.trace import save
    from freetoken.trace.stats import expert_counts
    from freetoken.sim.run import simulate

    policy, split, cache, sim, live = (build(cfg, key) for key in GROUPS)
    config = sim_config(policy, split, cache, sim)
    checkpoint = live.checkpoint or tiny_checkpoint(cfg.results.dir, live.seed)
    engine = Engine.from_pretrained(checkpoint, kernels=live.kernels, prefill_chunk=config.prefill_chunk,
                                    cache=CacheConfig(fraction=1.0))  # probe: vocabulary, for frequency a profile
    rng = np.random.default_rng(live.seed)
    prompts = [rng.integers(0, engine.config.vocab_size, live.prompt_tokens).tolist() for _ in range(live.requests)]
    if policy.name == "frequency":  # out-of-sample is impossible before the run: profile = an all-resident pass
        _serve(engine, prompts, live)
        config = replace(config, options={**config.options, "profile": expert_counts(engine.trace())})
    engine = Engine(engine.checkpoint, config, kernels=live.kernels, tokenizer=engine.tokenizer)
    _serve(engine, prompts, live)
    trace = engine.trace("live")
    key = config_hash(TABLE, config_columns(cfg, GROUPS))
    trace_path = save(trace, Path(cfg.results.dir) / "traces" / f"live-{key}.safetensors")
    counters = engine.counters.to_dict()
    replayed = simulate(trace, config).total.to_dict()
    metrics = {f"live_{k}": counters[k] for k in COUNTS if k in counters}
    metrics.update({f"sim_{k}": replayed[k] for k in COUNTS})
    metrics["live_miss_rate"] = counters["misses"] / counters["accesses"] if counters["accesses"] else 0.0
    metrics["sim_miss_rate"] = replayed["miss_rate"]
    metrics["miss_rate"] = metrics["live_miss_rate"]
    metrics["agree"] = all(metrics[f"live_{k}"] == metrics[f"sim_{k}"] for k in COUNTS if f"live_{k}" in metrics)
    metrics.update(decode_tok_s=engine.stats.decode_tok_s, prefill_tok_s=engine.stats.prefill_tok_s,
                   num_tokens=trace.num_tokens, num_keys=trace.num_keys, recorded_trace=str(trace_path),
                   checkpoint=str(checkpoint))
    return RunOutput(metrics)


def _serve(engine, prompts: list[list[int]], live) -> None:
    from freetoken.engine import SamplingParams

    for request, prompt in enumerate(prompts):
        for _ in engine.generate(prompt, SamplingParams(greedy=True), max_tokens=live.decode_tokens,
                                 stop_token_ids=[], request=request):
            pass


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
@guarded("experiments.live")
def main(cfg: DictConfig) -> dict:
    return run_once(cfg, TABLE, GROUPS, compute, validate)


if __name__ == "__main__":
    launch(main, "experiments.live")
