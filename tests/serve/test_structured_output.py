"""Structured output valid by construction, and checked: random walks through the real token masks (xgrammar's
grammar and the UTF-8 / control-character guard, any allowed token equally likely) always end in JSON that
jsonschema accepts, while xgrammar alone lets raw control characters and broken UTF-8 through; 200 json_schema
replies of the random demo model all parse and validate; regex, choice and EBNF grammar constraints under vLLM's
names; a reply that fails its own check is a 500, counted in /metrics."""

from __future__ import annotations

import json
import random
import re

import httpx
import jsonschema
import pytest
import torch

from conftest import TIMEOUT, openai_client

from freetoken.serve.grammar import Constraint, Grammars

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "code", "tag", "grid", "n"],
          "properties": {"name": {"type": "string", "minLength": 2, "maxLength": 8},
                         "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{2,3}$"},
                         "tag": {"enum": ["red", "green", "blue \"b\""]},
                         "grid": {"type": "array", "maxItems": 3, "items": {
                             "type": "array", "maxItems": 3, "items": {"type": "integer", "minimum": -9,
                                                                       "maximum": 99}}},
                         "n": {"type": "number", "minimum": 0, "maximum": 1},
                         "note": {"type": "string", "maxLength": 5}}}
WALK_SCHEMAS = {
    "bounded strings": {"type": "object", "properties": {"a": {"type": "string", "minLength": 1, "maxLength": 6},
                                                         "b": {"type": "string", "pattern": "^.{0,4}$"}},
                        "required": ["a", "b"], "additionalProperties": False},
    "the test schema": SCHEMA,
}


@pytest.fixture(scope="module")
def grammars():
    from freetoken.models.tokenizer import load_tokenizer
    from freetoken.paths import DEMO_MODEL

    tok = load_tokenizer(DEMO_MODEL)
    return Grammars(tok, 384, {tok.eos_token_id}), tok


def walk(mask, tok, rng, guarded=True, steps=300) -> str | None:
    """Uniformly random allowed tokens until the stop token; the decoded text (None: not finished in time)."""
    ids = []
    for _ in range(steps):
        logits = torch.zeros(384)
        mask.matcher.fill_next_token_bitmask(mask.bitmask)
        mask._apply(logits[None], mask.bitmask)
        if guarded:
            mask.guard.mask(logits)
        token = rng.choice(torch.nonzero(torch.isfinite(logits)).flatten().tolist())
        mask.accept(token)
        if token == tok.eos_token_id:
            return tok.decode(ids)
        ids.append(token)
    return None


def check(text: str, schema: dict) -> str | None:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError) as e:
        return type(e).__name__
    return None


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "the test schema" else n
                                  for n in WALK_SCHEMAS])  # (that walk: ~4 s)
def test_random_walks_through_the_guarded_masks_always_validate(grammars, name):
    g, tok = grammars
    schema, rng = WALK_SCHEMAS[name], random.Random(0)
    texts = [walk(g.mask(Constraint("json", schema, "s")), tok, rng) for _ in range(200)]
    done = [t for t in texts if t is not None]
    assert len(done) >= 150 and [check(t, schema) for t in done] == [None] * len(done)


def test_xgrammar_alone_admits_control_characters_and_broken_utf8(grammars):
    """Why the guard exists (xgrammar 0.2.8, upstream issue #800): the same walks without it go wrong."""
    g, tok = grammars
    schema, rng = WALK_SCHEMAS["bounded strings"], random.Random(0)
    texts = [walk(g.mask(Constraint("json", schema, "s")), tok, rng, guarded=False) for _ in range(200)]
    bad = [t for t in texts if t is not None and check(t, schema)]
    assert any(re.search(r"[\x00-\x1f]", t) for t in bad) and any("\ufffd" in t for t in bad)


@pytest.mark.slow
def test_200_json_schema_replies_of_the_random_demo_all_validate(served, model_id):
    client = openai_client(served.url)
    fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA, "strict": True}}
    before, replies = counted(served.url), []
    for i in range(25):
        r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": f"record {i}"}],
                                           max_tokens=400, n=8, seed=i, temperature=1.0, response_format=fmt)
        replies += [(c.finish_reason, c.message.content) for c in r.choices]
    assert len(replies) == 200 and {f for f, _ in replies} == {"stop"}
    assert [check(text, SCHEMA) for _, text in replies] == [None] * 200
    assert len({text for _, text in replies}) > 150  # sampled, not one reply repeated
    assert counted(served.url) == before  # the server's own check refused none


