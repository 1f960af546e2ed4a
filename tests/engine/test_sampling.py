"""Sampling on the logits' device against the straightforward torch reference it replaced (a host-side full sort):
the same allowed tokens and probabilities, draws that follow them, seeds that repeat, greedy = argmax."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.engine.sampling import Sampler, SamplingParams, _radix_threshold, _sorted_threshold, allowed_probs


def _ref_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The former host sampler's distribution: top-k by masking below the k-th logit, top-p by a full sort."""
    logits = logits.float() / p.temperature
    if p.top_k and p.top_k < logits.numel():
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=0)
        sorted_p[cum - sorted_p >= p.top_p] = 0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        probs = probs / probs.sum()
    return probs


CASES = [dict(temperature=t, top_k=k, top_p=q)
         for t in (0.6, 1.3) for k in (0, 1, 7, 50) for q in (1.0, 0.95, 0.5, 0.1)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "t{temperature}-k{top_k}-p{top_p}".format(**c))
def test_allowed_tokens_and_probabilities_equal_the_reference(case):
    p = SamplingParams(**case)
    gen = torch.Generator().manual_seed(0)
    for scale in (0.5, 3.0, 12.0):  # flat to peaked
        logits = torch.randn(3000, generator=gen) * scale
        want, got = _ref_probs(logits, p), allowed_probs(logits, p)
        assert torch.equal(got > 0, want > 0), (scale, int((got > 0).sum()), int((want > 0).sum()))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_ties_at_the_top_k_boundary_are_kept_as_the_reference_keeps_them():
    logits = torch.tensor([3.0, 2.0, 1.0, 1.0, 1.0, 0.0])
    p = SamplingParams(top_k=3)
    assert torch.equal(allowed_probs(logits, p) > 0, _ref_probs(logits, p) > 0)  # {0, 1, 2, 3, 4}


def test_radix_threshold_equals_the_sorted_one():
    gen = torch.Generator().manual_seed(1)
    for trial in range(40):
        probs = torch.softmax(torch.randn(5000, generator=gen) * (0.2 + trial), -1)
        top_p = float(torch.rand((), generator=gen)) * 0.98 + 0.01
        sorted_probs = torch.sort(probs, descending=True).values
        assert _radix_threshold(probs, top_p) == _sorted_threshold(sorted_probs, top_p), (trial, top_p)


def test_draws_follow_the_allowed_distribution():
    logits = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0, -3.0])
    p = SamplingParams(temperature=0.8, top_k=5, top_p=0.9, seed=3)
    want = _ref_probs(logits, p).numpy()
    sampler = Sampler(p)
    draws = np.bincount([sampler(logits) for _ in range(6000)], minlength=len(want)) / 6000
    assert set(np.flatnonzero(draws)) == set(np.flatnonzero(want))
    assert np.abs(draws - want).max() < 0.025  # 6000 draws: std <= 0.0065


def test_seeded_sampling_repeats_and_greedy_is_argmax():
    gen = torch.Generator().manual_seed(2)
    rows = [torch.randn(500, generator=gen) for _ in range(30)]
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=11)
    a, b = Sampler(p), Sampler(p)
    first = [a(r) for r in rows]
    assert first == [b(r) for r in rows]
    assert first != [Sampler(SamplingParams(temperature=1.0, top_p=0.9, seed=12))(r) for r in rows]
    for params in (SamplingParams(greedy=True, seed=4), SamplingParams(temperature=0.0, top_p=0.5, top_k=3)):
        assert [Sampler(params)(r) for r in rows] == [int(torch.argmax(r)) for r in rows]


def test_pick_stays_on_the_logits_device():
    token = Sampler(SamplingParams(top_p=0.8, seed=0)).pick(torch.randn(64))
    assert token.shape == () and token.dtype == torch.int64 and token.device == torch.device("cpu")


@pytest.mark.parametrize("case", [dict(top_p=0.9), dict(top_k=20, top_p=0.9), dict(temperature=0.5, top_k=3)],
                         ids=str)
def test_the_distribution_is_built_without_a_host_read(case):
    """The meta device holds no data: any read back (.item(), a data-dependent shape) would raise."""
    assert allowed_probs(torch.empty(1000, device="meta"), SamplingParams(**case)).shape == (1000,)


