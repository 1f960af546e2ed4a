"""The transformers backend against the engine backend: two independent implementations of the same model behind
the same server give the same greedy text, and the same prefix reuse, on the demo model."""

from __future__ import annotations

import httpx

from conftest import TIMEOUT, openai_client, running

PROMPTS = ["hello there", "the experts"]


def answers(url: str) -> list[str]:
    c = openai_client(url)
    return [c.chat.completions.create(model="freetoken-demo", messages=[{"role": "user", "content": p}],
                                      max_tokens=8, temperature=0).choices[0].message.content for p in PROMPTS]


def test_hf_backend_matches_the_engine(served, greedy):
    with running(None, backend="hf") as (url, service):
        hf = answers(url)
        hf_reuse = service.backend.prefix_cache.stats.reused_tokens
        assert httpx.get(url + "/health", timeout=TIMEOUT).json()["engine"]["placement"] is None  # no expert cache
    assert hf == [greedy(p, 8).text for p in PROMPTS]  # = ft generate's text
    before = served[1].backend.prefix_cache.stats.reused_tokens
    assert answers(served[0]) == hf
    # both prompts start with the same chat-template tokens: the second reuses them, on either backend
    assert hf_reuse > 0 and served[1].backend.prefix_cache.stats.reused_tokens - before >= hf_reuse
