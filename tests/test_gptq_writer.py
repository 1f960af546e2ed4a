"""The benchmark's GPTQ writer (freetoken/calibrate/gptq.py): what the engine's loader reads back from its files is
the round-to-nearest reference computed here by hand, group by group, in numpy; what it leaves alone is bit-equal."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from freetoken.calibrate.checkpoints import RandomMoE, build_random
from freetoken.calibrate.gptq import pack_gptq, rtn_int4, write_gptq
from freetoken.models.shard import Shard

# the smallest shape whose projections all have in dims that are multiples of 128
SHAPE = RandomMoE(hidden=128, layers=2, experts=4, top_k=2, moe_intermediate=128, heads=4, kv_heads=2, head_dim=32,
                  vocab=512)


def rtn_by_hand(w: np.ndarray, group: int) -> np.ndarray:
    """GPTQ's asymmetric min-max grid, one group at a time: the range widened to hold 0, scale (max - min) / 15,
    zero round(-min / scale), q = clamp(round(w / scale) + zero, 0, 15); w' = (q - zero) * scale as stored (fp16)."""
    out = np.empty_like(w, dtype=np.float32)
    for n in range(w.shape[0]):
        for g0 in range(0, w.shape[1], group):
            x = w[n, g0:g0 + group].astype(np.float32)
            lo, hi = np.float32(min(x.min(), 0.0)), np.float32(max(x.max(), 0.0))
            if lo == hi:
                lo, hi = np.float32(-1.0), np.float32(1.0)
            s = np.float32((hi - lo) / np.float32(15))
            z = np.clip(np.round(-lo / s), 0, 15)
            q = np.clip(np.round(x / s) + z, 0, 15)
            out[n, g0:g0 + group] = (q - z) * np.float32(np.float16(s))
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("gptq")
    src = build_random(SHAPE, root / "bf16")
    return src, write_gptq(src, root / "gptq")


def test_the_loader_reads_back_the_hand_rounded_weights(pair):
    from freetoken.models.checkpoint import load_checkpoint
    from freetoken.quant.packed import PackedWeight

    src, dst = pair
    original = {name: Shard(src / "model.safetensors").read(name) for name in Shard(src / "model.safetensors").keys()}
    ckpt = load_checkpoint(dst)
    assert ckpt.quant is not None and ckpt.quant.kind == "gptq" and ckpt.quant.group_size == 128
    for layer in range(SHAPE.layers):
        gate, up, down = ckpt.experts[layer]
        for e in (0, SHAPE.experts - 1):
            for w, proj in ((gate, "gate_proj"), (up, "up_proj"), (down, "down_proj")):
                ref = rtn_by_hand(original[f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"].float().numpy(), 128)
                np.testing.assert_allclose(w.to_float(e).numpy(), ref, rtol=0, atol=1e-7)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):  # attention is quantized too, as GPTQ checkpoints do
            name = f"model.layers.{layer}.self_attn.{proj}.weight"
            got = ckpt.dense[name]
            got = got.to_float(0) if isinstance(got, PackedWeight) else got.float()
            ref = rtn_by_hand(original[name].float().numpy(), 128)
            # dequantized to bf16 where the loader does not keep it packed
            tol = 0 if isinstance(ckpt.dense[name], PackedWeight) else float(np.abs(ref).max()) * 2 ** -8
            np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=tol + 1e-7)
    for name in ("lm_head.weight", "model.embed_tokens.weight", "model.layers.0.mlp.gate.weight", "model.norm.weight"):
        assert torch.equal(ckpt.dense[name], original[name]), name  # left as they were


