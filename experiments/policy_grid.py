"""The policy study's grid: the policies (each a POLICIES key with fixed options, labelled as in the report) and the
decode scenarios every (case, residency) is replayed under: one sequence at a time, continuous batching of 4 or 8
sequences (sim/continuous.py), or speculative decoding with a draft of depth 3 accepted at a = 0.6 / 0.8
(sim/speculative.py), and each batch size with each draft rate; those are the defaults, conf/study/policy.yaml sets them per run (scenarios()). Belady is replayed on each scenario's own calls: the ratio of a scenario is to its own bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from freetoken.placement import DECODE
from freetoken.trace import RoutingTrace

LOOKAHEAD_ACCURACY = 0.8  # stated assumption for the simulated early router (no hidden states in the traces)
HINTED_CONFIDENCE = 0.9  # hinted_sweep prefetches a predicted expert only when r >= this
CARRY = "carry"  # the variant of a hinted policy's rows with the drafts' carry (option carry="drafts", sim/carry.py)
BATCHES = (4, 8)  # the study's defaults; conf/study/policy.yaml sets them per run
DRAFT_DEPTH = 3
ACCEPTANCES = (0.6, 0.8)
COMBINE = True  # also each batch size with each draft rate


@dataclass(frozen=True, slots=True)
class Entry:
    """label: the results' policy column; fitted: takes the decay fitted on the profile and the profile's prior."""

    label: str
    policy: str
    options: dict = field(default_factory=dict)
    fitted: bool = False
    hint: bool = False  # reads the router hint (the simulator's noisy oracle at LOOKAHEAD_ACCURACY)


ENTRIES: tuple[Entry, ...] = (
    Entry("lru", "lru"),
    Entry("lru per_layer", "lru", {"scope": "per_layer"}),
    Entry("static_layers", "static_layers"),
    Entry("frequency", "frequency"),  # fair: every slot used, strategy=frequency on the profile
    Entry("frequency uniform", "frequency", {"strategy": "uniform"}),
    Entry("frequency front_loading", "frequency", {"strategy": "front_loading"}),
    Entry("ktransformers_dynamic", "ktransformers_dynamic", {"strategy": "frequency"}),
    Entry("moe_infinity", "moe_infinity"),
    Entry("s3fifo", "s3fifo"),
    Entry("layer_sweep", "layer_sweep", fitted=True),
    Entry("lookahead", "lookahead", {"accuracy": LOOKAHEAD_ACCURACY}, fitted=True, hint=True),
    Entry("hinted_sweep", "hinted_sweep", {"accuracy": LOOKAHEAD_ACCURACY, "min_confidence": HINTED_CONFIDENCE},
          fitted=True, hint=True),
)
BY_LABEL = {e.label: e for e in ENTRIES}
ONLINE = tuple(e.label for e in ENTRIES)
FITTED = tuple(e.label for e in ENTRIES if e.fitted)
HINTED = tuple(e.label for e in ENTRIES if e.hint)
PROFILED = ("frequency", "frequency uniform", "frequency front_loading", "ktransformers_dynamic", "moe_infinity") \
    + FITTED  # read the profile fold (counts, library or prior); the others read nothing of it


def options(entry: Entry, decay: float | None, prior) -> dict:
    return {**entry.options, "decay": decay, "prior": prior} if entry.fitted else dict(entry.options)


def params(entry: Entry, decays: list) -> str:
    fixed = " ".join(f"{k}={v}" for k, v in entry.options.items())
    if entry.fitted:
        fixed = f"decay={'/'.join(map(str, decays))} " + fixed + (" depth=1" if entry.hint else "")
    return fixed.strip() or ("small=0.1" if entry.policy == "s3fifo" else "")


@dataclass(frozen=True, slots=True)
class Scenario:
    """signal: what the scenario adds over one sequence at a time (none, batch, drafts)."""

    label: str
    signal: str = "none"
    batch: int = 1
    draft_depth: int = 0
    acceptance: float = 1.0

    def sim_fields(self) -> dict:
        return dict(batch=self.batch, draft_depth=self.draft_depth, acceptance=self.acceptance)

    @property
    def carries(self) -> bool:
        """Whether the hinted policies also run with the drafts' carry here: drafts of one sequence at a time (with a
        batch the carry is left out: the study's time)."""
        return bool(self.draft_depth) and self.batch == 1

    def applies(self, trace: RoutingTrace) -> bool:
        """Whether it changes the calls: drafts need decode tokens, a batch two sequences that decode (a batch with
        drafts both: with one sequence it is the drafts alone)."""
        decode = trace.phase == DECODE
        if self.batch > 1:
            keys = trace.request.astype(np.int64)[decode] << 32 | trace.turn.astype(np.int64)[decode]
            return len(np.unique(keys)) > 1
        if self.draft_depth:
            return bool(decode.any())
        return True


