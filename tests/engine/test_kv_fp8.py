"""FP8 KV cache end to end: a tiny model's logits with fp8 KV against fp32 and bf16 KV, greedy tokens compared.

Tolerance: max |logit(fp8 KV) - logit(fp32 or bf16 KV)| <= 2^-4 x max |logit|, teacher-forced over the prompt and 24
decode steps. 2^-4 is e4m3's rounding bound (half an ulp of a 3-bit mantissa, relative): every cached K and V value
carries up to that relative error, attention averages it and the residual stream adds exact terms, so the logit
error stays below that fraction of the logit scale (measured: 1.5-3.8 %; bf16 KV: 0.1-0.3 %). The models route to
every expert (top-k = all 4), so no top-k pick flips on a rounding and the comparison is continuous; greedy argmax
must then agree wherever fp32 KV's top-2 gap exceeds twice that position's error.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from freetoken.engine import Engine
from freetoken.models.checkpoint import load_checkpoint

from .conftest import PROMPT

STEPS = 24
TOL = 2.0**-4
CONFIGS = {  # family -> (model type, config): every expert picked, so routing is continuous in its inputs
    "qwen3_moe": ("qwen3_moe", dict(num_experts=4, moe_intermediate_size=32, head_dim=16, norm_topk_prob=True,
                                    initializer_range=0.02)),
    "gpt_oss": ("gpt_oss", dict(num_local_experts=4, head_dim=16, sliding_window=4, initializer_range=0.1)),  # sinks
    "deepseek_v2": ("deepseek_v2", dict(n_routed_experts=4, moe_intermediate_size=32, kv_lora_rank=32,  # MLA
                                        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=24, n_shared_experts=1,
                                        first_k_dense_replace=1, topk_method="greedy", n_group=1, topk_group=1,
                                        initializer_range=0.05)),
    "qwen3_next": ("qwen3_next", dict(num_experts=4, moe_intermediate_size=32, head_dim=16,  # hybrid: HybridKV
                                      shared_expert_intermediate_size=40, linear_num_key_heads=2,
                                      linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
                                      linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"],
                                      initializer_range=0.05)),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from .tiny_hf import random_hf

    out = {}
    for name, (model_type, kw) in CONFIGS.items():
        path = tmp_path_factory.mktemp(name)
        random_hf(model_type, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=128, num_experts_per_tok=4, eos_token_id=None, bos_token_id=None,
                  pad_token_id=None, **kw).save_pretrained(path)
        out[name] = load_checkpoint(path)
    return out


def run(ckpt, kv_dtype: str, tokens: list[int] | None = None, steps: int = STEPS, kernels: str = "host"):
    """Prefill PROMPT, then decode `tokens`' continuation (teacher-forced) or greedy picks: (logits [T, V], tokens)."""
    engine = Engine(ckpt, kernels=kernels, device="cpu", kv_dtype=kv_dtype, record=False)
    kv = engine.new_kv(64)
    out, seq = [engine.prefill(list(PROMPT), kv, all_logits=True)], list(PROMPT)
    for i in range(steps):
        seq.append(int(out[-1][-1].argmax()) if tokens is None else tokens[len(PROMPT) + i])
        out.append(engine.decode(seq[-1], kv))
    return torch.cat(out).float(), seq


@pytest.mark.parametrize("family", CONFIGS)
def test_fp8_kv_logits_within_tolerance_of_fp32_and_bf16_kv(family, checkpoints):
    ckpt = checkpoints[family]
    want, tokens = run(ckpt, "auto")  # fp32 KV (the checkpoint's dtype), greedy
    bf16, _ = run(ckpt, "bf16", tokens)
    fp8, _ = run(ckpt, "fp8", tokens)
    scale = want.abs().max().item()
    err = (fp8 - want).abs().max().item()
    assert err <= TOL * scale, f"{family}: fp8 KV max error {err:.3e} vs logit scale {scale:.3e}"
    assert (fp8 - bf16).abs().max().item() <= TOL * scale
    assert err > (bf16 - want).abs().max().item()  # the cache really held e4m3 values, coarser than bf16
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * (fp8 - want).abs().amax(-1)  # [T]: positions its error cannot flip
    assert clear.sum() >= len(tokens) // 4
    assert torch.equal(fp8.argmax(-1)[clear], want.argmax(-1)[clear])


def test_fp8_kv_greedy_tokens_equal_fp32_kv(checkpoints):
    """Free-running greedy decoding of 24 tokens: fp8 KV picks the same tokens as fp32 KV."""
    ckpt = checkpoints["qwen3_moe"]
    assert run(ckpt, "fp8")[1] == run(ckpt, "auto")[1]


def test_triton_kernels_read_the_engine_fp8_cache_like_the_reference(checkpoints):
    """The engine on the Triton kernels (interpreted) over an fp8 cache = the engine on the torch set over the same
    cache: gpt-oss (sinks; layer 0 slides), prefill and one decode step (fp32 tolerance of test_hf_match:
    1e-4 x max |logit|)."""
    ckpt = checkpoints["gpt_oss"]
    want, tokens = run(ckpt, "fp8", steps=1)
    got, _ = run(ckpt, "fp8", tokens, steps=1, kernels="triton")
    assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()


def test_fp8_cache_pieces_round_trip_byte_for_byte(checkpoints):
    """read() / load(): what a prefix cache keeps; a copy continues exactly as the original."""
    engine = Engine(checkpoints["qwen3_moe"], kernels="host", device="cpu", kv_dtype="fp8", record=False)
    kv = engine.new_kv(32)
    engine.prefill(list(PROMPT), kv)
    copy = engine.new_kv(32)
    for layer in range(len(kv.k)):
        piece = kv.read(layer, 0, len(PROMPT))  # [2, T, Hkv, Dh + 4] uint8
        assert piece.dtype == torch.uint8 and piece.shape[-1] == kv.k[layer].shape[-1] + 4
        copy.load(layer, 0, piece)
        assert torch.equal(copy.k[layer][:len(PROMPT)], kv.k[layer][:len(PROMPT)])
        assert torch.equal(copy.v_scale[layer][:len(PROMPT)], kv.v_scale[layer][:len(PROMPT)])
    copy.commit(0, list(PROMPT))
    assert torch.equal(engine.decode(7, copy), engine.decode(7, kv))


def test_bad_kv_dtype_is_one_line_naming_the_field(checkpoints):
    with pytest.raises(ValueError, match="^kv_dtype: 'fp4' is not one of auto, bf16, fp8$"):
        Engine(checkpoints["qwen3_moe"], kernels="host", device="cpu", kv_dtype="fp4")


def test_batched_decode_over_fp8_caches_equals_solo_decodes(checkpoints):
    """decode_batch: each sequence's attention over its own fp8 cache, as a decode of that sequence alone."""
    engine = Engine(checkpoints["qwen3_moe"], kernels="host", device="cpu", kv_dtype="fp8", record=False)
    prompts = [list(PROMPT), list(PROMPT[3:]) + [9, 9]]
    solo = []
    for prompt in prompts:
        kv = engine.new_kv(32)
        engine.prefill(prompt, kv)
        solo.append(engine.decode(11, kv)[-1])
    kvs = [engine.new_kv(32) for _ in prompts]
    for prompt, kv in zip(prompts, kvs):
        engine.prefill(prompt, kv)
    batched = engine.decode_batch([11, 11], kvs)  # [B, V]
    torch.testing.assert_close(batched, torch.stack(solo), rtol=1e-5, atol=1e-5)
