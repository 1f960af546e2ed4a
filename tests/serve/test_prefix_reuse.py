"""Multi-turn reuse through the server: the second turn prefills only what the first did not compute, and its
output equals a cold run's (the engine on the whole prompt with an empty KV cache).

On the character-level tiny model: its text re-tokenizes to the ids it was generated as, so "only the new tokens"
is exact. (A byte-level BPE model's answer can re-tokenize differently; reuse then stops inside that answer.)"""

from __future__ import annotations


def naive_lcp(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def prefix_stats(service) -> dict:
    return dict(service.backend.prefix_cache.stats.to_dict())


def render(engine, messages, generation_prompt: bool) -> list[int]:
    """The ids of `messages` as the chat template renders them."""
    tok = engine.tokenizer
    return tok.encode(tok.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False),
                      add_special_tokens=False)


def cold(engine, messages, max_tokens):
    """The engine alone, fresh KV: the prompt rendered by the template, greedy."""
    from freetoken.engine import SamplingParams

    ids = render(engine, messages, True)
    out = list(engine.generate(ids, SamplingParams(greedy=True), max_tokens=max_tokens))
    stops = engine.default_stop_ids()
    return ids, engine.tokenizer.decode([t for t in out if t not in stops]), out


def ask(client, model_id, messages, max_tokens=6):
    return client.chat.completions.create(model=model_id, messages=messages, max_tokens=max_tokens, temperature=0)


def second_turn(client, model_id, service, engine):
    """Two turns through the server, the second appending to the first; the server's answers equal cold runs and
    the second prefills only what the first did not compute. -> (second response, prefix stats before and after
    it, tokens computed in turn 1)."""
    first = [{"role": "user", "content": "tell me about cats, briefly"}]
    ids1, text1, out1 = cold(engine, first, 6)
    assert ask(client, model_id, first).choices[0].message.content == text1
    second = first + [{"role": "assistant", "content": text1}, {"role": "user", "content": "and dogs?"}]
    ids2, text2, _ = cold(engine, second, 6)
    before = prefix_stats(service)
    r2 = ask(client, model_id, second)
    after = prefix_stats(service)
    # turn 1 computed KV for its prompt and all its sampled tokens but the last (sampled, never fed back: the end
    # token, or the 6th); the re-rendered history is token for token what turn 1 saw and produced
    computed_in_turn1 = ids1 + out1[:-1]
    assert naive_lcp(ids2, computed_in_turn1) == len(computed_in_turn1)
    assert after["reused_tokens"] - before["reused_tokens"] == len(computed_in_turn1)
    assert after["computed_tokens"] - before["computed_tokens"] == len(ids2) - len(computed_in_turn1)
    assert r2.choices[0].message.content == text2  # same as the cold run
    return r2, before, after, computed_in_turn1


# a conversation, and the same with its second message edited
CONVO = [{"role": "system", "content": "you are terse"},
         {"role": "user", "content": "first question about the sea"},
         {"role": "assistant", "content": "an answer"},
         {"role": "user", "content": "a follow-up"}]
EDITED = [CONVO[0], {"role": "user", "content": "first question about the moon"}] + CONVO[2:]


def test_second_turn_prefills_only_the_new_tokens(tiny_client, tiny_served, tiny_model_id, tiny_engine):
    r2, _, _, computed_in_turn1 = second_turn(tiny_client, tiny_model_id, tiny_served.service, tiny_engine)
    assert r2.usage.prompt_tokens_details.cached_tokens == len(computed_in_turn1)


def test_an_edit_mid_context_reuses_the_messages_before_it(tiny_client, tiny_served, tiny_model_id, tiny_engine):
    service = tiny_served.service
    ask(tiny_client, tiny_model_id, CONVO, max_tokens=2)
    full = render(tiny_engine, CONVO, True)
    ids, text, _ = cold(tiny_engine, EDITED, 3)
    before = prefix_stats(service)
    r = ask(tiny_client, tiny_model_id, EDITED, max_tokens=3)
    reused = prefix_stats(service)["reused_tokens"] - before["reused_tokens"]
    system_end = len(render(tiny_engine, CONVO[:1], False))  # the anchor before the edited message
    edit_at = naive_lcp(full, ids)  # where the token sequences part: inside the second message
    assert system_end < edit_at < len(render(tiny_engine, CONVO[:2], False))
    assert reused == edit_at  # from the edit on, not from the nearest anchor, and not from zero
    assert r.choices[0].message.content == text
