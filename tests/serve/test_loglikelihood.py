"""lm-eval's loglikelihood wire format without lm-eval (benchmarks/lm_eval_check.py runs lm-eval itself): the
payload its `local-completions` model sends with --batch_size 4 (four token-id prompts, echo, logprobs 1,
max_tokens 1, temperature 0), read the way its parse_logprobs reads the reply (token_logprobs[ctxlen:-1]), equals
log P(continuation | context) from one HF transformers forward of the same checkpoint."""

from __future__ import annotations

import httpx
import pytest
import torch

from conftest import TIMEOUT

PAIRS = [("Question: Where do the experts live?\nAnswer:", " in host memory"),
         ("Question: Where do the experts live?\nAnswer:", " on the moon"),
         ("The placement policy decides", " residency"),
         ("Decode steps are", " batched together, one MoE call per layer")]


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from freetoken.paths import DEMO_MODEL

    return AutoModelForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32).eval(), \
        AutoTokenizer.from_pretrained(DEMO_MODEL)


def test_batched_echo_logprobs_equal_a_transformers_forward(served, model_id, hf):
    model, tok = hf
    encoded = []
    for context, continuation in PAIRS:  # lm-eval's _encode_pair: the whole encoded, then split
        whole = tok(context + continuation, add_special_tokens=False).input_ids
        encoded.append((whole, len(tok(context, add_special_tokens=False).input_ids)))
    payload = {"model": model_id, "prompt": [w for w, _ in encoded], "temperature": 0, "max_tokens": 1,
               "logprobs": 1, "seed": 1234, "echo": True}
    r = httpx.post(served.url + "/v1/completions", json=payload, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    choices = sorted(r.json()["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    worst = 0.0
    for choice, (whole, ctxlen) in zip(choices, encoded):
        got = sum(choice["logprobs"]["token_logprobs"][ctxlen:-1])  # lm-eval's parse_logprobs
        with torch.inference_mode():
            logprobs = torch.log_softmax(model(torch.tensor([whole])).logits[0].float(), -1)  # [T, V]
        ref = float(sum(logprobs[i - 1, whole[i]] for i in range(ctxlen, len(whole))))
        worst = max(worst, abs(got - ref))
        assert len(choice["logprobs"]["token_logprobs"]) == len(whole) + 1  # the prompt, then the one new token
    assert worst < 1e-4
