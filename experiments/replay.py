"""Replay a routing trace through a placement policy, a miss split and a cache size: one row of counts.

    python -m experiments.replay policy=frequency cache.fraction=0.2 trace=synthetic
    python -m experiments.replay -m experiment=miss_rate            # the sweep behind the miss-rate figure
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from freetoken.progress import progress
from freetoken.paths import CONF_DIR
from freetoken.experiments.launchers import launch
from freetoken.experiments.runner import RunOutput, build, guarded, run_once, show_progress

TABLE = "replay"
GROUPS = ("trace", "policy", "split", "cache", "sim")


def validate(cfg: DictConfig) -> None:
    from freetoken.experiments.specs import sim_config

    trace, policy, split, cache, sim = (build(cfg, key) for key in GROUPS)
    sim_config(policy, split, cache, sim)  # the groups together: the one cache config


def compute(cfg: DictConfig) -> RunOutput:
    from freetoken.sim.calls import num_calls
    from freetoken.experiments.specs import sim_config
    from freetoken.sim.run import simulate

    trace_spec, policy, split, cache, sim = (build(cfg, key) for key in GROUPS)
    trace = trace_spec.load()
    profile = policy.profile.load() if policy.profile is not None else None
    config = sim_config(policy, split, cache, sim)
    with progress(num_calls(trace, config.prefill_chunk), f"replay {trace_spec.name} {policy.name}",
                  enabled=show_progress(cfg)) as advance:
        result = simulate(trace, config, profile, on_call=advance)
    metrics = result.to_dict(breakdown=False)
    del metrics["policy"], metrics["split"]  # the config columns say these
    for phase, counts in result.by_phase().items():
        metrics.update({f"{phase}_{k}": v for k, v in counts.to_dict().items()})
    metrics.update(num_tokens=trace.num_tokens, num_layers=trace.num_layers, num_experts=trace.num_experts,
                   top_k=trace.top_k, num_keys=trace.num_keys, num_requests=int(len(set(trace.request.tolist()))))
    return RunOutput(metrics)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
@guarded("experiments.replay")
def main(cfg: DictConfig) -> dict:
    return run_once(cfg, TABLE, GROUPS, compute, validate)


if __name__ == "__main__":
    launch(main, "experiments.replay")
