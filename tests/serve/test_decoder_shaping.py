"""The Decoder's logit shaping (penalties, logit_bias, allowed ids, bad words, min_tokens, min_p) runs on the logits'
device as dense elementwise ops; it equals the former host-side shaping (index writes over the seen tokens, kept
here as the reference) step by step, and a grammar's bitmask unpacked by torch equals xgrammar's own masking."""

from __future__ import annotations

import math

import torch

from freetoken.engine.sampling import SamplingParams
from freetoken.serve.chat import Params
from freetoken.serve.decoding import Decoder, Tables
from freetoken.serve.grammar import unpack_bitmask


def _ref_shape(logits, p: Params, sampling: SamplingParams, out: list[int], prompt: list[int],
               stop_ids: list[int], bad_words: list[list[int]]) -> torch.Tensor:
    ninf, shaped = float("-inf"), logits.clone()
    counts: dict[int, int] = {}
    for t in out:
        counts[t] = counts.get(t, 0) + 1
    if len(out) < p.min_tokens and stop_ids:
        shaped[torch.tensor(stop_ids)] = ninf
    if p.allowed_token_ids is not None:
        keep = torch.full_like(shaped, ninf)
        keep[torch.tensor(p.allowed_token_ids)] = 0.0
        shaped += keep
    for word in bad_words:
        if len(word) == 1 or out[-(len(word) - 1):] == word[:-1]:
            shaped[word[-1]] = ninf
    if p.logit_bias:
        shaped[torch.tensor(list(p.logit_bias))] += torch.tensor(list(p.logit_bias.values()))
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt) | set(counts)), dtype=torch.long)
        values = shaped[seen]
        shaped[seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
    if counts and (p.presence_penalty or p.frequency_penalty):
        ids = torch.tensor(list(counts))
        n = torch.tensor(list(counts.values()), dtype=torch.float32)
        shaped[ids] -= p.presence_penalty + p.frequency_penalty * n
    if p.min_p > 0 and not sampling.is_greedy:
        shaped[shaped < shaped.max() + sampling.temperature * math.log(p.min_p)] = ninf
    return shaped


def test_shaping_equals_the_host_reference_step_by_step():
    V, gen = 200, torch.Generator().manual_seed(0)
    params = Params(presence_penalty=0.7, frequency_penalty=0.3, logit_bias={5: 4.0, 17: -2.5, 40: 9.0},
                    repetition_penalty=1.3, min_p=0.02, min_tokens=3, allowed_token_ids=list(range(0, V, 2)) + [17])
    sampling = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=1)
    prompt, stops, bad = [3, 8, 8, 40, 122], [0, 6], [[12], [40, 44]]
    decoder = Decoder(params, sampling, stop_ids=frozenset(stops), prompt=prompt, bad_words=bad)
    for step in range(25):
        logits = torch.randn(V, generator=gen) * 3
        if decoder.tables is not None:  # the first call makes the tables
            want = _ref_shape(logits, params, sampling, decoder.out, prompt, stops, bad)
            torch.testing.assert_close(decoder.shape(logits), want, rtol=1e-6, atol=1e-6)
        token = decoder(logits)
        assert token % 2 == 0 or token == 17
        assert step >= 3 or token not in stops


def test_shaping_reads_nothing_back():
    """On the meta device (no data: any read back would raise): tables, shaping, accepting a token."""
    params = Params(presence_penalty=0.7, frequency_penalty=0.3, logit_bias={5: 4.0}, repetition_penalty=1.3,
                    min_p=0.02, min_tokens=3, allowed_token_ids=[1, 2, 3])
    decoder = Decoder(params, SamplingParams(temperature=0.9, seed=1), stop_ids=frozenset([0]), prompt=[3, 8],
                      bad_words=[[12]])
    logits = torch.empty(200, device="meta")
    decoder.tables = Tables.make(params, decoder.stop_ids, decoder.prompt_ids, 200, logits.device)
    assert decoder.shape(logits).shape == (200,)
    decoder.tables.accept(5)


def test_torch_bitmask_unpacking_equals_xgrammar():
    import xgrammar as xgr

    V, gen = 100, torch.Generator().manual_seed(3)
    bitmask = xgr.allocate_token_bitmask(1, V)
    bitmask.copy_(torch.randint(-2**31, 2**31 - 1, bitmask.shape, generator=gen, dtype=torch.int64).to(torch.int32))
    logits = torch.randn(V, generator=gen)
    want = logits.clone()
    xgr.apply_token_bitmask_inplace(want[None], bitmask)
    got = logits.masked_fill(~unpack_bitmask(bitmask[0], V), float("-inf"))
    assert torch.equal(got, want)