@pytest.mark.parametrize("extra, ok", [
    ({"structured_outputs": {"regex": "[a-c]{2,4}-[0-9]"}}, lambda t: re.fullmatch("[a-c]{2,4}-[0-9]", t)),
    ({"guided_regex": "(yes|no), [0-9]{1,2}"}, lambda t: re.fullmatch("(yes|no), [0-9]{1,2}", t)),
    ({"structured_outputs": {"choice": ["alpha", "beta gamma", "\"q\""]}},
     lambda t: t in ("alpha", "beta gamma", "\"q\"")),
    ({"guided_choice": ["x", "y"]}, lambda t: t in ("x", "y")),
    ({"structured_outputs": {"grammar": 'root ::= "(" num ("," num)* ")"\nnum ::= [0-9]{1,3}'}},
     lambda t: re.fullmatch(r"\(\d{1,3}(,\d{1,3})*\)", t)),
    ({"guided_json": {"type": "object", "properties": {"k": {"enum": [1, 2]}}, "required": ["k"]}},
     lambda t: json.loads(t)["k"] in (1, 2)),
])
def test_vllm_constraints(served, model_id, extra, ok):
    client = openai_client(served.url)
    for seed in range(4):
        r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "go"}],
                                           max_tokens=120, seed=seed, temperature=1.0, extra_body=extra)
        text = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop" and ok(text), text
    r = client.completions.create(model=model_id, prompt="go", max_tokens=120, seed=0, extra_body=extra)
    assert r.choices[0].finish_reason == "stop" and ok(r.choices[0].text)


def test_json_object_is_an_object_from_its_first_character(served, model_id):
    """Any object is unbounded: a random model rarely closes it, but what it writes is an object's beginning."""
    client = openai_client(served.url)
    r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "go"}], max_tokens=40,
                                       seed=0, extra_body={"structured_outputs": {"json_object": True}})
    text = r.choices[0].message.content
    assert text.startswith("{") and (r.choices[0].finish_reason == "length" or isinstance(json.loads(text), dict))


def test_constraint_mistakes_are_400s_naming_the_field(served, model_id):
    base = {"model": model_id, "max_tokens": 4, "messages": [{"role": "user", "content": "go"}]}
    for extra, param in (({"structured_outputs": {"regex": "(ab"}}, "structured_outputs.regex"),
                         ({"structured_outputs": {"grammar": "root ::= foo"}}, "structured_outputs.grammar"),
                         ({"guided_choice": []}, "guided_choice"),
                         ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
                         ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
                          "structured_outputs.regex")):
        r = httpx.post(served.url + "/v1/chat/completions", json={**base, **extra}, timeout=TIMEOUT)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_reply_that_fails_its_own_check_is_a_500_and_counted(served, model_id, monkeypatch):
    """The last line of defence, exercised: the check is made to disagree with the grammar."""
    import freetoken.serve.service as service_module

    monkeypatch.setattr(service_module, "validate", lambda c, text, g: "injected disagreement")
    before = counted(served.url)
    body = {"model": model_id, "max_tokens": 60, "messages": [{"role": "user", "content": "go"}],
            "guided_choice": ["x", "y"]}
    r = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
    assert r.status_code == 500 and r.json()["error"]["code"] == "structured_output_invalid"
    assert "guided_choice: the reply does not satisfy the constraint (injected disagreement)" in r.text
    assert counted(served.url) == before + 1


def counted(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=TIMEOUT).text)
               for s in fam.samples if s.name == "freetoken_structured_output_invalid_total")


def test_responses_text_format(served, model_id):
    c = openai_client(served.url)
    small = {"type": "object", "properties": {"k": {"enum": ["a", "b"]}, "n": {"type": "integer", "minimum": 0,
                                                                              "maximum": 9}},
             "required": ["k", "n"], "additionalProperties": False}
    for seed in range(3):
        r = c.responses.create(model=model_id, input="json", max_output_tokens=60, extra_body={"seed": seed},
                               text={"format": {"type": "json_schema", "name": "x", "schema": small}})
        assert r.status == "completed" and check(r.output_text, small) is None