SOLO = Scenario("solo")


def check_scenarios(batches, draft_depth, acceptances, prefix: str = "") -> None:
    """The scenario settings as conf/study/policy.yaml gives them; a bad one is a ValueError naming its field."""
    def whole(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if not all(whole(b) and b >= 2 for b in batches) or len(set(batches)) != len(batches):
        raise ValueError(f"{prefix}batches: distinct whole numbers >= 2 (batch 1 is the solo scenario), got "
                         f"{list(batches)}")
    if not whole(draft_depth) or draft_depth < 0:
        raise ValueError(f"{prefix}draft_depth must be a whole number >= 0 (0: no draft scenarios), got {draft_depth!r}")
    if not all(isinstance(a, (int, float)) and not isinstance(a, bool) and 0 <= a <= 1 for a in acceptances) \
            or len(set(acceptances)) != len(acceptances):
        raise ValueError(f"{prefix}acceptances: distinct rates in [0, 1], got {list(acceptances)}")
    if acceptances and not draft_depth:
        raise ValueError(f"{prefix}acceptances need draft_depth >= 1 (got draft_depth 0 and {list(acceptances)})")


def scenarios(batches=BATCHES, draft_depth: int = DRAFT_DEPTH, acceptances=ACCEPTANCES,
              combine: bool = COMBINE) -> tuple[Scenario, ...]:
    """Solo, continuous batching at each batch size, a draft of draft_depth at each acceptance, and (combine) each
    batch size with each draft rate: every sequence of the batch verifies its drafts in the step's one call."""
    check_scenarios(batches, draft_depth, acceptances)
    drafts = [Scenario(f"draft {draft_depth} a={a}", "drafts", draft_depth=draft_depth, acceptance=a)
              for a in acceptances]
    both = [Scenario(f"batch {b} {d.label}", "batch + drafts", batch=b, draft_depth=draft_depth,
                     acceptance=d.acceptance) for b in batches for d in drafts] if combine else []
    return (SOLO, *(Scenario(f"batch {b}", "batch", batch=b) for b in batches), *drafts, *both)


def drafts_of(label: str) -> str:
    """The drafts part of a scenario label ("batch 4 draft 3 a=0.8" -> "draft 3 a=0.8"; "" without drafts)."""
    i = label.find("draft ")
    return label[i:] if i >= 0 else ""


def draft_depth_rate(label: str) -> tuple[int, str] | None:
    """(depth, rate as written) of a scenario label's drafts ("batch 4 draft 3 a=0.8" -> (3, "0.8")); None without."""
    drafts = drafts_of(label)
    if not drafts:
        return None
    depth, _, rate = drafts.removeprefix("draft ").partition(" a=")
    return int(depth), rate


def scenario_order(label: str) -> tuple:
    """Sort key of a scenario label as scenarios() orders them: solo, batches by size, drafts by depth and rate,
    then batches with drafts."""
    if label == SOLO.label:
        return (0,)
    drafts = draft_depth_rate(label)
    draft_key = (drafts[0], float(drafts[1])) if drafts else ()
    if label.startswith("batch "):
        size = int(label.split()[1])
        return (3, size, *draft_key) if drafts else (1, size)
    return (2, *draft_key)


SCENARIOS: tuple[Scenario, ...] = scenarios()
BY_SCENARIO = {s.label: s for s in SCENARIOS}
