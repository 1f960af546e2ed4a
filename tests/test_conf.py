"""conf/: every option of every group composes and instantiates; presets sweep only options that exist."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from freetoken.experiments.compose import compose, options
from freetoken.experiments.specs import CacheSpec, EngineSpec, LiveSpec, PolicySpec, PredictSpec, SimSpec, TraceSpec
from freetoken.paths import CONF_DIR, REPO_ROOT
from freetoken.placement import POLICIES, Split

TARGETS = {"policy": PolicySpec, "split": Split, "cache": CacheSpec, "trace": TraceSpec, "engine": EngineSpec}


def test_every_policy_and_engine_of_the_code_has_an_option():
    from freetoken.sim.engines import ENGINES

    assert set(options("policy")) == set(POLICIES)
    assert set(options("engine")) == set(ENGINES)


def test_plain_blocks_instantiate(base_config):
    for key, cls in (("sim", SimSpec), ("predict", PredictSpec), ("live", LiveSpec)):
        assert isinstance(instantiate(base_config[key], _convert_="all"), cls)


@pytest.mark.parametrize("group", sorted(TARGETS))
def test_every_option_instantiates(group):
    for name in options(group):
        cfg = compose([f"{group}={name}"])
        obj = instantiate(cfg[group], _convert_="all")
        assert isinstance(obj, TARGETS[group]), (group, name)
        if group == "policy":
            assert obj.name == name
        if group in ("split",):
            assert obj.mode == name
        if group == "engine":
            assert obj.name == name


@pytest.mark.parametrize("group", [pytest.param("model", marks=pytest.mark.slow), "hardware"])
def test_every_card_and_profile_composes_and_loads(group):
    from freetoken.experiments.predict import card_and_profile

    names = options(group)
    assert names, f"conf/{group}/ has no options"
    for name in names:
        card, hw = card_and_profile(compose([f"{group}={name}"]))  # the cost model's own checks
        assert (card.name if group == "model" else hw.name) == name


def test_shared_trace_paths_follow_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FT_SHARED_TRACES", str(tmp_path))
    cfg = compose(["trace=granite"])
    assert cfg.trace.path == str(tmp_path / "granite-3.0-1b-a400m" / "moe_expert_trace.json")
    monkeypatch.delenv("FT_SHARED_TRACES")
    default = compose(["trace=granite"]).trace.path  # ../shared/traces beside the checkout
    assert default == str((REPO_ROOT.parent / "shared" / "traces").resolve() / "granite-3.0-1b-a400m"
                          / "moe_expert_trace.json")


def test_results_dir_from_environment_and_override(monkeypatch, tmp_path):
    monkeypatch.setenv("FT_RESULTS_DIR", str(tmp_path))
    assert compose().results.dir == str(tmp_path)
    assert compose(["results.dir=/x/y"]).results.dir == "/x/y"
    monkeypatch.delenv("FT_RESULTS_DIR")
    assert compose().results.dir == str(REPO_ROOT / "results")


def test_synthetic_spec_builds_the_trace_it_names():
    spec = instantiate(compose(["trace=synth", "trace.synth.num_tokens=64", "trace.synth.skew=0.5"]).trace,
                       _convert_="all")
    assert spec.name == "synth-16x32-top4-s0.5-r0.3"
    trace = spec.load()
    assert (trace.num_tokens, trace.num_layers, trace.num_experts, trace.top_k) == (64, 16, 32, 4)


def test_first_requests_keeps_whole_requests_in_order(tiny_trace_file):
    from freetoken.experiments.traces import first_requests
    from freetoken.trace import load

    trace = load(tiny_trace_file)
    two = first_requests(trace, 2)
    assert two.num_tokens == 100 and sorted(set(two.request.tolist())) == [0, 1]
    assert (two.experts == trace.experts[:100]).all()


@pytest.mark.parametrize("preset", options("experiment"))
def test_experiment_presets_sweep_existing_options(preset):
    text = (CONF_DIR / "experiment" / f"{preset}.yaml").read_text()
    assert text.startswith("# @package _global_")
    cfg = compose([f"experiment={preset}"], hydra_config=True)
    params = cfg.hydra.sweeper.params
    assert params, f"{preset}: no sweep"
    for key, values in params.items():
        if key in ("policy", "split", "trace", "cache", "model", "hardware", "engine"):
            for value in str(values).split(","):
                assert value in options(key), f"{preset}: {key}={value} is not a conf/{key} option"
        else:
            assert OmegaConf.select(cfg, key) is not None or key.startswith("+"), f"{preset}: no key {key}"


def test_engine_settings_reach_the_cost_models_engine():
    cfg = compose(["engine=llamacpp-cmoe", "engine.gguf_type=bf16", "engine.prefill_chunk=1024",
                   "engine.cuda_graphs=false"])
    engine = instantiate(cfg.engine, _convert_="all").engine()
    assert (engine.expert_quant, engine.dense_quant, engine.compute_dtype) == ("bf16", "bf16", "bf16")
    assert engine.prefill_chunk == 1024 and engine.cuda_graphs is False
    from freetoken.experiments.specs import EngineSpec

    with pytest.raises(ValueError, match="engine: a GGUF type applies to llama.cpp"):
        EngineSpec("freetoken-offload", gguf_type="q8_0")


def test_engine_double_buffer_reaches_the_cost_models_engine():
    from freetoken.experiments.specs import EngineSpec

    cfg = compose(["engine=freetoken-offload", "engine.double_buffer=true"])
    engine = instantiate(cfg.engine, _convert_="all").engine()
    assert engine.double_buffer is True and engine.staging_layers() == 2
    assert instantiate(compose(["engine=freetoken-offload"]).engine, _convert_="all").engine().double_buffer is False
    with pytest.raises(ValueError, match="engine.double_buffer must be true, false or null, got 1"):
        EngineSpec("freetoken-offload", double_buffer=1)
    with pytest.raises(ValueError, match="engine: engine double_buffer: freetoken streams"):
        EngineSpec("freetoken-hybrid", double_buffer=True)


def test_engine_decode_overlap_reaches_the_cost_models_engine():
    from freetoken.experiments.specs import EngineSpec

    cfg = compose(["engine=freetoken-hybrid", "engine.decode_overlap=false"])
    engine = instantiate(cfg.engine, _convert_="all").engine()
    assert engine.decode_overlap is False and engine.cost_options("shared").decode_overlap is False
    assert instantiate(compose(["engine=freetoken-hybrid"]).engine, _convert_="all").engine().decode_overlap is True
    with pytest.raises(ValueError, match="engine.decode_overlap must be true, false or null, got 'no'"):
        EngineSpec("freetoken-offload", decode_overlap="no")


def test_engine_decode_gather_rate_reaches_the_cost_models_engine():
    from freetoken.experiments.specs import EngineSpec

    cfg = compose(["engine=freetoken-offload", "engine.decode_gather_gb_s=31.0"])
    engine = instantiate(cfg.engine, _convert_="all").engine()
    assert engine.decode_gather_gb_s == 31.0 and engine.cost_options("shared").decode_gather_gb_s == 31.0
    assert instantiate(compose(["engine=freetoken-offload"]).engine, _convert_="all").engine().decode_gather_gb_s == 0
    with pytest.raises(ValueError, match="engine.decode_gather_gb_s must be a number >= 0 or null, got -1"):
        EngineSpec("freetoken-offload", decode_gather_gb_s=-1)
    with pytest.raises(ValueError, match="engine.decode_gather_gb_s must be a number >= 0 or null, got 'fast'"):
        EngineSpec("freetoken-offload", decode_gather_gb_s="fast")


def test_engine_prefill_split_reaches_the_cost_models_engine():
    from freetoken.experiments.specs import EngineSpec

    cfg = compose(["engine=freetoken-hybrid", "engine.prefill_split=offload", "engine.double_buffer=true"])
    engine = instantiate(cfg.engine, _convert_="all").engine()
    assert (engine.prefill_split, engine.prefill_mode(), engine.split) == ("offload", "offload", "hybrid")
    assert engine.double_buffer and engine.staging_layers() == 2  # an offload prefill may double buffer
    assert instantiate(compose(["engine=freetoken-hybrid"]).engine, _convert_="all").engine().prefill_split == "same"
    with pytest.raises(ValueError, match="engine: engine prefill_split 'cpu' is not one of same, offload"):
        EngineSpec("freetoken-hybrid", prefill_split="cpu")


def test_engine_prefill_copies_reaches_the_cost_models_engine():
    from freetoken.experiments.specs import EngineSpec

    cfg = compose(["engine=freetoken-offload", "engine.prefill_copies=layer"])
    engine = instantiate(cfg.engine, _convert_="all").engine()
    assert engine.prefill_copies == "layer" and engine.cost_options("shared").prefill_copies == "layer"
    assert instantiate(compose(["engine=freetoken-offload"]).engine, _convert_="all").engine().prefill_copies == \
        "missing"
    with pytest.raises(ValueError, match="engine: engine prefill_copies 'whole' is not one of missing, layer"):
        EngineSpec("freetoken-offload", prefill_copies="whole")
