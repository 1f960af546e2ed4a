"""parse_quant_config on real exporters' quantization_config dicts, and its errors naming the field."""

import pytest

from freetoken.quant import QuantError, expert_bytes, parse_quant_config


@pytest.mark.parametrize("cfg,kind,extra", [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}, "gptq",
     {"zero_offset": 1, "sym": True}),
    ({"quant_method": "auto-round", "bits": 4, "group_size": 128, "sym": True,
      "packing_format": "auto_round:auto_gptq"}, "gptq", {"zero_offset": 1}),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}, "awq",
     {"sym": False}),
    ({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
     "fp8_block", {"block": (128, 128)}),
    ({"quant_method": "fbgemm_fp8"}, "fp8_channel", {}),
    ({"quant_method": "mxfp4", "modules_to_not_convert": ["router"]}, "mxfp4", {"group_size": 32}),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}, "nvfp4", {"global_scale": "multiply"}),
])
def test_known_exporters(cfg, kind, extra):
    fmt = parse_quant_config({"model_type": "qwen3_moe", "quantization_config": cfg})
    assert fmt.kind == kind
    for key, value in extra.items():
        assert getattr(fmt, key) == value


@pytest.mark.parametrize("cfg,message", [
    ({"bits": 4}, "quantization_config.quant_method is missing"),
    ({"quant_method": "hqq"}, "quant_method = 'hqq': valid methods are"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, r"quantization_config.bits = 3"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 48}, r"quantization_config.group_size = 48"),
    ({"quant_method": "gptq", "bits": 4}, r"quantization_config.group_size is missing"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, r"quantization_config.version"),
    ({"quant_method": "fp8", "fmt": "e4m3"}, r"quantization_config.weight_block_size is missing"),
    ({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}, r"quantization_config.fmt"),
    ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, r"quantization_config.quant_algo"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"]}}},
     r"config_groups.g.weights is missing"),
    ({"quant_method": "compressed-tensors", "config_groups": {
        "a": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}},
        "b": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}, r"groups \['a', 'b'\]"),
    ({"quant_method": "compressed-tensors", "config_groups": {
        "g": {"weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}}}, r"config_groups.g.weights.strategy"),
])
def test_bad_configs_name_the_field(cfg, message):
    with pytest.raises(QuantError, match=message):
        parse_quant_config({"quantization_config": cfg})


def test_expert_bytes_by_hand():
    # Qwen3-30B-A3B down_proj [2048, 768]: 1572864 weights
    n = 2048 * 768
    fp8 = parse_quant_config({"quant_method": "fp8", "weight_block_size": [128, 128]})
    assert expert_bytes(fp8, 2048, 768) == n + 16 * 6 * 4
    mx = parse_quant_config({"quant_method": "mxfp4"})
    assert expert_bytes(mx, 2048, 768) == n // 2 + n // 32
    nv = parse_quant_config({"quant_method": "modelopt", "quant_algo": "NVFP4"})
    assert expert_bytes(nv, 2048, 768) == n // 2 + n // 16 + 4
    with pytest.raises(QuantError, match="do not fit the mxfp4 packing"):
        expert_bytes(mx, 2048, 770)


def test_load_quant_format_from_config_json(tmp_path):
    import json

    from freetoken.quant import load_quant_format

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_oss", "quantization_config": {
        "quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}}))
    assert load_quant_format(tmp_path).kind == "mxfp4"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe"}))
    assert load_quant_format(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "gptq", "bits": 8,
                                                                              "group_size": 128}}))
    with pytest.raises(QuantError, match=r"config.json: quantization_config.bits = 8"):
        load_quant_format(tmp_path)
    with pytest.raises(QuantError, match=r"nowhere/config.json: cannot read"):
        load_quant_format(tmp_path / "nowhere")
