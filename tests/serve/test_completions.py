"""/v1/completions through the official client on the tiny model: a text prompt and its token ids give the engine's
own greedy continuation; echo with logprobs (max_tokens 0, what evaluation harnesses send for log-likelihoods)
gives every prompt token's log-softmax from the engine's prefill logits."""

from __future__ import annotations

import pytest
import torch

TEXT = "The cat sat on"


def test_text_and_ids_give_the_engines_greedy_continuation(tiny_client, tiny_model_id, tiny_engine):
    from freetoken.engine import SamplingParams

    tok = tiny_engine.tokenizer
    ids = tok.encode(TEXT)
    expect = list(tiny_engine.generate(ids, SamplingParams(greedy=True), max_tokens=8))  # stop token included
    by_text = tiny_client.completions.create(model=tiny_model_id, prompt=TEXT, max_tokens=8, temperature=0)
    by_ids = tiny_client.completions.create(model=tiny_model_id, prompt=ids, max_tokens=8, temperature=0)
    assert by_text.choices[0].text == by_ids.choices[0].text == tok.decode(expect, skip_special_tokens=True)
    stopped = expect[-1] in tiny_engine.default_stop_ids()
    assert by_text.usage.prompt_tokens == len(ids) and by_text.usage.completion_tokens == len(expect)
    assert by_text.choices[0].finish_reason == ("stop" if stopped else "length")
    streamed = tiny_client.completions.create(model=tiny_model_id, prompt=TEXT, max_tokens=8, temperature=0,
                                              stream=True, echo=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == TEXT + by_text.choices[0].text


def test_echo_logprobs_are_the_prompts_log_softmax(tiny_client, tiny_model_id, tiny_engine):
    ids = tiny_engine.tokenizer.encode(TEXT)
    logits = tiny_engine.prefill(ids, tiny_engine.new_kv(), all_logits=True).float()  # [T, V]
    ref = torch.log_softmax(logits, -1)
    r = tiny_client.completions.create(model=tiny_model_id, prompt=TEXT, max_tokens=0, echo=True, logprobs=2)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == TEXT and r.usage.completion_tokens == 0
    assert lp.tokens == [tiny_engine.tokenizer.decode([t]) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx([float(ref[i - 1, ids[i]]) for i in range(1, len(ids))],
                                                  abs=1e-4)
    assert [max(d.values()) for d in lp.top_logprobs[1:]] == pytest.approx(ref[:-1].max(-1).values.tolist(),
                                                                           abs=1e-4)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(ids))]


def test_generated_logprobs_and_refusals(tiny_client, tiny_model_id, tiny_served):
    import openai

    r = tiny_client.completions.create(model=tiny_model_id, prompt=TEXT, max_tokens=4, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == r.usage.completion_tokens - (r.choices[0].finish_reason == "stop")  # no stop token
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(v == pytest.approx(max(top.values())) for v, top in zip(lp.token_logprobs, lp.top_logprobs))
    for kw, param in (({"suffix": "x"}, "suffix"), ({"extra_body": {"use_beam_search": True}}, "use_beam_search"),
                      ({"max_tokens": 0}, "max_tokens"), ({"prompt": [10**9]}, "prompt")):
        with pytest.raises(openai.BadRequestError) as e:
            tiny_client.completions.create(**{"model": tiny_model_id, "prompt": TEXT, "max_tokens": 2, **kw})
        assert e.value.body["param"] == param, e.value.body
