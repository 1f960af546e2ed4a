"""expert_ffn_quant (packed int4 / fp8 / fp4 slots) vs its reference, on the decode (one pair per block) and prefill
(slot-aligned blocks) paths with slot -1 pairs; the reference vs expert_ffn_ref on weights dequantized by hand-written
quantizers; wrong layouts refused with the argument named."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from freetoken.kernels import expert_ffn_quant, expert_ffn_quant_ref, expert_ffn_ref
from freetoken.kernels.packed_random import random_packed
from tests.kernels import quant_by_hand
from tests.kernels.tolerances import assert_close

# name: (kind, D, I, gate/up layout, down layout). fp8 block (24, 40) on D = 72, I = 48: edge blocks and kernel
# tiles (64) are partial in both dims of both matrices.
LAYOUTS = {
    "int4 sym g32": ("int4", 64, 32, {"group": 32, "symmetric": True}, {"group": 32, "symmetric": True}),
    "int4 asym one group": ("int4", 64, 32, {"group": 64}, {"group": 32}),
    "int4 act-order g16": ("int4", 64, 32, {"group": 16, "act_order": True}, {"group": 16, "act_order": True}),
    "fp8 block partial": ("fp8", 72, 48, {"block": (24, 40)}, {"block": (24, 40)}),
    "fp8 per channel": ("fp8", 64, 32, {"block": (1, 64)}, {"block": (1, 32)}),
    "fp4 mxfp4 e8m0 g32": ("fp4", 64, 32, {"group": 32}, {"group": 32}),
    "fp4 nvfp4 divide": ("fp4", 64, 32, *[{"group": 16, "scale_code": "e4m3", "global_op": "divide"}] * 2),
    "fp4 nvfp4 multiply": ("fp4", 64, 32, *[{"group": 16, "scale_code": "e4m3", "global_op": "multiply"}] * 2),
}
S, K = 4, 2
# decode: 3 tokens x 2 picks = 6 pairs, one block each; prefill: 20 x 2 = 40 pairs grouped in 16-row blocks
PATHS = {"decode": 3, "prefill": 20}


def _packed(name, seed):
    kind, D, I, gu, dn = LAYOUTS[name]
    g = torch.Generator().manual_seed(seed)
    return [random_packed(kind, S, shape, g, **lay) for shape, lay in (((I, D), gu), ((I, D), gu), ((D, I), dn))], g


def _inputs(T, D, g, dtype):
    x = torch.randn(T, D, generator=g).to(dtype)
    slot_ids = torch.randint(0, S, (T, K), generator=g, dtype=torch.int32)
    slot_ids[::2, 1] = -1  # every other token's second pick is not resident
    return x, slot_ids, torch.rand(T, K, generator=g)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", LAYOUTS)
def test_kernel_matches_reference_fp32(name, path):
    (gate, up, down), g = _packed(name, seed=len(name))
    x, slot_ids, weights = _inputs(PATHS[path], LAYOUTS[name][1], g, torch.float32)
    out = expert_ffn_quant(x, slot_ids, weights, gate, up, down)
    assert out.shape == x.shape and out.dtype == torch.float32
    ref = expert_ffn_quant_ref(x, slot_ids, weights, gate, up, down)
    assert ref.abs().amax() > 1.0  # the comparison is over real values, not zeros
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * ref.abs().amax().item())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", LAYOUTS)
def test_kernel_bf16_matches_reference(name, path):
    """bf16 x: the kernel rounds the SwiGLU rows and its output to bf16 (on a GPU also each tile before its bf16 dot),
    the reference only its output: expert_ffn's bf16 tolerance, relative to the output's scale."""
    (gate, up, down), g = _packed(name, seed=len(name) + 1)
    x, slot_ids, weights = _inputs(PATHS[path], LAYOUTS[name][1], g, torch.bfloat16)
    out = expert_ffn_quant(x, slot_ids, weights, gate, up, down)
    assert out.dtype == torch.bfloat16
    ref = expert_ffn_quant_ref(x, slot_ids, weights, gate, up, down)
    scale = ref.float().abs().amax()
    assert_close(out / scale, ref / scale)


def test_large_row_blocks_and_all_misses():
    """40 tokens take the 64-row blocks; a token whose picks are all -1 gets zeros."""
    (gate, up, down), g = _packed("fp4 mxfp4 e8m0 g32", seed=9)
    x, slot_ids, weights = _inputs(40, 64, g, torch.float32)
    slot_ids[5] = -1
    out = expert_ffn_quant(x, slot_ids, weights, gate, up, down)
    ref = expert_ffn_quant_ref(x, slot_ids, weights, gate, up, down)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * ref.abs().amax().item())
    assert torch.equal(out[5], torch.zeros(64))


def _by_hand(kind, layout, w, gen):
    if kind == "int4":
        return quant_by_hand.int4(w, layout["group"], layout.get("symmetric", False), layout.get("act_order", False),
                                  gen)
    if kind == "fp8":
        return quant_by_hand.fp8(w, layout["block"])
    return quant_by_hand.fp4(w, layout["group"], layout.get("scale_code", "e8m0"), layout.get("global_op"))


@pytest.mark.parametrize("name", LAYOUTS)
def test_reference_matches_expert_ffn_ref_on_hand_dequantized_weights(name):
    """Quantize random fp32 experts by hand; the reference on the packed slots == expert_ffn_ref on the hand-dequantized
    matrices."""
    kind, D, I, gu, dn = LAYOUTS[name]
    g = torch.Generator().manual_seed(11)
    w_gate, w_up = torch.randn(S, I, D, generator=g) / D**0.5, torch.randn(S, I, D, generator=g) / D**0.5
    w_down = torch.randn(S, D, I, generator=g) / I**0.5
    (gate, deq_gate), (up, deq_up) = _by_hand(kind, gu, w_gate, g), _by_hand(kind, gu, w_up, g)
    down, deq_down = _by_hand(kind, dn, w_down, g)
    assert (deq_gate - w_gate).abs().amax() < 0.25 * w_gate.abs().amax()  # a real quantization, not garbage
    x, slot_ids, weights = _inputs(12, D, g, torch.float32)
    ref = expert_ffn_quant_ref(x, slot_ids, weights, gate, up, down)
    expected = expert_ffn_ref(x, slot_ids, weights, torch.cat([deq_gate, deq_up], 1), deq_down)
    torch.testing.assert_close(ref, expected, rtol=1e-5, atol=1e-6)


def _changed_after_construction(w, **tensors):
    """A PackedWeight whose tensors were swapped after __post_init__ validated them (e.g. a slot pool rebuilt)."""
    w = dataclasses.replace(w)
    for name, t in tensors.items():
        setattr(w, name, t)
    return w


def _valid(seed=0):
    (gate, up, down), g = _packed("int4 sym g32", seed)
    return (*_inputs(2, 64, g, torch.float32), gate, up, down)


def _swap(args, index, value):
    return args[:index] + (value,) + args[index + 1:]


X, GATE, UP, DOWN = 0, 3, 4, 5  # positions in (x, slot_ids, weights, gate, up, down)
WRONG = {  # what is changed in a valid int4 call -> (error, message)
    "up kind": (lambda a: _swap(a, UP, random_packed("fp8", S, (32, 64), torch.Generator(), block=(1, 64))),
                ValueError, r"up: kind 'fp8', gate is 'int4'"),
    "down slots": (lambda a: _swap(a, DOWN, a[DOWN].select(0)), ValueError, r"down: 1 slots \[S, \.\.\.\], gate has 4"),
    "x hidden dim": (lambda a: _swap(a, X, torch.randn(2, 32)), ValueError,
                     r"gate: shape \(32, 64\) is \(I, D\) with D = 64, x has D = 32"),
    "down transposed": (lambda a: _swap(a, DOWN, a[GATE]), ValueError, r"down: shape \(32, 64\), expected \(64, 32\)"),
    "up group": (lambda a: _swap(a, UP, random_packed("int4", S, (32, 64), torch.Generator(), group=16)),
                 ValueError, r"up: layout .*'group': 16.* differs from gate's"),
    "gate scales": (lambda a: _swap(a, GATE, _changed_after_construction(a[GATE], scales=a[GATE].scales[:, :, :1])),
                    ValueError, r"gate.scales: shape \(4, 32, 1\), expected \(4, 32, 2\)"),
    "gate not packed": (lambda a: _swap(a, GATE, torch.zeros(4, 32, 64)), TypeError,
                        r"gate: expected a PackedWeight, got Tensor"),
    "down device": (lambda a: _swap(a, DOWN, a[DOWN].to("meta")), ValueError,
                    r"tensors on different devices: .*'down.data': device\(type='meta'\)"),
}


@pytest.mark.parametrize("wrong", WRONG)
def test_wrong_layout_is_refused_naming_the_argument(wrong):
    change, error, match = WRONG[wrong]
    args = change(_valid())
    with pytest.raises(error, match=match):
        expert_ffn_quant(*args)


def test_non_contiguous_and_out_of_range_g_idx_are_refused():
    x, slot_ids, weights, gate, up, down = _valid()
    strided = dataclasses.replace(gate, scales=gate.scales.transpose(1, 2).contiguous().transpose(1, 2))
    with pytest.raises(ValueError, match=r"gate.scales: must be contiguous"):
        expert_ffn_quant(x, slot_ids, weights, strided, up, down)
    (gate, up, down), g = _packed("int4 act-order g16", seed=3)
    gate.g_idx[0, 0] = 4  # K = 64 / 16 = 4 groups: ids 0..3
    with pytest.raises(ValueError, match=r"gate.g_idx: values must lie in \[0, 4\)"):
        expert_ffn_quant(*_inputs(1, 64, g, torch.float32), gate, up, down)


@pytest.mark.parametrize("name, field, code", [("fp8 per channel", "data", 0x7F), ("fp4 mxfp4 e8m0 g32", "scales", 0xFF)])
def test_nan_codes_decode_to_nan_like_the_reference(name, field, code):
    """e4m3 0x7f / e8m0 0xff are NaN: the pair whose slot holds one is NaN in both, the other token is finite."""
    (gate, up, down), g = _packed(name, seed=5)
    getattr(gate, field)[1, 0, 0] = code
    x, weights = torch.randn(2, 64, generator=g), torch.rand(2, 1, generator=g)
    slot_ids = torch.tensor([[1], [2]], dtype=torch.int32)
    out = expert_ffn_quant(x, slot_ids, weights, gate, up, down)
    ref = expert_ffn_quant_ref(x, slot_ids, weights, gate, up, down)
    assert out[0].isnan().all() and ref[0].isnan().all()
    torch.testing.assert_close(out[1], ref[1], rtol=1e-5, atol=1e-5 * ref[1].abs().amax().item())
