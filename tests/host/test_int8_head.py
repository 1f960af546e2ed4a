"""The LM head quantized to int8 at load (--lm-head int8): the rounding bound by hand, the host kernels against the
dequantized head times the int8 activations (path Q) and times the activations as they are (path B), and the
engine's logits against the same engine with the checkpoint's head."""

from __future__ import annotations

import pytest
import torch

from freetoken.engine import CacheConfig, Engine
from freetoken.host import kernels as hk
from freetoken.host.kernels import int8_acts_ref
from freetoken.quant.head import head_weights, int8_head
from tests.engine.conftest import build_checkpoint
from tests.host import packed_random as pr
from tests.host.conftest import native_or_skip


def test_each_weight_is_within_half_a_step_of_its_group_scale():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(37, 256, generator=gen).bfloat16()
    w[5] = 0  # an all-zero row: scale 0, dequantizes to 0
    p = int8_head(w)
    assert p.kind == "int8" and p.data.dtype == torch.uint8 and p.group == 128
    assert p.data.min() >= 1 and p.data.max() <= 255 and bool((p.zeros == 128).all())
    step = w.float().view(37, 2, 128).abs().amax(-1) / 127  # [N, G] max |w| / 127, by hand
    assert torch.allclose(p.scales[0], step)
    err = (p.to_float(0) - w.float()).abs().view(37, 2, 128)
    assert bool((err <= step[..., None] / 2 * (1 + 1e-4)).all())  # (fp32 rounding of w / s near 127 s)
    assert bool((p.to_float(0)[5] == 0).all())
    assert (p.to_float(0) - w.float()).abs().max() > 0  # (it does round)


@pytest.mark.parametrize("rows", [1, 3, 6])
def test_host_linear_equals_the_dequantized_head_times_int8_activations(rows):
    native_or_skip()
    gen = torch.Generator().manual_seed(rows)
    p = int8_head(torch.randn(301, 384, generator=gen).bfloat16())  # 301: rows past the last block of four
    x = torch.randn(rows, 384, generator=gen).bfloat16()
    unit = hk.int8_acts_unit(p)
    if unit is None:
        pytest.skip("this CPU (or build) has neither AVX512-VNNI nor AVX2: int8 rows are decoded to fp32 "
                    "(path B, below)")
    assert unit == 128
    ref = int8_acts_ref(x, 128) @ p.to_float(0).T
    for build in (False, hk.AVX2):  # this CPU's path Q, and the portable build's AVX2 one where the CPU has AVX2
        if build and hk.int8_acts_unit(p, build) is None:
            continue
        out = hk.linear(x, p, generic=build).float()
        assert ((out - ref).abs() / ref.abs().clamp_min(ref.abs().max() * 1e-3)).max() < 2 ** -8  # bf16 rounding
    exact = x.float() @ p.to_float(0).T
    generic = hk.linear(x, p, generic=True).float()  # path B: the row decoded, fp32 activations
    assert ((generic - exact).abs() / exact.abs().clamp_min(exact.abs().max() * 1e-3)).max() < 2 ** -8


@pytest.fixture(scope="module")
def wide_qwen3(tmp_path_factory):
    return build_checkpoint("qwen3_moe", tmp_path_factory.mktemp("q3w"), hidden_size=128, vocab_size=200)


@pytest.fixture(scope="module")
def tied_qwen3(tmp_path_factory):
    return build_checkpoint("qwen3_moe", tmp_path_factory.mktemp("q3t"), hidden_size=128, vocab_size=200,
                            tie_word_embeddings=True)


def _logits(path, lm_head, tokens):
    engine = Engine.from_pretrained(path, CacheConfig("lru", fraction=0.5), kernels="host", device="cpu",
                                    record=False, lm_head=lm_head)
    kv = engine.new_kv(64)
    out = [engine.prefill(tokens[:4], kv, all_logits=True)] + [engine.decode(t, kv) for t in tokens[4:]]
    return torch.cat(out).float(), engine


@pytest.mark.parametrize("tied", [False, True])
def test_engine_logits_with_the_int8_head_stay_near_the_checkpoints_head(wide_qwen3, tied_qwen3, tied):
    native_or_skip()
    path = tied_qwen3 if tied else wide_qwen3
    tokens = [3, 17, 5, 9, 1, 22, 40, 8]
    ref, plain = _logits(path, "checkpoint", tokens)
    got, engine = _logits(path, "int8", tokens)
    assert isinstance(plain.decoder.lm_head, torch.Tensor) and engine.decoder.lm_head.kind == "int8"
    assert torch.equal(engine.decoder.embed, plain.decoder.embed)  # a tied head's embedding stays as stored
    if not tied:  # quantized as it loaded: the checkpoint holds no float copy beside it
        assert engine.checkpoint.dense["lm_head.weight"] is engine.decoder.lm_head
    rel = (got - ref).abs().max() / ref.abs().max()
    assert 0 < rel < 0.02  # 8-bit weights and activations: well under 2% of the largest logit, and not exact


def test_int8_head_is_refused_where_it_would_be_dequantized_back(wide_qwen3):
    with pytest.raises(ValueError, match="^lm_head: int8 is read by the host kernels"):
        Engine.from_pretrained(wide_qwen3, kernels="reference", device="cpu", record=False, lm_head="int8")
    with pytest.raises(ValueError, match="^lm_head: 'int4' is not one of checkpoint, int8"):
        head_weights(torch.zeros(4, 128), "int4", True)
    int4 = pr.int4(1, 4, 128, 128, gen=torch.Generator().manual_seed(0)).select(0)  # a GPTQ checkpoint's own head
    with pytest.raises(ValueError, match=r"^lm_head: the checkpoint's LM head is quantized already \(int4\)"):
        head_weights(int4, "int8", True)
    made = int8_head(torch.randn(4, 128))
    assert head_weights(made, "int8", True) is made  # quantized as it loaded
    with pytest.raises(ValueError, match="^lm_head: the head's input dim 64 is not a multiple of 128"):
        int8_head(torch.zeros(4, 64))


@pytest.mark.parametrize("tied", [False, True])
def test_bytes_per_token_count_the_head_the_engine_reads(wide_qwen3, tied_qwen3, tied):
    """V = 200, D = 128, fp32 weights: int8 = V x D values + V x 1 fp32 scales + V x 1 zero bytes; the checkpoint's
    head V x D x 4; a tied head kept as the embedding is read whole (no row apart), a quantized one leaves a row of
    the embedding to read."""
    native_or_skip()
    from freetoken.calibrate.traffic import engine_traffic

    path = tied_qwen3 if tied else wide_qwen3
    for head, head_bytes, row in (("checkpoint", 200 * 128 * 4, 0 if tied else 128 * 4),
                                  ("int8", 200 * 128 + 200 * 4 + 200, 128 * 4)):
        engine = Engine.from_pretrained(path, kernels="host", device="cpu", record=False, lm_head=head)
        t = engine_traffic(engine)
        assert (t.lm_head, t.embedding_row) == (head_bytes, row)


def test_serve_config_names_a_bad_lm_head():
    from freetoken.serve.config import ServeConfig

    with pytest.raises(ValueError, match="^--lm-head: 'int4' is not one of checkpoint, int8"):
        ServeConfig(lm_head="int4")
    with pytest.raises(ValueError, match="^--lm-head int8 applies to the engine backend"):
        ServeConfig(backend="hf", lm_head="int8")
    assert ServeConfig(lm_head="int8").lm_head == "int8"
