"""Bit decoders vs torch's own fp8 / e8m0 casts and transformers' e2m1 table, over every code."""

import torch
from transformers.integrations.mxfp4 import FP4_VALUES

from freetoken.quant.bits import decode_e2m1_packed, decode_e4m3, decode_e8m0

ALL_BYTES = torch.arange(256, dtype=torch.int32).to(torch.uint8)


def test_e4m3_matches_torch_cast_on_all_256_codes():
    ours = decode_e4m3(ALL_BYTES)
    ref = ALL_BYTES.view(torch.float8_e4m3fn).to(torch.float32)
    assert torch.equal(ours.isnan(), ref.isnan()) and ours.isnan().sum() == 2  # 0x7f, 0xff
    finite = ~ref.isnan()
    assert torch.equal(ours[finite], ref[finite])
    assert torch.equal(torch.signbit(ours[finite]), torch.signbit(ref[finite]))  # -0.0 at 0x80


def test_e8m0_matches_torch_cast_on_all_256_codes():
    ours = decode_e8m0(ALL_BYTES)
    ref = ALL_BYTES.view(torch.float8_e8m0fnu).to(torch.float32)
    finite = ~ref.isnan()
    assert torch.equal(ours.isnan(), ref.isnan())
    assert torch.equal(ours[finite], ref[finite])


def test_e2m1_packed_low_nibble_first_matches_transformers_table():
    ours = decode_e2m1_packed(ALL_BYTES.view(16, 16))  # [16, 32]
    lut = torch.tensor(FP4_VALUES)
    codes = ALL_BYTES.to(torch.int64)
    ref = torch.stack([lut[codes & 0xF], lut[codes >> 4]], -1).reshape(16, 32)
    assert torch.equal(ours, ref)
