"""Model cards, hardware profiles and the memory planner: shipped files load, bad files fail naming field and file."""

from pathlib import Path

import numpy as np
import pytest
import yaml

from freetoken.placement import Split, make_call
from freetoken.placement.policies.static_layers import StaticLayers
from freetoken.sim.hardware import HARDWARE_DIR, hardware_names, load_hardware
from freetoken.sim.model_card import MODEL_DIR, load_model_card, model_names
from freetoken.sim.planner import plan_for
from freetoken.sim.replay import replay

REQUIRED_MODELS = {"qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b", "deepseek-v3", "gpt-oss-120b",
                   "qwen3-next-80b-a3b", "qwen3.5-122b-a10b", "deepseek-v4-flash", "glm-5.2"}
REQUIRED_HARDWARE = {"rtx5090-ryzen", "rtx5090-paper", "rtx4060-laptop", "rtxpro6000-ultra7", "xeon-2xp5000", "h200"}


def test_every_shipped_card_loads_and_matches_its_published_totals():
    assert REQUIRED_MODELS <= set(model_names())
    for name in model_names():
        card = load_model_card(name)
        assert card.source
        # the loader already checks totals; recompute one by hand as an independent reference
        routed = card.moe_layers * card.num_experts * 3 * card.hidden_size * card.expert_intermediate_size / 1e9
        assert abs(card.dense_params + card.embedding_params + routed - card.total_params) <= 0.05 * card.total_params


def test_known_expert_sizes_by_hand():
    # Qwen3-30B-A3B: 3 x 2048 x 768 = 4,718,592 params at bf16 = 9,437,184 bytes; 48 x 128 experts
    c = load_model_card("qwen3-30b-a3b")
    assert c.expert_bytes() == 9_437_184 and c.num_keys == 6144
    # Mixtral: 3 x 4096 x 14336 = 176,160,768 params -> 352,321,536 bytes
    assert load_model_card("mixtral-8x7b").expert_bytes() == 352_321_536
    # gpt-oss-120b: 3 x 2880 x 2880 = 24,883,200 params at 4.25 bits = 13,219,200 bytes, plus its biases
    # (2 x 2880 + 2880 = 8,640 bf16 values = 17,280 bytes): 13,236,480
    assert load_model_card("gpt-oss-120b").expert_bytes() == 13_236_480


def test_estimated_cards_say_what_is_estimated():
    for name in ("qwen3.5-122b-a10b", "deepseek-v4-flash", "glm-5.2"):
        card = load_model_card(name)
        assert {"num_layers", "hidden_size", "expert_intermediate_size", "dense_params"} <= set(card.estimated)
        assert (card.num_experts, card.top_k) == (256, 8)


def test_every_hardware_number_has_a_source():
    assert REQUIRED_HARDWARE <= set(hardware_names())
    for name in hardware_names():
        hw = load_hardware(name)
        assert "pcie_gb_s" in hw.sources and "host_gb_s" in hw.sources
    ryzen = load_hardware("rtx5090-ryzen")
    assert (ryzen.pcie_gb_s, ryzen.host_gb_s, ryzen.dram_gb_s) == (56.0, 63.6, 102.4)  # the anchors' numbers


