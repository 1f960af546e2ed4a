"""One bad request never harms another: a sequence that fails while decoding in a batch of four fails alone, with
its own error, and its three batch-mates' tokens equal their solo runs (`ft generate --greedy`). Failures that
can be known before a request joins a batch (a schema with no finite instance, a keyword the grammar cannot
enforce) are a 400 naming the schema path, and the batch never sees them."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from conftest import TIMEOUT, openai_client, running

PROMPTS = [f"tell me about expert {i}" for i in range(3)]
N = 24
# a choice ends after a token or two; min_tokens forbids the stop token after it: no token is left at step ~3
POISON = {"structured_outputs": {"choice": ["ab"]}, "min_tokens": 8}


@pytest.fixture(scope="module")
def backend():
    """The demo model on the engine, with no server in front (the tests drive a Scheduler themselves)."""
    from freetoken.serve.config import ServeConfig
    from freetoken.serve.startup import load

    b, _ = load(ServeConfig(device_budget_gb=1.0, port=0), log=lambda s: None)
    return b


def run_batch(backend, poison_params, patch=None):
    """Four sequences submitted together (one scheduler iteration admits them all, so they decode as one batch):
    the three PROMPTS greedily, then the poison. -> (tokens per sequence, error per sequence, batch sizes)."""
    from freetoken.serve.chat import Params
    from freetoken.serve.decoding import make_decoder
    from freetoken.serve.grammar import Grammars
    from freetoken.serve.scheduler import END, Job, Scheduler

    grammars = Grammars(backend.chat.tok, backend.vocab_size, backend.stop_token_ids)
    chats = [[{"role": "user", "content": p}] for p in PROMPTS + ["poison"]]
    params = [Params(N, temperature=0) for _ in PROMPTS] + [poison_params]
    tokens, errors, done, sizes = [[] for _ in chats], [None] * 4, threading.Semaphore(0), []
    jobs = []
    for k, (messages, p) in enumerate(zip(chats, params)):
        prompt = backend.chat.render(messages)
        gen = backend.generate(prompt, make_decoder(backend, grammars, p, prompt.tokens), N)

        def emit(item, k=k):
            if isinstance(item, BaseException):
                errors[k] = item
            elif item is not END:
                tokens[k].append(item[0])

        jobs.append(Job(gen, emit, lambda: None, threading.Event(), done.release))
    scheduler = Scheduler(backend, sizes.append)
    try:
        if patch:
            patch(jobs[3].gen)
        scheduler.submit(*jobs)
        for _ in jobs:
            assert done.acquire(timeout=120)
    finally:
        scheduler.shutdown()
    return tokens, errors, sizes


def solo(greedy):
    return [greedy(p, N).out for p in PROMPTS]


def test_a_sequence_whose_constraint_runs_dry_fails_alone(backend, greedy):
    from freetoken.serve.chat import Params
    from freetoken.serve.grammar import Constraint

    poison = Params(N, temperature=0, constraint=Constraint("choice", ["ab"], "structured_outputs.choice"),
                    min_tokens=8)
    tokens, errors, sizes = run_batch(backend, poison)
    assert errors[:3] == [None] * 3 and tokens[:3] == solo(greedy)
    assert errors[3].status == 400 and errors[3].code == "no_token_allowed"
    assert "structured_outputs.choice" in errors[3].message
    assert 4 in sizes  # it failed inside a decode step of all four


def test_nan_logits_of_one_sequence_fail_it_alone(backend, greedy, monkeypatch):
    """The model's logits for one sequence turn NaN mid-batch (injected into the engine's batched step)."""
    from freetoken.serve.chat import Params

    engine, real = backend.engine, backend.engine.decode_batch

    def patch(poison_gen):
        def decode_batch(tokens, kvs, requests, settle=True):
            logits = real(tokens, kvs, requests, settle)
            for i, kv in enumerate(kvs):
                if kv is poison_gen.seq.kv and len(poison_gen.generated) >= 3:
                    logits[i] = float("nan")
            return logits

        monkeypatch.setattr(engine, "decode_batch", decode_batch)

    tokens, errors, sizes = run_batch(backend, Params(N, temperature=0), patch)
    assert errors[:3] == [None] * 3 and tokens[:3] == solo(greedy)
    assert errors[3].status == 500 and "NaN" in errors[3].message and len(tokens[3]) == 3
    assert 4 in sizes


def test_a_batched_step_that_raises_is_undone_and_only_the_culprit_fails(backend, greedy, monkeypatch):
    """The batched forward raises because of one sequence (injected: the engine refuses its KV cache): the step is
    undone, its four sequences are stepped alone, and only that one fails."""
    from freetoken.serve.chat import Params

    engine, real_batch, real_one = backend.engine, backend.engine.decode_batch, backend.engine.decode

    def patch(poison_gen):
        def check(kvs):
            if len(poison_gen.generated) >= 3 and any(kv is poison_gen.seq.kv for kv in kvs):
                raise RuntimeError("this KV cache is broken")

        def decode_batch(tokens, kvs, requests, settle=True):
            out = real_batch(tokens, kvs, requests, settle)  # the KV of every sequence is written, then it fails
            check(kvs)
            return out

        def decode(token, kv, request=0, turn=0, settle=True):
            check([kv])
            return real_one(token, kv, request, turn, settle)

        monkeypatch.setattr(engine, "decode_batch", decode_batch)
        monkeypatch.setattr(engine, "decode", decode)

    tokens, errors, sizes = run_batch(backend, Params(N, temperature=0), patch)
    assert errors[:3] == [None] * 3 and tokens[:3] == solo(greedy)  # their KV was cut back, then stepped again
    assert isinstance(errors[3], RuntimeError) and len(tokens[3]) == 3


def test_poison_over_http_with_three_batch_mates(greedy):
    """The same through the server: four clients at once, one poisoned; its 400 names the field, the others get
    their solo answers, and the server goes on serving."""
    import openai

    expect = [greedy(p, N) for p in PROMPTS]
    with running(None, max_running=4) as (url, service):
        client = openai_client(url)

        def ask(i):
            body = {"model": service.backend.model_id, "max_tokens": N, "temperature": 0,
                    "messages": [{"role": "user", "content": (PROMPTS + ["poison"])[i]}]}
            try:
                if i == 3:
                    return client.chat.completions.create(**body, extra_body=POISON)
                return client.chat.completions.create(**body).choices[0].message.content
            except openai.APIStatusError as e:
                return e

        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(ask, range(4)))
        assert got[:3] == [g.text for g in expect]
        assert isinstance(got[3], openai.BadRequestError) and got[3].body["code"] == "no_token_allowed"
        health = httpx.get(url + "/health", timeout=TIMEOUT).json()
        assert (health["running"], health["waiting"], health["served"]) == (0, 0, 3)


@pytest.mark.parametrize("schema, path", [
    ({"type": "object", "properties": {"child": {"$ref": "#"}}, "required": ["child"]},
     "response_format.json_schema.schema.properties.child"),
    ({"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1}}, "$ref": "#/$defs/n"},
     "response_format.json_schema.schema.$defs.n.items"),
    ({"type": "object", "properties": {"a": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}},
     "response_format.json_schema.schema.properties.a.oneOf"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
     "response_format.json_schema.schema.uniqueItems"),
    ({"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}},
     "response_format.json_schema.schema.properties.a.$ref"),
    ({"type": "string", "maxLength": -1}, "response_format.json_schema.schema.maxLength"),
])
def test_schemas_the_grammar_cannot_keep_are_a_400_naming_the_path(served, model_id, schema, path):
    body = {"model": model_id, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    r = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(path + ":"), r.text
    ok = {**body, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"child": {"$ref": "#"}}}}}}  # recursive, but finite: fine
    assert httpx.post(served.url + "/v1/chat/completions", json=ok, timeout=TIMEOUT).status_code == 200


def test_the_issues_recursive_schema_through_anthropic_too(served, model_id):
    schema = {"type": "object", "properties": {"child": {"$ref": "#"}}, "required": ["child"]}
    body = {"model": model_id, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
            "output_config": {"format": {"type": "json_schema", "schema": schema}}}
    r = httpx.post(served.url + "/v1/messages", json=body, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(
        "output_config.format.schema.properties.child: the schema has no finite instance")
