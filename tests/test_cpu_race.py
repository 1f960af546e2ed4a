"""Interleaved best-of-N timing (freetoken/calibrate/cpu_race.py) with scripted contenders and a fake clock: the
order the sides run in, what the warm-up leaves out, which run counts, and what the probes record."""

from __future__ import annotations

import pytest

from freetoken.calibrate.cpu_race import Sample, matching_prefix, race, rotation, time_generation


class Scripted:
    """A contender whose runs return the samples given, in turn; records into a shared log."""

    def __init__(self, name: str, samples: list[Sample], log: list[str]):
        self.name, self.samples, self.log = name, list(samples), log

    def run(self) -> Sample:
        self.log.append(self.name)
        return self.samples.pop(0)


def s(prefill: float, decode: float, tokens=(1, 2, 3)) -> Sample:
    return Sample(prefill, decode, tuple(tokens))


def test_rounds_rotate_so_no_side_always_runs_first():
    assert [rotation(3, r) for r in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    log: list[str] = []
    a = Scripted("a", [s(9, 9)] + [s(1, 1)] * 3, log)
    b = Scripted("b", [s(9, 9)] + [s(1, 1)] * 3, log)
    c = Scripted("c", [s(9, 9)] + [s(1, 1)] * 3, log)
    result = race([a, b, c], reps=3, warmup=1)
    assert log == result.order == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]


def test_the_warm_up_is_not_timed_and_each_phase_keeps_its_fastest_run():
    log: list[str] = []
    # warm-up 0.01 s would win if it counted; the fastest prefill and the fastest decode come from different runs
    fast = Scripted("ft", [s(0.01, 0.01), s(3.0, 2.0), s(2.0, 5.0), s(4.0, 1.5)], log)
    slow = Scripted("hf", [s(0.01, 0.01), s(6.0, 4.0), s(5.0, 4.5), s(7.0, 3.0)], log)
    result = race([fast, slow], reps=3, warmup=1)
    ft, hf = result.tallies["ft"], result.tallies["hf"]
    assert (ft.best_prefill_s, ft.best_decode_s) == (2.0, 1.5)
    assert (hf.best_prefill_s, hf.best_decode_s) == (5.0, 3.0)
    assert (ft.median_prefill_s, ft.median_decode_s) == (3.0, 2.0)
    assert len(ft.samples) == 3 and ft.stable


def test_a_load_spike_on_one_round_does_not_decide_the_verdict():
    """Round 2 runs both sides 10x slower (another process took the cores): sequential runs that put all of one
    side's runs in the spike would flip the ratio; interleaved best-of-N keeps it."""
    log: list[str] = []
    a = Scripted("a", [s(1, 1), s(1.0, 1.0), s(10.0, 10.0), s(1.1, 1.0)], log)
    b = Scripted("b", [s(1, 1), s(2.0, 2.0), s(20.0, 20.0), s(2.0, 2.1)], log)
    result = race([a, b], reps=3)
    assert result.tallies["b"].best_decode_s / result.tallies["a"].best_decode_s == pytest.approx(2.0)


def test_probes_run_once_per_timed_round_and_keep_the_best():
    log: list[str] = []
    readings = iter([5.0, 9.0, 7.0])

    def probe():
        log.append("probe")
        return next(readings)

    a = Scripted("a", [s(1, 1)] * 4, log)
    result = race([a], reps=3, warmup=1, probes={"t1": probe})
    assert log == ["a", "probe", "a", "probe", "a", "probe", "a"]
    assert result.probes == {"t1": [5.0, 9.0, 7.0]} and result.best_probe("t1") == 9.0


def test_unstable_tokens_are_flagged_and_prefixes_compared():
    log: list[str] = []
    a = Scripted("a", [s(1, 1, (1, 2, 3)), s(1, 1, (1, 2, 4))], log)
    assert not race([a], reps=2, warmup=0).tallies["a"].stable
    assert matching_prefix((1, 2, 3, 4), (1, 2, 5, 4)) == 2
    assert matching_prefix((), (1,)) == 0 and matching_prefix((7, 8), (7, 8)) == 2


def test_bad_races_are_refused():
    with pytest.raises(ValueError, match="reps must be positive"):
        race([], reps=0)
    log: list[str] = []
    with pytest.raises(ValueError, match="names must differ"):
        race([Scripted("a", [], log), Scripted("a", [], log)], reps=1)


def test_time_generation_splits_prefill_and_decode_on_the_clock():
    ticks = iter([10.0, 10.5, 13.5])  # start, after prefill, after the decode steps
    calls = []

    def step(t: int) -> int:
        calls.append(t)
        return t + 1

    sample = time_generation(lambda: 7, step, 3, clock=lambda: next(ticks))
    assert sample == Sample(0.5, 3.0, (7, 8, 9, 10)) and calls == [7, 8, 9]
