"""Miss splits: of m missing experts, how many to fetch over PCIe and which; the rest run on the CPU.

A split is independent of residency, so every policy combines with every split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

# Which missing experts get fetched first, given (expert ids, token counts, last-use clock per expert).
FetchOrder = Callable[[Sequence[int], Sequence[int], Sequence[int]], list[int]]


def _lowest_id(experts, tokens, last_use) -> list[int]:
    return sorted(range(len(experts)), key=lambda i: experts[i])


def _most_recent(experts, tokens, last_use) -> list[int]:
    return sorted(range(len(experts)), key=lambda i: (-last_use[i], experts[i]))


def _most_tokens(experts, tokens, last_use) -> list[int]:
    return sorted(range(len(experts)), key=lambda i: (-tokens[i], experts[i]))


FETCH_ORDERS: dict[str, FetchOrder] = {
    "most_tokens": _most_tokens,  # prefill: move the experts with the most work to the fast lane
    "most_recent": _most_recent,  # most recently used first
    "lowest_id": _lowest_id,
}


def balanced_fetch_count(m: int, bp: float, bh: float) -> int:
    """argmin over integer q in [0, m] of max(q / BP, (m - q) / BH): both lanes finish together.

    The continuous optimum is q = m * BP / (BP + BH); the integer optimum is its floor or ceiling.
    Ties go to the smaller q (fewer PCIe transfers, less cache churn).
    """
    if m <= 0:
        return 0
    x = m * bp / (bp + bh)
    best = None
    for q in {max(0, min(m, math.floor(x))), max(0, min(m, math.ceil(x)))}:
        cost = max(q / bp, (m - q) / bh)
        if best is None or cost < best[0] or (cost == best[0] and q < best[1]):
            best = (cost, q)
    return best[1]


def paper_fetch_count(m: int, bp: float, bh: float) -> int:
    """The form quoted with FreeToken, q* = m * BP / BH, rounded and clipped to [0, m]."""
    return max(0, min(m, round(m * bp / bh)))


@dataclass(frozen=True, slots=True)
class Split:
    """mode: offload (fetch all) | cpu (fetch none) | hybrid (rule: balanced | paper | max_fetch).

    bp, bh: pinned PCIe and host expert-processing bandwidths (GB/s) for the hybrid rules.
    fetch_min_pairs: when > 0, a call whose missing experts carry at least this many (token, expert) pairs
    fetches them all, whatever the mode (llama.cpp copies CPU-held weights to the GPU for big batches).
    admit_prefill: False = prefill fetches stream through staging buffers (the double buffer of layer l+1) and
    leave the cache as decode left it; True = they are offered a cache slot like decode fetches.
    """

    mode: str = "offload"
    rule: str = "balanced"
    bp: float = 0.0
    bh: float = 0.0
    max_fetch: int = 0
    fetch_order: str = "most_tokens"
    fetch_min_pairs: int = 0
    admit_prefill: bool = True

    def __post_init__(self) -> None:
        if self.fetch_min_pairs < 0:
            raise ValueError(f"split fetch_min_pairs must be >= 0, got {self.fetch_min_pairs}")
        if self.mode not in ("offload", "cpu", "hybrid"):
            raise ValueError(f"split mode {self.mode!r} is not one of offload, cpu, hybrid")
        if self.fetch_order not in FETCH_ORDERS:
            raise ValueError(f"split fetch_order {self.fetch_order!r} is not one of {', '.join(FETCH_ORDERS)}")
        if self.mode == "hybrid":
            from freetoken.placement.config import ConfigError  # (the error worded as each entry point spells it)

            if self.rule not in ("balanced", "paper", "max_fetch"):
                raise ValueError(f"split rule {self.rule!r} is not one of balanced, paper, max_fetch")
            if self.rule == "max_fetch" and self.max_fetch < 1:  # 0 would quietly send every miss to the CPU
                raise ConfigError("{rule} max_fetch needs {max_fetch} >= 1, got {v}; {mode} cpu sends every miss to "
                                  "the CPU", v=self.max_fetch)
            if self.rule != "max_fetch" and not (self.bp > 0 and self.bh > 0):
                raise ConfigError("{mode} hybrid needs {bp} > 0 and {bh} > 0 (GB/s: the pinned PCIe and host expert "
                                  "lane bandwidths; `ft bench bw` measures both), got {bp} {p}, {bh} {h}",
                                  p=self.bp, h=self.bh)

    def check_used(self) -> None:
        """A field set away from its default that this mode / rule never reads is an error (CacheConfig calls this;
        the error words the field as the entry point spells it: --bp, split.bp)."""
        from freetoken.placement.config import ConfigError

        hybrid_only = {"rule": "balanced", "bp": 0.0, "bh": 0.0, "max_fetch": 0}
        if self.mode != "hybrid":
            for f, default in hybrid_only.items():
                if getattr(self, f) != default:
                    raise ConfigError("{%s} does nothing for {mode} {m} (hybrid only)" % f, m=self.mode)
        elif self.rule != "max_fetch" and self.max_fetch != 0:
            raise ConfigError("{max_fetch} does nothing for {rule} {r} (max_fetch only)", r=self.rule)

    def fetch_count(self, m: int) -> int:
        if self.mode == "offload":
            return m
        if self.mode == "cpu":
            return 0
        if self.rule == "balanced":
            return balanced_fetch_count(m, self.bp, self.bh)
        if self.rule == "paper":
            return paper_fetch_count(m, self.bp, self.bh)
        return min(m, self.max_fetch)

    def choose(self, experts: list[int], tokens: list[int], last_use: list[int]) -> set[int]:
        """Indices (into experts) of the missing experts to fetch."""
        if self.fetch_min_pairs and sum(tokens) >= self.fetch_min_pairs:
            return set(range(len(experts)))
        q = self.fetch_count(len(experts))
        if q == len(experts):
            return set(range(q))
        if q == 0:
            return set()
        return set(FETCH_ORDERS[self.fetch_order](experts, tokens, last_use)[:q])


SPLITS = ("offload", "cpu", "hybrid")
