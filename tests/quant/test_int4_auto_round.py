"""GPTQ and AWQ int4 packed by auto-round's own exporters (PyPI auto-round 0.16.1, CPU torch code): its
`auto_round:auto_gptq` QuantLinear (zeros stored minus one), `auto_round:gptqmodel` QuantLinear (zeros as is) and
its AWQ `WQLinear_GEMM.from_linear`, read back with ours. The weight is put on the quantization grid first, so a
correct reader returns it exactly."""

import pytest
import torch

from freetoken.quant import (
    dequantize,
    parse_quant_config,
    stored_bytes,
)

P = "model.layers.4.mlp.experts.1.up_proj"


def _on_grid(out_dim, in_dim, group_size, sym, seed):
    torch.manual_seed(seed)
    gs = in_dim if group_size == -1 else group_size
    groups = in_dim // gs
    q = torch.randint(0, 16, (out_dim, in_dim))
    # zeros 1..15: auto-round clamps a stored zero-1 of -1 to 0 where AutoGPTQ wraps it to 15 (docs/quant.md)
    zeros = torch.full((out_dim, groups), 8) if sym else torch.randint(1, 16, (out_dim, groups))
    scales = (torch.rand(out_dim, groups) * 0.05 + 0.001).half()  # [out, G]
    w = (q - zeros.repeat_interleave(gs, 1)).float() * scales.float().repeat_interleave(gs, 1)  # [out, in]
    linear = torch.nn.Linear(in_dim, out_dim, bias=False)
    linear.weight.data = w
    return linear, w, scales, zeros


@pytest.mark.parametrize("packing", ["auto_round:auto_gptq", "auto_round:gptqmodel"])
@pytest.mark.parametrize("group_size,sym", [(32, True), (64, False), (128, False), (-1, True)])
def test_auto_round_gptq_packing(packing, group_size, sym):
    if packing.endswith("auto_gptq"):
        from auto_round_extension.torch.qlinear_torch_zp import QuantLinear
    else:
        from auto_round_extension.torch.qlinear_torch import QuantLinear
    out_dim, in_dim = 64, 256
    linear, w, scales, zeros = _on_grid(out_dim, in_dim, group_size, sym, seed=group_size + sym)
    layer = QuantLinear(4, group_size, in_dim, out_dim, False)
    layer.device = torch.device("cpu")  # its gptqmodel pack reads self.device
    layer.pack(linear, scales.float(), zeros)
    tensors = {f"{P}.qweight": layer.qweight, f"{P}.qzeros": layer.qzeros, f"{P}.scales": layer.scales}
    fmt = parse_quant_config({"quantization_config": {"quant_method": "auto-round", "bits": 4, "sym": sym,
                                                      "group_size": group_size, "packing_format": packing}})
    assert torch.equal(dequantize(fmt, tensors, P), w)
    assert stored_bytes(fmt, out_dim, in_dim) == sum(t.numel() * t.element_size() for t in tensors.values())
    # the other zero convention is off by one step on every weight
    other = parse_quant_config({"quant_method": "gptq", "group_size": group_size,
                                "checkpoint_format": "gptq_v2" if packing.endswith("auto_gptq") else "gptq"})
    step = scales.float().repeat_interleave(in_dim if group_size == -1 else group_size, 1)
    assert torch.allclose((dequantize(other, tensors, P) - w).abs(), step)


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_auto_round_awq_packing(group_size):
    from auto_round.export.export_to_awq.utils import WQLinear_GEMM

    out_dim, in_dim = 64, 256
    linear, w, scales, zeros = _on_grid(out_dim, in_dim, group_size, False, seed=group_size)
    layer = WQLinear_GEMM.from_linear(linear, 4, group_size, scales=scales.t().contiguous(),
                                      zeros=zeros.t().contiguous())
    tensors = {f"{P}.qweight": layer.qweight, f"{P}.qzeros": layer.qzeros, f"{P}.scales": layer.scales}
    assert tensors[f"{P}.qweight"].shape == (in_dim, out_dim // 8)
    fmt = parse_quant_config({"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True})
    assert torch.equal(dequantize(fmt, tensors, P), w)
    assert stored_bytes(fmt, out_dim, in_dim) == sum(t.numel() * t.element_size() for t in tensors.values())