def test_the_files_say_what_they_hold(pair):
    src, dst = pair
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert qc == {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": False, "desc_act": False,
                  "checkpoint_format": "gptq_v2", "modules_to_not_convert": ["mlp.gate", "lm_head"]}
    names = set(Shard(dst / "model.safetensors").keys())
    p = "model.layers.1.mlp.experts.3.down_proj"
    assert {f"{p}.qweight", f"{p}.qzeros", f"{p}.scales"} <= names and f"{p}.weight" not in names
    assert "model.layers.1.mlp.gate.weight" in names and "lm_head.weight" in names
    assert (dst / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()


def test_packing_puts_each_nibble_where_gptq_readers_look():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 256, generator=g)
    q, zero, scale = rtn_int4(w, 128)
    packed = pack_gptq(q, zero, scale)
    qw, qz = packed["qweight"].numpy().view(np.uint32), packed["qzeros"].numpy().view(np.uint32)
    assert qw.shape == (32, 16) and qz.shape == (2, 2) and packed["scales"].dtype == torch.float16
    for n, k in ((0, 0), (5, 77), (15, 255)):
        assert (qw[k // 8, n] >> (4 * (k % 8))) & 15 == q[n, k]  # input k of output n: row k / 8, nibble k % 8
    for n, grp in ((3, 0), (12, 1)):
        assert (qz[grp, n // 8] >> (4 * (n % 8))) & 15 == zero[n, grp]  # v2: the zero itself
    assert float(packed["scales"][1, 7]) == float(np.float16(scale[7, 1]))


def test_an_all_zero_group_gets_gptqs_unit_range():
    w = torch.zeros(8, 128)
    w[0, 0] = 1.0
    q, zero, scale = rtn_int4(w, 128)
    # [-1, 1]: no division by zero; zero = round(1 / fp32(2 / 15)) = round(7.4999996) = 7
    assert float(scale[1, 0]) == float(np.float32(2) / np.float32(15)) and int(zero[1, 0]) == 7
    assert float(scale[0, 0]) == pytest.approx(1 / 15) and int(zero[0, 0]) == 0 and int(q[0, 0]) == 15


def test_the_engine_generates_from_the_written_checkpoint(pair):
    from freetoken.engine import CacheConfig, Engine, SamplingParams

    engine = Engine.from_pretrained(pair[1], CacheConfig(fraction=1.0), kernels="auto", device="cpu", record=False)
    tokens = list(engine.generate([5, 6, 7], SamplingParams(greedy=True), max_tokens=3, stop_token_ids=()))
    assert len(tokens) == 3 and all(0 <= t < SHAPE.vocab for t in tokens)
    assert engine.store.packed and "gptq" in engine.store.format


def test_the_lm_head_option_quantizes_it_and_the_engine_keeps_it_packed(pair, tmp_path):
    """lm_head=True: the LM head as int4 too (the same-bytes comparison with llama.cpp's Q4_0); the host engine reads
    it packed, and its logits are those of the hand-rounded head."""
    from freetoken.engine import CacheConfig, Engine
    from freetoken.quant.packed import PackedWeight

    src, _ = pair
    dst = write_gptq(src, tmp_path / "gptq-head", lm_head=True)
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert qc["modules_to_not_convert"] == ["mlp.gate"]
    head = Shard(src / "model.safetensors").read("lm_head.weight")
    engine = Engine.from_pretrained(dst, CacheConfig("lru", fraction=1.0), kernels="host", device="cpu", record=False)
    assert isinstance(engine.decoder.lm_head, PackedWeight)
    np.testing.assert_allclose(engine.decoder.lm_head.to_float(0).numpy(), rtn_by_hand(head.float().numpy(), 128),
                               rtol=0, atol=1e-7)
    kv = engine.new_kv(16)
    x = torch.randn(1, SHAPE.hidden).bfloat16()
    got = engine.kernels.linear(x, engine.decoder.lm_head).float()
    ref = x.float() @ engine.decoder.lm_head.to_float(0).T
    assert ((got - ref).abs().max() / ref.abs().max()).item() < 8e-3  # the logits' bf16 rounding
    assert engine.prefill([1, 2, 3], kv).shape == (1, SHAPE.vocab)
