"""ft serve with --kv-dtype fp8: the memory plan counts 1 byte per KV value + a 4-byte scale per (token, kv head),
and the prefix cache keeps fp8 pieces (codes and scales) that a later turn resumes from exactly."""

from __future__ import annotations

from conftest import openai_client, reference_engine, running
from test_prefix_reuse import ask, cold


def test_fp8_kv_plan_by_hand():
    """Demo model: 2 layers x 2 kv heads x 16 dims, fp32. KV per token: auto 2 x 4 x 16 x 4 = 512 bytes, fp8
    2 x 4 x (16 + 4) = 160. Budget int(0.0009 GiB) = 966,367, reserve a tenth = 96,636, dense 300,544: 569,187 left.
    auto: floor 512 x 512 = 262,144 leaves 307,043 = 12 experts of 24,576; fp8: floor 512 x 160 = 81,920 leaves
    487,267 >= all 16 experts (393,216), and the 94,051 after them = 587 more KV tokens."""
    from freetoken.serve.config import ServeConfig
    from freetoken.serve.startup import load

    plans = {}
    for kv_dtype in ("auto", "fp8"):
        backend, plans[kv_dtype] = load(ServeConfig(device_budget_gb=0.0009, kv_floor=512, kv_dtype=kv_dtype),
                                        log=lambda s: None)
        assert backend.engine.kv_dtype == kv_dtype
    assert plans["auto"].budget_bytes - plans["auto"].reserve_bytes - plans["auto"].dense_bytes == 569_187
    assert backend.model_memory().kv_bytes_per_token == 160
    assert (plans["auto"].expert_slots, plans["auto"].kv_tokens) == (12, 512 + (307_043 - 12 * 24_576) // 512)
    assert (plans["fp8"].expert_slots, plans["fp8"].kv_tokens) == (16, 512 + 587)


def test_fp8_prefix_reuse_resumes_exactly(tiny_model_dir):
    """Turn 2 reuses turn 1's fp8 KV from the prefix cache and answers as a cold fp8 engine on the whole prompt."""
    cold_engine = reference_engine(tiny_model_dir, kv_dtype="fp8")
    with running(tiny_model_dir, kv_dtype="fp8") as served:
        client = openai_client(served.url)
        first = [{"role": "user", "content": "tell me about cats, briefly"}]
        text1 = ask(client, served.model_id, first).choices[0].message.content
        assert text1 == cold(cold_engine, first, 6)[1]
        second = first + [{"role": "assistant", "content": text1}, {"role": "user", "content": "and dogs?"}]
        r2 = ask(client, served.model_id, second)
        assert r2.usage.prompt_tokens_details.cached_tokens > 0
        assert r2.choices[0].message.content == cold(cold_engine, second, 6)[1]
