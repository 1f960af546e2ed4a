"""Decode kernels that fill the GPU: the split-K GEMV (linear_decode) and the expert FFNs' split down GEMM vs their
torch references, on shapes off the block sizes and splits with a remainder; tuned configs read as data."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from freetoken.kernels import expert_ffn, expert_ffn_quant, expert_ffn_quant_ref, expert_ffn_ref, linear
from freetoken.kernels import tuning
from freetoken.kernels.linear_decode import _counters, linear_decode, linear_decode_ref
from freetoken.kernels.packed_random import random_packed
from freetoken.kernels.tuning import override, split_k
from tests.kernels.tolerances import assert_close

GEMV = dict(BLOCK_N=8, BLOCK_K=32, num_warps=4, num_stages=1, ctas_per_sm=1, min_k_per_split=32)
FFN = dict(GATE_UP_BLOCK_N=16, DOWN_BLOCK_N=16, BLOCK_K=16, num_warps=4, num_stages=1, ctas_per_sm=1,
           min_k_per_split=16)
CPU = torch.device("cpu")


def test_split_k_hand_derived():
    # 4 tiles, 132 SMs x 1 program wanted -> 33 splits asked, at most cdiv(100, 32) = 4; 32 deep, the last 4 deep
    assert split_k(4, 100, GEMV, CPU) == (4, 32)
    # asked for 3 splits of K = 100: cdiv(34, 32) * 32 = 64 per split -> 2 splits (64 + 36)
    assert split_k(4, 100, {**GEMV, "split_k": 3}, CPU) == (2, 64)
    # enough tiles already: one split over the whole (rounded) K
    assert split_k(200, 100, GEMV, CPU) == (1, 128)


@pytest.mark.parametrize("dtype,with_bias", [(torch.float32, True), (torch.bfloat16, False)])
@pytest.mark.parametrize("T,D_in,D_out,splits", [(1, 100, 13, 4), (3, 300, 40, 3), (4, 64, 8, 2), (2, 70, 9, 1)])
def test_linear_decode_split_k_matches_reference(dtype, T, D_in, D_out, splits, with_bias, monkeypatch):
    linear_module = sys.modules[linear.__module__]  # the package exports the function under the module's name
    calls = []
    monkeypatch.setattr(linear_module, "linear_decode", lambda *a: calls.append(a) or linear_decode(*a))
    g = torch.Generator().manual_seed(T * D_in + D_out)
    x = torch.randn(T, D_in, generator=g).to(dtype)
    w = (torch.randn(D_out, D_in, generator=g) / D_in**0.5).to(dtype)
    bias = torch.randn(D_out, generator=g).to(dtype) if with_bias else None
    with override("linear_decode", "narrow", {**GEMV, "split_k": splits}):
        got = split_k(-(-D_out // 8), D_in, {**GEMV, "split_k": splits}, CPU)[0]
        assert got == splits  # each case really takes its split count (remainders: 100 = 3 x 32 + 4, 300, 70)
        out = linear(x, w, bias)
    assert len(calls) == 1  # linear took the split-K decode path for <= MAX_ROWS rows
    assert_close(out, linear_decode_ref(x, w, bias))
    assert all(int(c.abs().sum()) == 0 for c in _counters.values())  # every counter reset for the next launch


def test_linear_decode_refuses_many_rows():
    with pytest.raises(ValueError, match="x: 5 rows"):
        linear_decode(torch.randn(5, 8), torch.randn(4, 8))


def _ffn_inputs(T, K, D, I, S, seed, bias):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g)
    slot_ids = torch.randint(0, S, (T, K), generator=g, dtype=torch.int32)
    slot_ids[0, -1] = -1
    weights = torch.rand(T, K, generator=g)
    w_gate_up, w_down = torch.randn(S, 2 * I, D, generator=g) / D**0.5, torch.randn(S, D, I, generator=g) / I**0.5
    extra = {}
    if bias:  # gpt-oss: biases and the clamped activation; the down bias must be added by one split only
        extra = dict(b_gate_up=torch.randn(S, 2 * I, generator=g), b_down=torch.randn(S, D, generator=g),
                     glu="clamped")
    return x, slot_ids, weights, w_gate_up, w_down, extra


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("splits", [1, 3])
def test_expert_ffn_decode_split_down_matches_reference(bias, splits):
    # I = 40: 3 splits of 16 inputs, the last one 8 deep; D = 24: one full and one partial 16-wide tile
    x, slot_ids, weights, w_gu, w_d, extra = _ffn_inputs(2, 3, 24, 40, 5, seed=splits, bias=bias)
    assert split_k(6 * 2, 40, {**FFN, "split_k": splits}, CPU) == (splits, 16 if splits == 3 else 48)
    with override("expert_ffn_decode", "any", {**FFN, "split_k": splits}):
        out = expert_ffn(x, slot_ids, weights, w_gu, w_d, **extra)
    assert_close(out, expert_ffn_ref(x, slot_ids, weights, w_gu, w_d, **extra))


# name: (kind, gate / up layout over D = 32 inputs, down layout over I = 40 inputs), tiles BLOCK_K = 16 wide
QUANT = {
    "int4 g16 / g8 vectorised": ("int4", {"group": 16}, {"group": 8}),
    "int4 per channel: vectorised / gathered": ("int4", {"group": 32}, {"group": 40}),
    "int4 act-order gathered": ("int4", {"group": 8, "act_order": True}, {"group": 8, "act_order": True}),
    "fp8 block 16 vectorised": ("fp8", {"block": (16, 16)}, {"block": (16, 16)}),
    "fp8 block 24 gathered": ("fp8", {"block": (8, 24)}, {"block": (8, 24)}),
    "mxfp4 vectorised": ("fp4", {"group": 8, "scale_code": "e8m0"}, {"group": 8, "scale_code": "e8m0"}),
    "nvfp4 divide vectorised": ("fp4", {"group": 16, "scale_code": "e4m3", "global_op": "divide"},
                                {"group": 8, "scale_code": "e4m3", "global_op": "divide"}),
}


@pytest.mark.parametrize("name", QUANT)
def test_expert_ffn_quant_decode_split_matches_reference(name):
    # I = 40 off the 16-wide tiles: the down GEMM splits 16 + 16 + 8
    kind, layout_gu, layout_down = QUANT[name]
    D, I, S = 32, 40, 4
    g = torch.Generator().manual_seed(len(name))
    gate, up = (random_packed(kind, S, (I, D), g, **layout_gu) for _ in range(2))
    down = random_packed(kind, S, (D, I), g, **layout_down)
    x = torch.randn(2, D, generator=g)
    slot_ids = torch.tensor([[0, 3, -1], [2, 1, 3]], dtype=torch.int32)
    weights = torch.rand(2, 3, generator=g)
    with override("expert_ffn_quant_decode", "any", {**FFN, "split_k": 3}):
        out = expert_ffn_quant(x, slot_ids, weights, gate, up, down)
    ref = expert_ffn_quant_ref(x, slot_ids, weights, gate, up, down)
    assert ref.abs().amax() > 0.1
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * ref.abs().amax().item())


def test_tuned_configs_by_device_with_default(monkeypatch):
    table = {"format_version": 1, "default": {"linear_decode": {"any": {"BLOCK_N": 8}}},
             "devices": {"NVIDIA H200": {"linear_decode": {"narrow": {"BLOCK_N": 4}}}}}
    monkeypatch.setattr(tuning, "load_table", lambda: table)
    monkeypatch.setattr(tuning, "device_name", lambda device: "NVIDIA H200")
    assert tuning.tuned("linear_decode", "narrow", CPU) == {"BLOCK_N": 4}
    assert tuning.tuned("linear_decode", "wide", CPU) == {"BLOCK_N": 8}  # no wide entry for this device
    monkeypatch.setattr(tuning, "device_name", lambda device: "Some Other GPU")
    assert tuning.tuned("linear_decode", "narrow", CPU) == {"BLOCK_N": 8}
    with pytest.raises(ValueError, match="no default expert_ffn_decode"):
        tuning.tuned("expert_ffn_decode", "any", CPU)


def test_shipped_config_file_is_valid_and_bad_files_are_named(tmp_path):
    table = tuning.load_table()
    for kernel in ("linear_decode", "expert_ffn_decode", "expert_ffn_quant_decode"):
        assert kernel in table["default"]
    bad = tmp_path / "configs.json"
    bad.write_text(json.dumps({"format_version": 2, "default": {}}))
    with pytest.raises(ValueError, match="configs.json: format_version"):
        tuning.load_table(bad)


def test_shipped_defaults_fill_132_sms_at_model_shapes():
    # hand-derived from tuned_configs.json's defaults (no launch): programs per batch-1 call on a 132-SM GPU
    default = tuning.load_table()["default"]
    narrow, wide = (default["linear_decode"][c] for c in ("narrow", "wide"))
    # Qwen3-30B-A3B k / v (512 x 2048): 64 tiles of 8 rows; 4 x 132 wanted -> 9 splits, capped at 2048 / 256 = 8
    assert split_k(512 // 8, 2048, narrow, CPU) == (8, 256)  # 512 programs (a tiled matmul: 16)
    # its router (128 x 2048): 16 tiles x 8 splits = 128 programs (a tiled matmul: 4)
    assert split_k(128 // 8, 2048, narrow, CPU) == (8, 256)
    # fused qkv (5120 x 2048): 320 tiles of 16 rows, 2 splits of 1024
    assert split_k(5120 // 16, 2048, wide, CPU) == (2, 1024)
    # Mixtral-8x7B expert down (2 picks x 4096 / 64 tiles = 128, I = 14336): 3 splits of 4800 (the last 4736)
    ffn = default["expert_ffn_decode"]["any"]
    assert split_k(2 * 4096 // ffn["DOWN_BLOCK_N"], 14336, ffn, CPU) == (3, 4800)


@pytest.mark.parametrize("shape_class,T,D_out,splits", [("narrow", 3, 40, 3),
                                                        pytest.param("wide", 1, 2100, 2, marks=pytest.mark.slow)])
def test_shipped_default_linear_decode_configs_under_the_interpreter(shape_class, T, D_out, splits):
    # the interpreter runs its own wide, unsplit config (tuned_configs.json 'interpreter'); the GPU defaults' tiles,
    # K steps and splits are checked here as a GPU launches them. K = 600 on 132 SMs: 5 narrow tiles of 8 rows ->
    # 3 splits of 256 (the last 88 deep); 132 wide tiles of 16 rows -> 2 splits of 512 (the last 88 deep)
    cfg = tuning.load_table()["default"]["linear_decode"][shape_class]
    interpreted = tuning.tuned("linear_decode", shape_class, CPU)
    assert interpreted["BLOCK_N"] > cfg["BLOCK_N"] and interpreted["split_k"] == 1
    rows = 1 << (T - 1).bit_length()  # linear_decode narrows BLOCK_K for more rows
    assert split_k(-(-D_out // cfg["BLOCK_N"]), 600, {**cfg, "BLOCK_K": max(cfg["BLOCK_K"] // rows, 32)}, CPU) == (
        splits, 256 if shape_class == "narrow" else 512)
    g = torch.Generator().manual_seed(T + D_out)
    x = torch.randn(T, 600, generator=g).to(torch.bfloat16)
    w = (torch.randn(D_out, 600, generator=g) / 600**0.5).to(torch.bfloat16)
    with override("linear_decode", shape_class, cfg):
        out = linear_decode(x, w)
    assert_close(out, linear_decode_ref(x, w))
