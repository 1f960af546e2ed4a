"""Predict throughput and latency with the cost model (sim.predict): model card x hardware profile x engine.

    python -m experiments.predict model=qwen3.5-122b-a10b hardware=rtx5090-ryzen engine=freetoken-hybrid
    python -m experiments.predict -m experiment=throughput
A configuration that does not fit (e.g. `resident` on a 32 GB card) is a row with fits=false and the reason.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf

from freetoken.progress import progress
from freetoken.paths import CONF_DIR
from freetoken.experiments.launchers import launch
from freetoken.experiments.runner import RunOutput, build, guarded, run_once, show_progress

TABLE = "predict"
GROUPS = ("model", "hardware", "engine", "predict")
PROSE = ("source", "sources", "estimated", "notes", "gpu", "cpu", "hf_id")  # card text: not a config column


def groups(cfg: DictConfig) -> tuple[str, ...]:
    return GROUPS + (("trace",) if cfg.predict.workload == "trace" else ())


def card_and_profile(cfg: DictConfig):
    """The model card and hardware profile of the config, checked by their own loaders (errors name the field)."""
    from freetoken.sim.config_file import build as build_record
    from freetoken.sim.hardware import HardwareProfile
    from freetoken.sim.model_card import ModelCard

    card = build_record(ModelCard, OmegaConf.to_container(cfg.model, resolve=True), "model")
    hw = build_record(HardwareProfile, OmegaConf.to_container(cfg.hardware, resolve=True), "hardware")
    return card, hw


def validate(cfg: DictConfig) -> None:
    card_and_profile(cfg)
    for key in ("engine", "predict") + (("trace",) if cfg.predict.workload == "trace" else ()):
        build(cfg, key)


def workload(cfg: DictConfig, card, spec):
    from freetoken.sim.predict import check_shape, synthetic_trace
    from freetoken.experiments.workloads import conversation_trace

    if spec.workload == "synthetic":
        return synthetic_trace(card, spec.prompt_tokens, spec.decode_tokens, seed=spec.seed)
    if spec.workload == "conversation":
        return conversation_trace(card, spec)
    trace = build(cfg, "trace").load()
    check_shape(trace, card, f"trace {cfg.trace.name}")
    return trace


def metrics_of(pred) -> dict:
    out = {k: v for k, v in pred.to_dict().items()
           if k not in ("model", "hardware", "engine", "lane_busy_s", "inputs", "band", "variants")}
    out.update({f"{lane}_busy_s": s for lane, s in pred.lane_busy_s.items()})
    for k, v in pred.inputs.items():  # nested inputs (engine settings, host work per token) as flat columns
        if isinstance(v, dict):
            out.update({f"input_{k}_{sub}": str(x) if k == "engine_settings" else x for sub, x in v.items()})
        elif k != "trace":
            out[f"input_{k}"] = v
    return out


def per_turn(card, hw, engine: str, spec, run) -> list[dict]:
    """Each turn's TTFT and latency, as differences of predictions over growing conversation prefixes.

    Exact for causal engines: a replay and its costs up to turn t do not depend on later turns.
    """
    from freetoken.experiments.workloads import conversation_trace

    rows = []
    for c in range(spec.conversations):
        before = (0.0, 0.0)
        for t in range(1, spec.turns + 1):
            pred = run(conversation_trace(card, spec, turns=t, conversations=range(c, c + 1)))
            now = (pred.prefill_s, pred.prefill_s + pred.decode_s)
            rows.append({"conversation": c, "turn": t - 1, "ttft_s": now[0] - before[0],
                         "latency_s": now[1] - before[1],
                         "prefill_tokens": spec.prompt_tokens + (0 if spec.anchors else
                                                                 (t - 1) * (spec.prompt_tokens + spec.decode_tokens)),
                         "decode_tokens": spec.decode_tokens})
            before = now
    return rows


def compute(cfg: DictConfig) -> RunOutput:
    from freetoken.sim.predict import predict

    card, hw = card_and_profile(cfg)
    engine, spec = build(cfg, "engine"), build(cfg, "predict")
    kwargs = dict(host=spec.host, n_cpu_layers=spec.n_cpu_layers)
    if spec.min_context is not None:
        kwargs["min_context"] = spec.min_context
    if spec.per_turn and spec.workload != "conversation":
        raise ValueError("predict.per_turn needs predict.workload=conversation")
    trace = workload(cfg, card, spec)
    try:
        from freetoken.sim.calls import num_calls
        from freetoken.sim.engines import get_engine

        with progress(num_calls(trace, get_engine(engine.name).prefill_chunk), f"predict {card.name} {hw.name} {engine.name}",
                      enabled=show_progress(cfg)) as advance:
            pred = predict(card, hw, engine.engine(), trace, on_call=advance, **kwargs)
    except ValueError as e:  # the configuration does not fit this machine: a row that says why
        return RunOutput({"fits": False, "reason": str(e)})
    tables = {}
    if spec.per_turn:
        tables["turns"] = per_turn(card, hw, engine.name, spec,
                                   lambda tr: predict(card, hw, engine.engine(), tr, **kwargs))
    return RunOutput({"fits": True, "reason": "", **metrics_of(pred)}, tables)


def columns_filter(columns: dict) -> dict:
    return {k: v for k, v in columns.items() if k.split(".")[1] not in PROSE or k.startswith("predict.")}


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
@guarded("experiments.predict")
def main(cfg: DictConfig) -> dict:
    return run_once(cfg, TABLE, groups(cfg), compute, validate, columns_filter)


if __name__ == "__main__":
    launch(main, "experiments.predict")
