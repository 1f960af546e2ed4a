"""The request fields a vLLM user sends, each against an independent reference: greedy decoding on the engine itself
with the field's rule applied to its logits (transformers' own RepetitionPenaltyLogitsProcessor for
repetition_penalty), HF's apply_chat_template for the prompt-shaping fields, separate single requests for n,
best_of and batched prompts."""

from __future__ import annotations

import math

import httpx
import pytest
import torch

from conftest import TIMEOUT, openai_client, running

PROMPT = "hello there"


@pytest.fixture(scope="module")
def client(served):
    return openai_client(served.url)


@pytest.fixture(scope="module")
def tok(engine_steps):
    return engine_steps.engine.tokenizer


def ids_of(choice) -> list[int]:
    """The sampled ids, from logprobs with return_tokens_as_token_ids."""
    return [int(t.token.split(":")[1]) for t in choice.logprobs.content]


def greedy_chat(client, model_id, n, **extra):
    return client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": PROMPT}],
                                          max_tokens=n, temperature=0, logprobs=True,
                                          extra_body={"return_tokens_as_token_ids": True, **extra})


def test_min_tokens_holds_the_stop_token_back(client, model_id, engine_steps, tok):
    eos = tok.eos_token_id
    bias = {"logit_bias": {str(eos): 100}}  # the stop token is the argmax at every step

    def shape(logits, out):
        logits[eos] += 100
        if len(out) < 5:
            logits[eos] = float("-inf")
        return logits

    expect, _ = engine_steps(PROMPT, 20, shape, stops={eos})
    r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": PROMPT}],
                                       max_tokens=20, temperature=0, logit_bias=bias["logit_bias"],
                                       extra_body={"min_tokens": 5})
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == len(expect) == 6
    assert r.choices[0].message.content == tok.decode(expect[:5])
    plain = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=20, temperature=0, logit_bias=bias["logit_bias"])
    assert plain.usage.completion_tokens == 1 and plain.choices[0].message.content == ""


def test_ignore_eos_and_skip_special_tokens(client, model_id, tok):
    eos, special = tok.eos_token_id, tok.decode([tok.eos_token_id], skip_special_tokens=False)
    for skip, text in ((True, ""), (False, special * 4)):
        r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=4, temperature=0, logit_bias={str(eos): 100},
                                           extra_body={"ignore_eos": True, "skip_special_tokens": skip})
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4
        assert r.choices[0].message.content == text


def test_stop_token_ids(client, model_id, engine_steps, tok):
    out, _ = engine_steps(PROMPT, 12)
    k = next(i for i in range(2, 12) if out[i] not in out[:i])  # a token that first appears at step k
    r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": PROMPT}],
                                       max_tokens=12, temperature=0, extra_body={"stop_token_ids": [out[k]]})
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == k + 1
    assert r.choices[0].message.content == tok.decode(out[:k])


def test_allowed_token_ids(client, model_id, engine_steps):
    allowed = list(range(40, 80))

    def shape(logits, out):
        keep = torch.full_like(logits, float("-inf"))
        keep[allowed] = 0
        return logits + keep

    expect, _ = engine_steps(PROMPT, 10, shape)
    r = greedy_chat(client, model_id, 10, allowed_token_ids=allowed)
    assert ids_of(r.choices[0]) == expect and set(expect) <= set(allowed)


def test_bad_words(client, model_id, engine_steps, tok):
    out, _ = engine_steps(PROMPT, 10)
    word = next(w for w in (tok.decode([t]).strip() for t in out) if w and w.isascii() and w.isalpha())
    banned = {ids[-1] for ids in (tok.encode(word, add_special_tokens=False),
                                  tok.encode(" " + word, add_special_tokens=False)) if len(ids) == 1}
    assert banned  # the word is one token: banned wherever it would start

    def shape(logits, out):
        logits[list(banned)] = float("-inf")
        return logits

    expect, _ = engine_steps(PROMPT, 10, shape)
    r = greedy_chat(client, model_id, 10, bad_words=[word])
    assert ids_of(r.choices[0]) == expect != out and not banned & set(expect)


def test_repetition_penalty_is_transformers(client, model_id, engine_steps):
    from transformers import RepetitionPenaltyLogitsProcessor

    from freetoken.models.tokenizer import chat_prompt

    prompt = chat_prompt(engine_steps.engine.tokenizer, PROMPT)
    hf = RepetitionPenaltyLogitsProcessor(1.7)

    def shape(logits, out):
        return hf(torch.tensor([prompt + out]), logits[None])[0]

    expect, _ = engine_steps(PROMPT, 12, shape)
    plain, _ = engine_steps(PROMPT, 12)
    r = greedy_chat(client, model_id, 12, repetition_penalty=1.7)
    assert ids_of(r.choices[0]) == expect != plain


