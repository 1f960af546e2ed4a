"""cost.expert_bytes is the PackedWeight layout's size: checked against PackedWeight objects built here from
packed.py's documented shapes (not through freetoken.quant.layout), against layout.packed_template, and by hand."""

import pytest
import torch

from freetoken.quant import (
    FORMAT_SPECS,
    QuantError,
    describe,
    expert_bytes,
    format_spec,
    stored_bytes,
)
from freetoken.quant.layout import packed_template
from freetoken.quant.packed import PackedWeight

S = 3  # slots: nbytes_per_slot must not depend on how many


def documented(name: str, N: int, K: int) -> PackedWeight:
    """packed.py's module docstring, transcribed: one PackedWeight per kind with S slots of an [N, K] matrix."""
    u8 = torch.uint8
    if name.startswith(("gptq", "awq")):
        group = int(name.split("-g")[1].split("-")[0])
        G = K // group
        g_idx = torch.zeros(S, K, dtype=torch.int32) if name.endswith("-act") else None
        return PackedWeight("int4", (N, K), torch.zeros(S, N, K // 2, dtype=u8),
                            torch.zeros(S, N, G, dtype=torch.float16),
                            zeros=torch.zeros(S, N, G, dtype=u8), g_idx=g_idx, group=group)
    if name == "fp8-block":
        return PackedWeight("fp8", (N, K), torch.zeros(S, N, K, dtype=u8),
                            torch.zeros(S, -(-N // 128), -(-K // 128)), block=(128, 128))
    if name == "fp8-channel":
        return PackedWeight("fp8", (N, K), torch.zeros(S, N, K, dtype=u8), torch.zeros(S, N, 1), block=(1, K))
    if name == "mxfp4":
        return PackedWeight("fp4", (N, K), torch.zeros(S, N, K // 2, dtype=u8), torch.zeros(S, N, K // 32, dtype=u8),
                            group=32, scale_code="e8m0")
    assert name == "nvfp4"
    return PackedWeight("fp4", (N, K), torch.zeros(S, N, K // 2, dtype=u8), torch.zeros(S, N, K // 16, dtype=u8),
                        global_scale=torch.ones(S), group=16, scale_code="e4m3", global_op="divide")


@pytest.mark.parametrize("name", list(FORMAT_SPECS))
@pytest.mark.parametrize("N,K", [(768, 2048), (2048, 768), (192, 320)])
def test_expert_bytes_equal_the_documented_packed_weight(name, N, K):
    fmt = format_spec(name)
    if fmt.group_size > 0 and K % fmt.group_size:
        with pytest.raises(QuantError, match="does not divide"):
            expert_bytes(fmt, N, K)
        return
    want = documented(name, N, K)
    assert expert_bytes(fmt, N, K) == want.nbytes_per_slot
    got = packed_template(fmt, N, K, num_slots=S, device="cpu")
    assert {k: (tuple(t.shape), t.dtype) for k, t in got.tensors().items()} == \
        {k: (tuple(t.shape), t.dtype) for k, t in want.tensors().items()}
    assert (got.kind, got.group, got.block, got.scale_code) == (want.kind, want.group, want.block, want.scale_code)


def test_qwen3_30b_expert_gptq_g128_by_hand():
    # Qwen3-30B-A3B expert, D = 2048, I = 768. gate/up [768, 2048]: 4-bit data 768 x 2048 / 2 = 786,432 B;
    # 16 groups of 128 inputs: fp16 scales 768 x 16 x 2 = 24,576 B, uint8 zeros 768 x 16 = 12,288 B -> 823,296 B.
    # down [2048, 768]: 786,432 + 2048 x 6 x 2 + 2048 x 6 = 823,296 B. Expert: 3 x 823,296 = 2,469,888 B
    # (bf16: 9,437,184 B, 3.82x more). The checkpoint's int32 zeros [G, N/8] hold half: 6,144 B per matrix.
    fmt = format_spec("gptq-g128")
    assert 2 * expert_bytes(fmt, 768, 2048) + expert_bytes(fmt, 2048, 768) == 2_469_888
    assert 2 * stored_bytes(fmt, 768, 2048) + stored_bytes(fmt, 2048, 768) == 3 * (786_432 + 24_576 + 6_144)
    # act-order adds int32 g_idx over the inputs: 4 x 2048 for gate/up, 4 x 768 for down
    act = format_spec("gptq-g128-act")
    assert 2 * expert_bytes(act, 768, 2048) + expert_bytes(act, 2048, 768) == 2_469_888 + 8 * 2048 + 4 * 768
    # ... unless one group spans the inputs: every id is 0, the repacker drops it (repack._int4), and so do we
    assert expert_bytes(act, 64, 128) == expert_bytes(fmt, 64, 128) == 64 * 64 + 64 * 3
    assert stored_bytes(act, 64, 128) == stored_bytes(fmt, 64, 128) + 4 * 128  # the checkpoint still stores it
    # nvfp4 down: 786,432 data + 2048 x 48 e4m3 scales + one fp32 global scale
    assert expert_bytes(format_spec("nvfp4"), 2048, 768) == 786_432 + 98_304 + 4


def test_describe_and_unknown_names():
    assert [describe(format_spec(n)) for n in ("gptq-g128", "gptq-g128-act", "awq-g64", "fp8-block", "fp8-channel",
                                               "mxfp4", "nvfp4")] == \
        ["gptq int4 g128", "gptq int4 g128 act-order", "awq int4 g64", "fp8 block 128x128", "fp8 per-channel",
         "mxfp4", "nvfp4"]
    with pytest.raises(QuantError, match=r"unknown expert format 'int3'; valid: gptq-g32, .*nvfp4"):
        format_spec("int3")
