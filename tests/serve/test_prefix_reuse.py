"""Multi-turn reuse through the server: the second turn prefills only what the first did not compute, and its
output equals a cold run's (the engine on the whole prompt with an empty KV cache).

On the character-level tiny model: its text re-tokenizes to the ids it was generated as, so "only the new tokens"
is exact. (A byte-level BPE model's answer can re-tokenize differently; reuse then stops inside that answer.)"""

from __future__ import annotations

import openai
import pytest

from conftest import TIMEOUT


def naive_lcp(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.fixture(scope="module")
def client(tiny_served):
    return openai.OpenAI(base_url=tiny_served[0] + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


@pytest.fixture(scope="module")
def model_id(tiny_served):
    return tiny_served[1].backend.model_id


def prefix_stats(service) -> dict:
    return dict(service.backend.prefix_cache.stats.to_dict())


def cold(tiny_engine, messages, max_tokens):
    """The engine alone, fresh KV: the prompt rendered by the template, greedy."""
    from freetoken.engine import SamplingParams

    tok = tiny_engine.tokenizer
    ids = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                     add_special_tokens=False)
    out = list(tiny_engine.generate(ids, SamplingParams(greedy=True), max_tokens=max_tokens))
    stops = tiny_engine.default_stop_ids()
    return ids, tok.decode([t for t in out if t not in stops]), out


def ask(client, model_id, messages, max_tokens=6):
    return client.chat.completions.create(model=model_id, messages=messages, max_tokens=max_tokens, temperature=0)


def test_second_turn_prefills_only_the_new_tokens(client, tiny_served, model_id, tiny_engine):
    service = tiny_served[1]
    first = [{"role": "user", "content": "tell me about cats, briefly"}]
    ids1, text1, out1 = cold(tiny_engine, first, 6)
    r1 = ask(client, model_id, first)
    assert r1.choices[0].message.content == text1
    second = first + [{"role": "assistant", "content": text1}, {"role": "user", "content": "and dogs?"}]
    ids2, text2, _ = cold(tiny_engine, second, 6)
    before = prefix_stats(service)
    r2 = ask(client, model_id, second)
    after = prefix_stats(service)
    # turn 1 computed KV for its prompt and all its sampled tokens but the last (sampled, never fed back: the end
    # token, or the 6th); the re-rendered history is token for token what turn 1 saw and produced
    computed_in_turn1 = ids1 + out1[:-1]
    assert naive_lcp(ids2, computed_in_turn1) == len(computed_in_turn1)
    assert after["reused_tokens"] - before["reused_tokens"] == len(computed_in_turn1)
    assert after["computed_tokens"] - before["computed_tokens"] == len(ids2) - len(computed_in_turn1)
    assert r2.usage.prompt_tokens_details.cached_tokens == len(computed_in_turn1)
    assert r2.choices[0].message.content == text2  # same as the cold run


def test_an_edit_mid_context_reuses_the_messages_before_it(client, tiny_served, model_id, tiny_engine):
    service = tiny_served[1]
    convo = [{"role": "system", "content": "you are terse"},
             {"role": "user", "content": "first question about the sea"},
             {"role": "assistant", "content": "an answer"},
             {"role": "user", "content": "a follow-up"}]
    ask(client, model_id, convo, max_tokens=2)
    tok = tiny_engine.tokenizer
    render = lambda msgs, gen: tok.encode(  # noqa: E731
        tok.apply_chat_template(msgs, add_generation_prompt=gen, tokenize=False), add_special_tokens=False)
    full = render(convo, True)
    edited = [convo[0], {"role": "user", "content": "first question about the moon"}] + convo[2:]
    ids, text, _ = cold(tiny_engine, edited, 3)
    before = prefix_stats(service)
    r = ask(client, model_id, edited, max_tokens=3)
    reused = prefix_stats(service)["reused_tokens"] - before["reused_tokens"]
    system_end = len(render(convo[:1], False))  # the anchor before the edited message
    edit_at = naive_lcp(full, ids)  # where the token sequences part: inside the second message
    assert system_end < edit_at < len(render(convo[:2], False))
    assert reused == edit_at  # from the edit on, not from the nearest anchor, and not from zero
    assert r.choices[0].message.content == text