def _write(tmp_path: Path, folder: Path, name: str, edit) -> Path:
    data = yaml.safe_load((folder / f"{name}.yaml").read_text())
    edit(data)
    path = tmp_path / f"bad-{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d.pop("hidden_size"), "missing field 'hidden_size'"),
    (lambda d: d.update(top_k=300), "field 'top_k' (300) exceeds field 'num_experts' (256)"),
    (lambda d: d.update(num_experts=-4), "field 'num_experts' must be > 0"),
    (lambda d: d.update(hidden_sise=3), "unknown field(s) hidden_sise"),
    (lambda d: d.update(expert_bits="four"), "field 'expert_bits' must be a number"),
    (lambda d: d.update(total_params=500.0), "field 'total_params' (500.0 B) disagrees"),
])
def test_bad_model_card_names_field_and_file(tmp_path, edit, needle):
    path = _write(tmp_path, MODEL_DIR, "qwen3.5-122b-a10b", edit)
    with pytest.raises(ValueError) as e:
        load_model_card(str(path))
    assert needle in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d.update(pcie_gb_s=-56.0), "field 'pcie_gb_s' must be > 0, got -56.0"),
    (lambda d: d.pop("hbm_gb_s"), "missing field 'hbm_gb_s'"),
    (lambda d: d["sources"].pop("host_gb_s"), "field 'sources' gives no source for host_gb_s"),
])
def test_bad_hardware_profile_names_field_and_file(tmp_path, edit, needle):
    path = _write(tmp_path, HARDWARE_DIR, "rtx5090-ryzen", edit)
    with pytest.raises(ValueError) as e:
        load_hardware(str(path))
    assert needle in str(e.value) and str(path) in str(e.value)


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(ValueError, match="unknown model 'qwen9'; valid: .*qwen3-30b-a3b"):
        load_model_card("qwen9")
    with pytest.raises(ValueError, match="unknown hardware 'rtx9090'; valid: .*h200"):
        load_hardware("rtx9090")