def test_min_p(client, model_id, engine_steps):
    plain, _ = engine_steps(PROMPT, 8)
    r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": PROMPT}], max_tokens=8,
                                       temperature=1.0, seed=3, logprobs=True, top_logprobs=1,
                                       extra_body={"min_p": 1.0, "return_tokens_as_token_ids": True})
    assert ids_of(r.choices[0]) == plain  # only the most likely token is left: greedy, whatever the seed
    r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": PROMPT}], max_tokens=30,
                                       temperature=1.0, seed=3, logprobs=True, top_logprobs=1,
                                       extra_body={"min_p": 0.2})
    for t in r.choices[0].logprobs.content:  # every sampled token was at least 0.2 x the most likely one
        assert t.logprob >= math.log(0.2) + t.top_logprobs[0].logprob - 1e-5


def test_truncate_prompt_tokens(client, model_id, tok):
    text = " ".join(str(i) for i in range(40))
    ids = tok.encode(text)
    r = client.completions.create(model=model_id, prompt=text, max_tokens=6, temperature=0,
                                  extra_body={"truncate_prompt_tokens": 7})
    same = client.completions.create(model=model_id, prompt=ids[-7:], max_tokens=6, temperature=0)
    assert r.usage.prompt_tokens == 7 and r.choices[0].text == same.choices[0].text
    c = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": text}], max_tokens=2,
                                       extra_body={"truncate_prompt_tokens": 9})
    assert c.usage.prompt_tokens == 9


def test_chat_prompt_logprobs(served, model_id, engine_steps):
    from freetoken.models.tokenizer import chat_prompt

    engine = engine_steps.engine
    ids = chat_prompt(engine.tokenizer, PROMPT)
    ref = torch.log_softmax(engine.prefill(ids, engine.new_kv(), all_logits=True).float(), -1)  # [T, V]
    body = {"model": model_id, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1,
            "prompt_logprobs": 2}
    got = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=TIMEOUT).json()["prompt_logprobs"]
    assert got[0] is None and len(got) == len(ids)
    for i in range(1, len(ids)):
        own = got[i][str(ids[i])]
        assert own["logprob"] == pytest.approx(float(ref[i - 1, ids[i]]), abs=1e-4)
        assert own["rank"] == 1 + int((ref[i - 1] > ref[i - 1, ids[i]]).sum())
        best = [v["logprob"] for k, v in got[i].items() if v["rank"] <= 2]
        assert max(best) == pytest.approx(float(ref[i - 1].max()), abs=1e-4)