@pytest.mark.parametrize("min_p", [0.01, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("temperature", [0.6, 1.3])
def test_min_p_keeps_the_tokens_transformers_keeps(min_p, temperature):
    """min-p after temperature: the allowed set equals HF's TemperatureLogitsWarper then MinPLogitsWarper."""
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper

    gen = torch.Generator().manual_seed(5)
    hf_temperature, hf_min_p = TemperatureLogitsWarper(temperature), MinPLogitsWarper(min_p)
    for scale in (0.5, 3.0, 12.0):
        logits = torch.randn(3000, generator=gen) * scale
        want = hf_min_p(None, hf_temperature(None, logits[None].clone()))[0] > float("-inf")
        got = allowed_probs(logits, SamplingParams(temperature=temperature, min_p=min_p)) > 0
        assert torch.equal(got, want), (scale, int(got.sum()), int(want.sum()))
        assert 1 <= int(got.sum()) < 3000 or min_p == 0.01


def test_repetition_penalty_is_transformers_step_by_step():
    """Greedy with a penalty over the prompt and the chosen tokens: HF's RepetitionPenaltyLogitsProcessor's choices,
    on logits where the penalty changes some of them."""
    from transformers import RepetitionPenaltyLogitsProcessor

    gen = torch.Generator().manual_seed(6)
    prompt, rows = [3, 7, 7, 11], [torch.randn(40, generator=gen) * 2 for _ in range(30)]
    hf, ids, changed = RepetitionPenaltyLogitsProcessor(1.8), list(prompt), 0
    sampler = Sampler(SamplingParams(greedy=True, repetition_penalty=1.8), prompt=prompt)
    for row in rows:
        want = int(hf(torch.tensor([ids]), row[None].clone())[0].argmax())
        changed += want != int(row.argmax())
        assert sampler(row) == want
        ids.append(want)
    assert changed >= 5


def test_sampling_fields_are_checked_by_name():
    for field, value in (("min_p", -0.1), ("min_p", 1.5), ("repetition_penalty", 0.0),
                         ("repetition_penalty", float("inf"))):
        with pytest.raises(ValueError, match=f"^{field} must"):
            SamplingParams(**{field: value})


def test_presence_and_frequency_penalties_follow_the_openai_formula_step_by_step():
    """Greedy with OpenAI's penalties over the output only (logit - presence x [count > 0] - frequency x count), the
    counts kept by hand here, on rows where the penalties change some choices."""
    gen = torch.Generator().manual_seed(8)
    rows = [torch.randn(40, generator=gen) for _ in range(40)]
    sampler = Sampler(SamplingParams(greedy=True, presence_penalty=0.4, frequency_penalty=0.3), prompt=[5, 6])
    counts, changed = np.zeros(40), 0
    for row in rows:
        want = int(np.argmax(row.numpy() - 0.4 * (counts > 0) - 0.3 * counts))
        changed += want != int(row.argmax())
        assert sampler(row) == want
        counts[want] += 1
    assert changed >= 5 and counts.max() >= 2  # (the prompt's tokens carry no penalty here)


def test_logit_bias_is_transformers_sequence_bias():
    """logit_bias as HF's SequenceBiasLogitsProcessor with one-token sequences sees it, under sampling too."""
    from transformers import SequenceBiasLogitsProcessor

    bias = ((3, 100.0), (9, -100.0), (17, 2.5))
    hf = SequenceBiasLogitsProcessor({(t,): b for t, b in bias})
    gen = torch.Generator().manual_seed(9)
    greedy, hot = Sampler(SamplingParams(greedy=True, logit_bias=bias)), Sampler(SamplingParams(logit_bias=bias[1:]))
    for _ in range(10):
        row = torch.randn(40, generator=gen) * 3
        assert greedy(row) == int(hf(torch.tensor([[0]]), row[None].clone())[0].argmax()) == 3
        assert hot(row) != 9  # -100: never drawn
    assert Sampler(SamplingParams(greedy=True, logit_bias=((17, 50.0),)))(torch.zeros(40)) == 17


def test_penalty_fields_are_checked_by_name():
    for field, value in (("presence_penalty", 2.5), ("frequency_penalty", -3.0), ("logit_bias", ((1, 101.0),)),
                         ("logit_bias", ((-1, 1.0),))):
        with pytest.raises(ValueError, match=f"^{field}"):
            SamplingParams(**{field: value})
    with pytest.raises(ValueError, match="^logit_bias: token id 50 is not in the vocabulary of 40"):
        Sampler(SamplingParams(greedy=True, logit_bias=((50, 1.0),)))(torch.zeros(40))
