"""The CPU route for long vocabularies (host_sampling.py) against the single-pass definitions it stands in for:
torch.argmax's index, the top-k / top-p sets and probabilities of the former host sampler, and draws that follow
them (the block-then-race draw and the top-k candidates change which random numbers are drawn, not the law)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.engine import host_sampling as hs
from freetoken.engine.sampling import Sampler, SamplingParams, _sorted_threshold, allowed_probs
from tests.engine.test_sampling import _ref_probs

V_LONG = 5000  # 4 blocks and a tail: the CPU route (by_blocks)
V_CANDIDATES = 32000  # 125 blocks of 256: top-k candidates up to k = 62


def _argmax_cases():
    gen = torch.Generator().manual_seed(0)
    for V in (4096, 4097, V_LONG, 151936):
        x = torch.randn(V, generator=gen)
        yield x
        for spots in ([V - 1], [3, V - 2], [1500, 1023, 4000], [1024, 1025]):  # ties: the first counts
            y = x.clone()
            y[spots] = 9.0
            yield y
        y = x.clone()
        y[[2000, 17]] = float("nan")
        yield y
    yield torch.full((V_LONG,), float("-inf"))


def test_first_argmax_is_torch_argmax():
    for x in _argmax_cases():
        assert hs.by_blocks(x)
        assert int(hs.first_argmax(x)) == int(torch.argmax(x))
    by_length: dict[int, list] = {}
    for x in _argmax_cases():
        by_length.setdefault(x.numel(), []).append(x)
    for cases in by_length.values():  # [B, V] (a decode batch's rows): each row's own answer
        rows = torch.stack(cases)
        assert torch.equal(hs.first_argmax(rows), torch.argmax(rows, 1))


@pytest.mark.parametrize("k", [1, 5, 20, 50])
def test_top_candidates_hold_every_token_top_k_keeps(k):
    gen = torch.Generator().manual_seed(k)
    for scale in (0.5, 3.0, 12.0):
        x = torch.randn(V_CANDIDATES, generator=gen) * scale
        kth = torch.topk(x, k).values[-1]
        x[torch.randperm(V_CANDIDATES, generator=gen)[:3]] = kth  # ties with the k-th logit are kept too
        ids, values = hs.top_candidates(x, k)
        assert torch.equal(values, x[ids]) and bool((ids[1:] > ids[:-1]).all())
        assert set(torch.nonzero(x >= kth).squeeze(1).tolist()) <= set(ids.tolist())
        assert len(ids) < V_CANDIDATES // 4  # it narrows


def test_top_candidates_decline_where_the_bound_fails():
    assert hs.top_candidates(torch.randn(V_LONG), 9) is not None
    assert hs.top_candidates(torch.randn(V_LONG), V_LONG // 256) is None  # fewer than 2k blocks
    x = torch.full((V_LONG,), float("-inf"))
    x[:5] = 1.0
    assert hs.top_candidates(x, 10) is None  # the k-th block maximum is -inf: no narrowing


def test_top_p_threshold_is_the_sorted_one():
    gen = torch.Generator().manual_seed(1)
    for V in (4096, V_LONG, 151936):
        for trial in range(12):
            probs = torch.softmax(torch.randn(V, generator=gen) * (0.2 + trial), -1)
            top_p = float(torch.rand((), generator=gen)) * 0.98 + 0.01
            want = _sorted_threshold(torch.sort(probs, descending=True).values, top_p)
            got = hs.top_p_threshold(probs, top_p)
            assert got == want, (V, trial, top_p)
            assert torch.equal(hs.cut_below(probs, got), torch.where(probs >= got, probs, 0.0))


def test_top_p_threshold_of_one_likely_token():
    probs = torch.softmax(torch.cat([torch.zeros(1), torch.full((V_LONG - 1,), -100.0)]), -1)  # one candidate
    assert hs.top_p_threshold(probs, 0.9) == probs[0] == probs.max()


def test_top_p_threshold_sorts_everything_where_rounding_keeps_every_candidate():
    """top_p 1 - 1e-8 (1.0 in float32) over 2048 likely tokens whose float32 probabilities sum to under 1: every
    one above the floor is kept, and so are tokens below it (at ~e^-60), so the cut is found in the whole sorted
    vector, past the candidates."""
    V, top_p = 4096, 1 - 1e-8
    gen = torch.Generator().manual_seed(1)
    logits = torch.cat([torch.randn(V // 2, generator=gen), torch.randn(V // 2, generator=gen) - 60.0])
    probs = torch.softmax(logits, -1)
    p = probs.numpy()
    candidates = p[p >= np.float32((1 - top_p) / (2 * V))]
    assert hs._sorted_cut(candidates, top_p, whole=False) is None
    got = hs.top_p_threshold(probs, top_p)
    assert got == _sorted_threshold(torch.sort(probs, descending=True).values, top_p) and got < candidates.min()


CASES = [dict(temperature=t, top_k=k, top_p=q) for t in (0.6, 1.3) for k in (0, 7, 50) for q in (1.0, 0.95, 0.5)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "t{temperature}-k{top_k}-p{top_p}".format(**c))
def test_allowed_probabilities_equal_the_reference_on_the_cpu_route(case):
    p = SamplingParams(**case)
    gen = torch.Generator().manual_seed(0)
    for scale in (0.5, 3.0, 12.0):
        logits = torch.randn(V_CANDIDATES, generator=gen) * scale
        got, want = allowed_probs(logits, p), _ref_probs(logits, p)
        assert torch.equal(got > 0, want > 0), (scale, int((got > 0).sum()), int((want > 0).sum()))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
        if p.top_k:  # the candidates' distribution, put back in place, is the whole vocabulary's
            ids, values = hs.top_candidates(logits, p.top_k)
            torch.testing.assert_close(torch.zeros(V_CANDIDATES).index_put_((ids,), allowed_probs(values, p)), want,
                                       rtol=1e-5, atol=1e-7)


def _peaked(gen: torch.Generator) -> torch.Tensor:
    """Logits whose likely tokens sit in every block and in the tail (the draw's first step matters)."""
    logits = torch.randn(V_LONG, generator=gen) - 8.0
    hot = torch.tensor([0, 5, 1023, 1024, 2500, 3071, 4095, 4100, 4999])
    logits[hot] = torch.linspace(0.0, 2.0, len(hot))
    return logits


@pytest.mark.parametrize("case", [dict(temperature=1.0), dict(temperature=0.8, top_p=0.9),
                                  dict(temperature=0.7, top_k=5, top_p=0.95), dict(temperature=1.2, min_p=0.05)],
                         ids=str)
@pytest.mark.slow
def test_draws_follow_the_allowed_distribution(case):
    p = SamplingParams(seed=3, **case)
    logits = _peaked(torch.Generator().manual_seed(4))
    want = _ref_probs(logits, p).numpy() if not p.min_p else allowed_probs(logits, p).numpy()
    sampler, n = Sampler(p), 20000
    draws = np.bincount([int(sampler.pick(logits)) for _ in range(n)], minlength=V_LONG) / n
    assert set(np.flatnonzero(draws)) <= set(np.flatnonzero(want))  # a cut token is never drawn
    sigma = np.sqrt(want * (1 - want) / n)
    assert (np.abs(draws - want) <= 5 * sigma + 1e-4).all()


def test_a_seed_repeats_on_the_cpu_route():
    gen = torch.Generator().manual_seed(2)
    rows = [torch.randn(V_LONG, generator=gen) * 2 for _ in range(20)]
    for case in (dict(top_p=0.9), dict(top_k=20, top_p=0.8, temperature=0.7)):
        a, b = Sampler(SamplingParams(seed=11, **case)), Sampler(SamplingParams(seed=11, **case))
        first = [a(r) for r in rows]
        assert first == [b(r) for r in rows]
        assert first != [Sampler(SamplingParams(seed=12, **case))(r) for r in rows]


@pytest.mark.parametrize("case", [dict(temperature=1.0), dict(top_k=20, top_p=0.9), dict(top_p=0.5)], ids=str)
def test_degenerate_logits_still_give_a_token(case):
    """NaN logits or every token masked: a token comes back (the server's flags then end the sequence), no raise."""
    sampler = Sampler(SamplingParams(seed=0, **case))
    nan = torch.randn(V_LONG)
    nan[[7, 3000]] = float("nan")
    for logits in (torch.full((V_LONG,), float("-inf")), torch.full((V_LONG,), float("nan")), nan):
        assert 0 <= int(sampler.pick(logits)) < V_LONG