def test_echo_continue_final_message_add_generation_prompt(client, model_id, tok):
    messages = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "Once upon"}]
    r = client.chat.completions.create(model=model_id, messages=messages, max_tokens=4, temperature=0,
                                       extra_body={"echo": True, "continue_final_message": True,
                                                   "add_generation_prompt": False})
    rendered = tok.apply_chat_template(messages, continue_final_message=True, tokenize=False)
    assert r.usage.prompt_tokens == len(tok.encode(rendered, add_special_tokens=False))
    assert r.choices[0].message.content.startswith("Once upon")
    r = client.chat.completions.create(model=model_id, messages=messages[:1], max_tokens=1,
                                       extra_body={"add_generation_prompt": False})
    rendered = tok.apply_chat_template(messages[:1], add_generation_prompt=False, tokenize=False)
    assert r.usage.prompt_tokens == len(tok.encode(rendered, add_special_tokens=False))
    bad = httpx.post(client.base_url.__str__().rstrip("/") + "/chat/completions", timeout=TIMEOUT, json={
        "model": model_id, "messages": messages[:1], "continue_final_message": True, "max_tokens": 1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "continue_final_message"


DOC_TEMPLATE = ("{% for d in documents %}[doc {{ d.title }}] {{ d.text }}\n{% endfor %}"
                "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "<|im_start|>assistant\n")


def test_chat_template_and_documents(served, model_id, tok):
    docs = [{"title": "a", "text": "experts live in host memory"}, {"title": "b", "text": "slots on the GPU"}]
    body = {"model": model_id, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1,
            "documents": docs, "chat_template": DOC_TEMPLATE}
    r = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
    assert r.status_code == 400 and "--trust-request-chat-template" in r.json()["error"]["message"]
    with running(None, trust_request_chat_template=True) as trusted:
        r = httpx.post(trusted.url + "/v1/chat/completions", json=body, timeout=TIMEOUT).json()
    rendered = tok.apply_chat_template(body["messages"], documents=docs, chat_template=DOC_TEMPLATE, tokenize=False)
    assert "[doc b] slots on the GPU" in rendered
    assert r["usage"]["prompt_tokens"] == len(tok.encode(rendered, add_special_tokens=False))


def test_n_samples_equal_their_single_runs_and_share_one_prefill(served, client, model_id):
    engine = served.service.backend.engine
    kw = dict(model=model_id, messages=[{"role": "user", "content": "a story please"}], max_tokens=12,
              temperature=1.0)
    singles = [client.chat.completions.create(**kw, seed=7 + j).choices[0].message.content for j in range(3)]
    before = engine.stats.prefill_tokens
    r = client.chat.completions.create(**kw, seed=7, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.message.content for c in r.choices] == singles and len(set(singles)) == 3
    prompt = r.usage.prompt_tokens
    assert engine.stats.prefill_tokens - before <= prompt  # one prefill (less what the prefix cache held)
    assert r.usage.completion_tokens == 36


def test_best_of_returns_the_most_likely_sample(client, model_id):
    kw = dict(model=model_id, prompt="once", max_tokens=8, temperature=1.0)
    runs = [client.completions.create(**kw, seed=11 + j, logprobs=0).choices[0] for j in range(4)]
    sums = [sum(runs[j].logprobs.token_logprobs) for j in range(4)]
    r = client.completions.create(**kw, seed=11, best_of=4, n=1)
    assert len(r.choices) == 1 and r.choices[0].text == runs[max(range(4), key=lambda j: sums[j])].text
    two = client.completions.create(**kw, seed=11, best_of=4, n=2)
    order = sorted(range(4), key=lambda j: -sums[j])[:2]
    assert [c.text for c in two.choices] == [runs[j].text for j in order]


def test_batched_prompts_equal_single_requests(client, model_id, tok):
    prompts = ["the cache", "experts", "a slot on the device"]
    singles = [client.completions.create(model=model_id, prompt=p, max_tokens=6, temperature=0) for p in prompts]
    r = client.completions.create(model=model_id, prompt=prompts, max_tokens=6, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [s.choices[0].text for s in singles]
    assert r.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    ids = [tok.encode(p) for p in prompts]
    r = client.completions.create(model=model_id, prompt=ids, max_tokens=6, temperature=1.0, seed=5, n=2)
    assert [c.index for c in r.choices] == list(range(6))
    for i in range(3):  # prompt i's samples j are choices i * 2 + j, each its own seed + j
        one = client.completions.create(model=model_id, prompt=ids[i], max_tokens=6, temperature=1.0, seed=5, n=2)
        assert [c.text for c in r.choices[2 * i:2 * i + 2]] == [c.text for c in one.choices]


def test_completions_response_format_and_add_special_tokens(client, model_id, tok):
    import json

    schema = {"type": "object", "properties": {"k": {"enum": ["a", "b"]}, "v": {"type": "integer", "minimum": 0,
                                                                              "maximum": 9}},
              "required": ["k", "v"], "additionalProperties": False}
    r = client.completions.create(model=model_id, prompt="json:", max_tokens=40, seed=1, extra_body={
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    obj = json.loads(r.choices[0].text)
    assert obj["k"] in ("a", "b") and 0 <= obj["v"] <= 9
    for special in (True, False):
        r = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=1,
                                      extra_body={"add_special_tokens": special})
        assert r.usage.prompt_tokens == len(tok.encode(PROMPT, add_special_tokens=special))


def test_responses_seed_and_top_k(client, model_id, engine_steps, tok):
    kw = dict(model=model_id, input=PROMPT, max_output_tokens=8, temperature=1.0)
    a, b = (client.responses.create(**kw, extra_body={"seed": 4}) for _ in range(2))
    c = client.responses.create(**kw, extra_body={"seed": 5})
    assert a.output_text == b.output_text != c.output_text
    greedy, _ = engine_steps(PROMPT, 8)
    top1 = client.responses.create(**kw, extra_body={"seed": 4, "top_k": 1})
    assert top1.output_text == tok.decode(greedy)
