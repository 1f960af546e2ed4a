"""What a published Qwen3.5-122B-A10B decode measurement says about the routing locality the anchors assume.

The anchors' FreeToken decode cells hinge on the model's decode locality (sim/band.py), which no card gives. One
public run bounds it: a llama.cpp fork with a hot-expert cache (PUBLISHED), same model, all experts on the CPU
except 44 slots per MoE layer re-pinned every 60 tokens from the last 60 tokens' counts. The experts that miss are
computed on the CPU, whose time is bandwidth-bound and proportional to the experts it reads, so with g the step's
time outside the CPU experts (dense layers on the GPU, round trips) and h the decode hit rate:
    T_hot = g + (1 - h) (T_cpu - g) + re-pin copies + hit GEMMs  =>  h >= 1 - T_hot / T_cpu  (g, copies, GEMMs >= 0)
The same cache (ktransformers_dynamic: per-layer pins re-derived every `window` passes from the counts since the
last re-pin) replayed on the synthetic routing of each locality gives the hit rate that locality implies; a
locality whose hit rate falls below the published floor is ruled out for this model.
"""

from __future__ import annotations

import numpy as np

# r/LocalLLaMA, "Hot Experts in your VRAM! Dynamic expert cache in llama.cpp ... Qwen3.5-122B-A10B" (April 2026;
# code: github.com/ParmesanParty/llama.cpp): RTX 4090 + Ryzen 9 7950X, bartowski Q4_K_L, token generation over
# ~300 tokens, three runs each. Baseline: every expert on the CPU (-ot exps=CPU); hot cache: LLAMA_ARG_MOE_HOT_K=44,
# LLAMA_ARG_MOE_HOT_REBALANCE_INTERVAL=60.
PUBLISHED = dict(all_cpu_tok_s=(15.60, 15.67, 15.69), hot_tok_s=(22.26, 22.97, 22.77), slots_per_layer=44,
                 rebalance_tokens=60)
DECODE_STEPS, SKIP_STEPS = 1536, 256  # replayed decode steps; the first ones fill the cache and are not counted


def hit_floor(published: dict = PUBLISHED) -> float:
    """The lowest decode hit rate the published speed-up allows: 1 - T_hot / T_cpu (mean of the runs)."""
    t_cpu = 1 / np.mean(published["all_cpu_tok_s"])
    t_hot = 1 / np.mean(published["hot_tok_s"])
    return float(1 - t_hot / t_cpu)


def hot_cache_hit_rate(card, routing: dict, published: dict = PUBLISHED) -> float:
    """Decode hit rate of the published hot-expert cache replayed on a synthetic trace of `routing`."""
    from freetoken.placement import Split
    from freetoken.sim.predict import synthetic_trace
    from freetoken.sim.run import SimConfig, simulate

    trace = synthetic_trace(card, 0, DECODE_STEPS, **routing)
    config = SimConfig("ktransformers_dynamic", Split("offload", admit_prefill=False),
                       capacity=published["slots_per_layer"] * card.moe_layers,
                       options={"window": published["rebalance_tokens"]})
    log = simulate(trace, config).log
    keep = np.arange(len(log)) >= SKIP_STEPS * card.moe_layers
    hits = int(log.hits[keep].sum())
    return hits / (hits + int(log.fetched[keep].sum()) + int(log.cpu[keep].sum()))


def evidence(card) -> dict[str, float]:
    """{locality name: hot-cache decode hit rate} for every routing of sim.band.ROUTINGS."""
    from freetoken.sim.band import ROUTINGS

    return {name: hot_cache_hit_rate(card, routing) for name, routing in ROUTINGS.items()}


def render_section(evidence: dict[str, float]) -> list[str]:
    """docs/anchors.md's section on the evidence (sim.anchors.render)."""
    floor = hit_floor()
    out = ["## Which localities a published Qwen3.5 decode run allows", "",
           "sim/locality_evidence.py: a published Qwen3.5-122B-A10B decode run (llama.cpp fork, RTX 4090 + Ryzen 9 "
           "7950X) went from", f"{np.mean(PUBLISHED['all_cpu_tok_s']):.2f} tok/s with every expert on the CPU to "
           f"{np.mean(PUBLISHED['hot_tok_s']):.2f} with a hot-expert cache of {PUBLISHED['slots_per_layer']} slots "
           f"per layer re-pinned every {PUBLISHED['rebalance_tokens']} tokens.",
           "CPU expert time is proportional to the experts it reads, so that cache's decode hit rate is at least "
           f"1 - T_hot / T_cpu = {floor:.2f}.", "The same cache replayed on each locality's synthetic routing:", "",
           "| locality | hot-cache decode hit rate | allowed by the published run |", "|---|---:|---|"]
    for name, rate in evidence.items():
        out.append(f"| {name} | {rate:.3f} | {'yes' if rate >= floor else 'no'} |")
    return out + [""]