def test_planner_capacity_by_hand():
    # Qwen3.5-122B on the ryzen 5090: 31.84 GiB - 1.5 GiB reserved - dense (5.28 + 0.763) B x 2 bytes
    # - 32768 x 24576 B of KV floor - the floor sequence's DeltaNet states (36 layers x (8192 x 3 x 2 B conv +
    # 32 x 128 x 128 x 4 B recurrent) = 77,266,944 B), divided by 9,437,184 x 4.25 / 8 = 5,013,504 B per expert
    card, hw = load_model_card("qwen3.5-122b-a10b"), load_hardware("rtx5090-ryzen")
    free = 31.84 * 2**30 - 1.5 * 2**30 - (5.28e9 + 0.763e9) * 2 - 32768 * 24576 - 36 * (8192 * 3 * 2 + 32 * 128 * 128 * 4)
    plan = plan_for(card, hw)
    assert plan.expert_slots == int(free // 5_013_504)
    assert plan_for(card, hw, min_context=262144).expert_slots < plan.expert_slots  # the floor comes first
    with pytest.raises(ValueError, match="KV floor"):
        plan_for(load_model_card("glm-5.2"), load_hardware("rtx4060-laptop"))


def test_capacity_above_the_models_experts_is_refused():
    from freetoken.sim.predict import predict, synthetic_trace

    card = load_model_card("qwen3-30b-a3b")
    trace = synthetic_trace(card, 32, 4)
    with pytest.raises(ValueError, match=r"capacity 7000 must lie in \[0, 6144\]"):
        predict(card, load_hardware("h200"), "freetoken-offload", trace, capacity=7000)


def test_split_fetch_min_pairs_is_backwards_compatible_and_fetches_big_batches():
    assert Split("cpu").fetch_min_pairs == 0
    # -cmoe on a 2-layer, 4-expert model: both layers on the CPU. 32 tokens x top-2 = 64 pairs -> copied to the GPU
    split = Split("cpu", fetch_min_pairs=32 * 2)
    policy = StaticLayers(0, 2, 4, n_cpu_layers=2)
    rng = np.random.default_rng(0)
    big = make_call(0, rng.permuted(np.tile([0, 1, 2, 3], (32, 1)), axis=1)[:, :2], phase=0)
    small = make_call(1, np.array([[0, 1]] * 31), phase=0)  # 62 pairs: stays on the CPU
    decode = make_call(0, np.array([[2, 3]]), phase=1)
    log = replay([big, small, decode], policy, split).log
    assert log.fetched.tolist() == [len(big.experts), 0, 0]
    assert log.cpu.tolist() == [0, 2, 2]
    with pytest.raises(ValueError, match="fetch_min_pairs must be >= 0"):
        Split("cpu", fetch_min_pairs=-1)


def test_cpu_threads_and_amx_settings_by_hand():
    from freetoken.sim.engines import get_engine, with_settings

    hw = load_hardware("rtx5090-ryzen")  # 16 cores, 5 TFLOP/s CPU lane, no AMX
    kt = get_engine("ktransformers")
    assert with_settings(kt, cpu_threads=8).hardware_for(hw).cpu_tflops == pytest.approx(2.5)
    assert with_settings(kt, cpu_threads=32).hardware_for(hw).cpu_tflops == pytest.approx(5.0)  # no more cores
    with pytest.raises(ValueError, match="no AMX"):
        with_settings(kt, amx=True).hardware_for(hw)
    with pytest.raises(ValueError, match="cpu_cores is not given"):
        with_settings(kt, cpu_threads=8).hardware_for(load_hardware("xeon-2xp5000"))
    # a GGUF type sets llama.cpp's expert and dense formats and its GEMM path
    bf16 = with_settings(get_engine("llamacpp-cmoe"), gguf_type="bf16", prefill_chunk=2048)
    assert (bf16.expert_quant, bf16.compute_dtype, bf16.prefill_chunk) == ("bf16", "bf16", 2048)
    with pytest.raises(ValueError, match="unknown GGUF type"):
        with_settings(get_engine("llamacpp-cmoe"), gguf_type="q9_z")


def test_double_buffer_is_an_engine_setting_with_two_layers_of_staging():
    from freetoken.sim.engines import get_engine, with_settings
    from freetoken.sim.predict import prepare

    # off by default: the engine's planner reserves one layer of staging, and its executor needs two to stream
    assert not get_engine("freetoken-offload").double_buffer and not get_engine("freetoken-hybrid").double_buffer
    card, hw = load_model_card("qwen3-30b-a3b"), load_hardware("rtx5090-ryzen")
    on = with_settings(get_engine("freetoken-offload"), double_buffer=True)
    assert on.settings()["double_buffer"] is True and on.cost_options("shared").double_buffer
    slots = plan_for(card, hw).expert_slots  # the same slots; one more layer (128 experts) of them is staging
    assert prepare(card, hw, "freetoken-offload").config.capacity == slots - 128
    assert prepare(card, hw, on).config.capacity == slots - 2 * 128
    with pytest.raises(ValueError, match="256 expert slots"):  # the fit check asks for both staging layers
        prepare(card, load_hardware("rtx4060-laptop"), on)
    with pytest.raises(ValueError, match="double_buffer: freetoken streams .* offload split"):
        with_settings(get_engine("freetoken-hybrid"), double_buffer=True)


def test_prefill_split_fetches_every_prefill_miss_and_leaves_decode_alone():
    # one MoE layer of 4 experts, top-2, no cache (capacity 0): two requests, each a 4-token prompt (one prefill call
    # using experts 0-3, two tokens each) and one decode token (experts 0, 1). Hybrid split, paper rule, BP 1, BH 2:
    # q* = round(m / 2). Prefill as decode: m = 4 -> 2 fetched (most tokens, ties to the lowest id: 0, 1; 4 pairs),
    # 2 on the CPU (4 pairs). prefill_split offload: 4 fetched (8 pairs), none on the CPU. Decode either way: m = 2,
    # 1 fetched, 1 on the CPU. Calls P D P D: the compiled replay runs each phase's run with its split
    from freetoken.sim.run import SimConfig, simulate
    from freetoken.trace import RoutingTrace

    rows = [[0, 1], [2, 3], [0, 2], [1, 3], [0, 1]] * 2
    trace = RoutingTrace(np.array(rows, np.int16).reshape(10, 1, 2), 4, request=np.repeat([0, 1], 5).astype(np.int32),
                         phase=np.array([0, 0, 0, 0, 1] * 2, np.int8))
    hybrid = Split("hybrid", "paper", 1.0, 2.0, admit_prefill=False)
    offload = Split("offload", admit_prefill=False)
    for keep_plans in (False, True):  # compiled stream replay; call by call through policy.plan
        same_run = simulate(trace, SimConfig("lru", hybrid, capacity=0, prefill_chunk=4), keep_plans=keep_plans)
        split_run = simulate(trace, SimConfig("lru", hybrid, capacity=0, prefill_chunk=4, prefill_split=offload),
                             keep_plans=keep_plans)
        same, split = same_run.log, split_run.log
        # the run's totals add up over its phase runs; its label names prefill's own split
        assert (split_run.total.fetched, split_run.total.cpu, split_run.total.cpu_tokens) == (10, 2, 2)
        assert (same_run.split, split_run.split) == ("hybrid-paper", "hybrid-paper (prefill offload)")
        assert same.phase.tolist() == [0, 1, 0, 1]
        assert (same.fetched.tolist(), same.cpu.tolist()) == ([2, 1, 2, 1], [2, 1, 2, 1])
        assert (same.fetch_tokens.tolist(), same.cpu_tokens.tolist()) == ([4, 1, 4, 1], [4, 1, 4, 1])
        assert (split.fetched.tolist(), split.cpu.tolist()) == ([4, 1, 4, 1], [0, 1, 0, 1])
        assert (split.fetch_tokens.tolist(), split.cpu_tokens.tolist()) == ([8, 1, 8, 1], [0, 1, 0, 1])


def test_prefill_split_is_an_engine_setting():
    from freetoken.sim.engines import FREETOKEN_012_HYBRID_PREFILL, get_engine, with_settings
    from freetoken.sim.predict import prepare

    card, hw = load_model_card("qwen3-30b-a3b"), load_hardware("rtx5090-ryzen")
    own = get_engine("freetoken-hybrid")
    assert own.prefill_split == "same" and prepare(card, hw, own).config.prefill_split is None  # its CPU lane stays
    ft012 = with_settings(own, **FREETOKEN_012_HYBRID_PREFILL)
    setup = prepare(card, hw, ft012)
    assert setup.config.prefill_split == Split("offload", admit_prefill=False)
    assert setup.config.split.mode == "hybrid" and ft012.settings()["prefill_split"] == "offload"
    assert setup.config.capacity == prepare(card, hw, with_settings(get_engine("freetoken-offload"),
                                                                    double_buffer=True)).config.capacity
    with pytest.raises(ValueError, match="engine prefill_split 'cpu' is not one of same, offload"):
        with_settings(own, prefill_split="cpu")
    with pytest.raises(ValueError, match="double_buffer: .*this engine's prefill: split hybrid"):
        with_settings(own, double_buffer=True)


def test_double_buffer_pass_builds_the_policy_as_the_replay_does():
    # frequency reads a profile: the double buffer's second pass over the calls once built its policy without one
    # (and refused). Its pins never move in an offload prefill, so each streamed call of layer l >= 1 copies the
    # E - (pins of layer l) experts not pinned there, the pins by the brute-force rule of test_policy_reference
    from freetoken.sim.engines import get_engine, with_settings
    from freetoken.sim.predict import engine_replay
    from freetoken.sim.run import SimConfig, call_stream
    from tests.test_policy_reference import expert_counts, random_trace, ref_frequency

    trace = random_trace(3, T=24, L=3, E=6, K=2)  # two requests, each a prefill run (one chunk) then decode
    config = SimConfig("frequency", Split("offload", admit_prefill=False), capacity=7, prefill_chunk=8)
    streamed = engine_replay(with_settings(get_engine("freetoken-offload"), double_buffer=True), trace, config).streamed
    pins = ref_frequency(expert_counts(trace), 7, "per_layer")
    pinned_in = np.bincount(np.array(pins) // 6, minlength=3)  # [L]
    stream = call_stream(trace, config)[0]
    expected = np.where((stream.phase == 0) & (stream.layer >= 1), 6 - pinned_in[stream.layer], -1)
    assert (expected >= 0).any()
    np.testing.assert_array_equal(streamed, expected)
