"""Model-free drafting (prompt lookup / n-gram): propose the next tokens by matching the context's last n tokens
against an earlier place in the context and copying what followed there (HF's prompt_lookup_num_tokens, vLLM's
ngram proposer). The engine verifies a draft of d tokens in one forward of d + 1 tokens: under greedy decoding the
longest prefix the model itself would have chosen is kept, plus the model's own next token, so the output is
exactly plain greedy decoding's. The verify call routes d + 1 tokens: the draft's experts ride in that one call.
generate_drafted is the engine's loop for it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from freetoken.placement.call import DECODE
from freetoken.placement.callstream import make_call

DRAFTERS = ("ngram",)


@dataclass(frozen=True, slots=True)
class DraftConfig:
    """depth: tokens drafted per step (d; the verify forward carries d + 1); max_ngram / min_ngram: the lengths of
    the context suffix tried for a match, longest first."""

    method: str = "ngram"
    depth: int = 4
    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self) -> None:
        if self.method not in DRAFTERS:
            raise ValueError(f"draft: unknown method {self.method!r}; valid: {', '.join(DRAFTERS)}")
        if not (isinstance(self.depth, int) and self.depth >= 1):
            raise ValueError(f"draft depth must be a whole number >= 1, got {self.depth!r}")
        if not (isinstance(self.min_ngram, int) and 1 <= self.min_ngram <= self.max_ngram):
            raise ValueError(f"draft n-gram lengths must satisfy 1 <= min_ngram <= max_ngram, got "
                             f"{self.min_ngram}, {self.max_ngram}")


def ngram_draft(context: list[int], depth: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to `depth` tokens that followed the latest earlier occurrence of the context's last n tokens (n from
    max_ngram down to min_ngram); [] when no suffix recurs."""
    T = len(context)
    for n in range(min(max_ngram, T - 1), min_ngram - 1, -1):
        suffix = context[T - n:]
        for start in range(T - n - 1, -1, -1):  # the latest earlier match first
            if context[start:start + n] == suffix:
                return context[start + n:start + n + depth]
    return []


@dataclass(slots=True)
class DraftStats:
    """verify_steps: verify forwards; drafted / accepted: draft tokens proposed / kept (acceptance = their ratio).
    carry_used / carry_named: per layer, the experts of a verify forward that had a carry (the rejected drafts'
    experts of the verify forward before, sim/carry.py), and those the carry named (carry_accuracy = their ratio)."""

    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    carry_used: int = 0
    carry_named: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def carry_accuracy(self) -> float:
        return self.carry_named / self.carry_used if self.carry_used else 0.0

    def tally_carry(self, carried: list[list[int]] | None, experts: np.ndarray) -> None:
        """Score the carry of the forward before against this verify forward's experts [T, L, K], layer by layer."""
        for layer, named in enumerate(carried or []):
            if named:
                used = set(experts[:, layer].ravel().tolist())
                self.carry_used += len(used)
                self.carry_named += len(used & set(named))


def rejected_experts(experts: np.ndarray, marks: list[int]) -> list[list[int]]:
    """experts [T, L, K] of a verify forward, marks [T] (2: a rejected draft) -> per layer its rejected drafts'
    experts, merged as a call merges its tokens' (first use order, sim/carry.py's order): the carry into the next
    verify forward."""
    rows = experts[np.asarray(marks) == 2]  # [R, L, K]
    if not len(rows):
        return [[] for _ in range(experts.shape[1])]
    return [make_call(layer, rows[:, layer], DECODE).experts for layer in range(experts.shape[1])]


def accepted_prefix(draft: list[int], chosen: list[int]) -> int:
    """How many leading draft tokens equal the model's own choices (chosen[i]: its token after draft[:i])."""
    n = 0
    while n < len(draft) and draft[n] == chosen[n]:
        n += 1
    return n


def generate_drafted(engine, prompt, start, kv, sampler, max_tokens, stops, request, turn,
                     draft: DraftConfig) -> Iterator[int]:
    """Engine.generate with a draft: greedy decoding in verify steps, the last token and up to d drafted ones in one
    forward; the drafts the model agrees with are kept, then its own next token. Rejected drafts leave the KV cache;
    their routing stays in the trace (field draft = 2), as the verify call routed them."""
    carry = engine.cache.carry  # the policy's live carry (carry="drafts"), else None
    if carry is not None:
        carry.set(None)  # prefill carries nothing
    token = sampler(engine.prefill(prompt, kv, start, request, turn)[-1])
    n = 1
    yield token
    carried = None  # per layer: the last verify forward's rejected drafts' experts (a sequence's first: none)
    E = engine.config.num_experts
    while token not in stops and n < max_tokens:
        t0 = time.perf_counter()
        proposal = ngram_draft(kv.tokens + [token], min(draft.depth, max_tokens - n - 1), draft.max_ngram,
                               draft.min_ngram)
        if carry is not None:
            carry.set([[layer * E + e for e in ids] for layer, ids in enumerate(carried)] if carried else None)
        logits = engine.forward([token] + proposal, kv, kv.length, DECODE, request, turn, all_logits=True)
        if carry is not None:
            carry.set(None)  # only this verify forward reads it
        chosen = [sampler(row) for row in logits]  # [1 + d]: the model's token after each prefix
        kept = accepted_prefix(proposal, chosen)
        kv.truncate(kv.length - (len(proposal) - kept))
        st = engine.draft_stats
        marks = [0] + [1] * kept + [2] * (len(proposal) - kept)
        if engine.recorder is not None:
            engine.recorder.mark_draft(marks)
        experts = engine.last_routing()  # [1 + d, L, K], None: not kept
        if experts is not None:
            st.tally_carry(carried, experts)
            carried = rejected_experts(experts, marks)
        st.verify_steps, st.drafted, st.accepted = st.verify_steps + 1, st.drafted + len(proposal), st.accepted + kept
        engine.settle()
        engine.stats.decode_tokens += kept + 1
        engine.stats.decode_s += time.perf_counter() - t0
        for j, token in enumerate(chosen[:kept + 1]):
            n += 1
            yield token
            if token in stops or n == max_tokens:
                kv.truncate(kv.length - (kept - j))  # hold what plain decoding would: all but the last token
                return
