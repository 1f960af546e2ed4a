"""The Decoder's logit shaping (penalties, logit_bias, allowed ids, bad words, min_tokens, min_p) runs on the logits'
device as dense elementwise ops; it equals the former host-side shaping (index writes over the seen tokens, kept
here as the reference) step by step, and a grammar's bitmask unpacked by torch equals xgrammar's own masking."""

from __future__ import annotations

import math

import torch

from freetoken.engine.sampling import Sampler, SamplingParams
from freetoken.serve.chat import Params
from freetoken.serve.decoding import Decoder, Tables, choose
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
            shaped = logits.clone()
            decoder.shape(shaped)
            torch.testing.assert_close(shaped, want, rtol=1e-6, atol=1e-6)
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
    decoder.shape(logits)
    assert logits.shape == (200,)
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


def test_a_batch_chooses_what_each_sequence_would_alone():
    """choose() over a decode batch's rows (one argmax and one NaN / dead-end check for all) = per row: the reference
    shaping, then torch.argmax (greedy) or a twin Sampler's draw (same seed), 0 where a token is forced."""
    for V in (300, 5000):  # 5000: the CPU's block route (host_sampling.by_blocks)
        gen = torch.Generator().manual_seed(V)
        rows = [(Params(logit_bias={5: 4.0}), SamplingParams(temperature=0.0), ()),
                (Params(presence_penalty=0.5), SamplingParams(temperature=0.8, top_k=20, seed=3), ()),
                (Params(allowed_token_ids=[4, 9, 17]), SamplingParams(temperature=0.0), ()),
                (Params(min_p=0.1, repetition_penalty=1.2), SamplingParams(temperature=1.0, seed=5), ()),
                (Params(), SamplingParams(temperature=0.0), ()),  # forced tokens
                (Params(allowed_token_ids=[4]), SamplingParams(temperature=0.0), [[4]])]  # nothing allowed: dead
        decoders = [Decoder(p, s, prompt=[3, 8], bad_words=bad) for p, s, bad in rows]
        decoders[4].forced = [7, 8]
        twins = [Sampler(d.sampling) for d in decoders]
        for step in range(4):
            logits = torch.randn(len(rows), V, generator=gen) * 3  # [B, V]
            if step == 3:
                logits[2, 11] = float("nan")
            shaped = logits.clone()
            for b, d in enumerate(decoders):
                d.shape_(logits[b], shaped[b])
            got = choose(decoders, logits, shaped).tolist()
            for b, d in enumerate(decoders):
                ref = _ref_shape(logits[b], d.params, d.sampling, d.out, [3, 8] if d.tables.penalties else [], [],
                                 rows[b][2])
                token = 0 if d.forced else int(torch.argmax(ref)) if d.sampling.is_greedy else int(twins[b].pick(ref))
                assert got[b] == [token, int(torch.isnan(logits[b]).any()), int(bool((ref == float("-inf")).all()))]
                if not any(got[b][1:]):
                    d.commit(*got[b])
        assert decoders[4].out[:2] == [7, 8] and len(decoders[4].out) == 4 and decoders[5].out == []
