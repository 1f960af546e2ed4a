"""Miss splits against hand-derived numbers."""

import pytest

from freetoken.placement import Split, balanced_fetch_count, paper_fetch_count


@pytest.mark.parametrize(
    "m, bp, bh, q",
    [
        # RTX 5090 desktop (paper): BP 52.7, BH 77.3. m*BP/(BP+BH) = 8*52.7/130 = 3.243 -> q in {3, 4}:
        # max(3/52.7, 5/77.3) = max(.0569, .0647) = .0647; max(4/52.7, 4/77.3) = .0759 -> 3
        (8, 52.7, 77.3, 3),
        # equal lanes: m/2 exactly
        (8, 50.0, 50.0, 4),
        # RTX 4060 laptop: 11.8 vs 47.5 -> 8*11.8/59.3 = 1.59: q=1: max(.0847, 7/47.5=.1474)=.1474; q=2: max(.1695, .1263)=.1695 -> 1
        (8, 11.8, 47.5, 1),
        # PCIe much faster than host: 6*100/110 = 5.45 -> q=5: max(.05, .1) = .1; q=6: max(.06, 0) = .06 -> 6
        (6, 100.0, 10.0, 6),
        (0, 50.0, 50.0, 0),
        (1, 50.0, 50.0, 0),  # tie max(0, 1/50) vs max(1/50, 0): the smaller q wins
    ],
)
def test_balanced_rule(m, bp, bh, q):
    assert balanced_fetch_count(m, bp, bh) == q
    assert Split("hybrid", "balanced", bp, bh).fetch_count(m) == q


def test_balanced_rule_is_the_integer_argmin():
    for m in range(0, 13):
        for bp, bh in [(52.7, 77.3), (11.8, 47.5), (56.0, 63.6), (3.0, 90.0), (60.0, 40.0), (100.0, 10.0)]:
            costs = [max(q / bp, (m - q) / bh) for q in range(m + 1)]
            best = min(range(m + 1), key=lambda q: (costs[q], q))
            assert balanced_fetch_count(m, bp, bh) == best


@pytest.mark.parametrize(
    "m, bp, bh, q",
    [
        (8, 52.7, 77.3, 5),  # 8 * 52.7 / 77.3 = 5.45 -> 5
        (8, 56.0, 63.6, 7),  # 8 * 0.8805 = 7.04 -> 7
        (8, 11.8, 47.5, 2),  # 1.99 -> 2
        (8, 90.0, 45.0, 8),  # 16 clipped to m
        (1, 1.0, 3.0, 0),  # 0.33 -> 0: every miss on the CPU
    ],
)
def test_paper_rule(m, bp, bh, q):
    assert paper_fetch_count(m, bp, bh) == q
    assert Split("hybrid", "paper", bp, bh).fetch_count(m) == q


def test_offload_cpu_and_cap():
    assert Split("offload").fetch_count(7) == 7
    assert Split("cpu").fetch_count(7) == 0
    assert Split("hybrid", "max_fetch", max_fetch=3).fetch_count(7) == 3
    assert Split("hybrid", "max_fetch", max_fetch=3).fetch_count(2) == 2
    assert Split("hybrid", "max_fetch", max_fetch=1).fetch_count(7) == 1  # the smallest cap


def test_a_field_the_split_does_not_read_is_refused():
    from freetoken.placement.config import ConfigError

    Split("hybrid", "balanced", 1.0, 2.0).check_used()  # every field read (or at its default)
    Split("hybrid", "max_fetch", max_fetch=2).check_used()
    Split("cpu").check_used()
    with pytest.raises(ConfigError, match="max_fetch"):
        Split("hybrid", "balanced", 1.0, 2.0, max_fetch=2).check_used()
    with pytest.raises(ConfigError, match="bh"):
        Split("cpu", bh=2.0).check_used()


def test_small_bandwidths_are_valid():
    assert Split("hybrid", "balanced", 0.5, 0.25).fetch_count(3) == 2  # 3 x 0.5 / 0.75 = 2: max(4, 4) beats max(2, 8)
    assert Split("hybrid", "paper", 0.5, 0.25).fetch_count(3) == 3  # 6 clipped to 3


def test_big_batches_fetch_every_miss_from_the_threshold_on():
    # llama.cpp copies CPU-held experts to the GPU for a batch of at least fetch_min_pairs (token, expert) pairs
    split = Split("cpu", fetch_min_pairs=32)
    assert split.choose([3, 5], [16, 16], [0, 0]) == {0, 1}  # 32 pairs: at the threshold
    assert split.choose([3, 5], [16, 15], [0, 0]) == set()  # 31: below it


def test_fetch_order_is_a_named_choice():
    experts, tokens, last_use = [5, 2, 9, 4], [1, 7, 7, 3], [10, 40, 20, 30]
    cap2 = dict(mode="hybrid", rule="max_fetch", max_fetch=2)
    assert Split(**cap2, fetch_order="most_tokens").choose(experts, tokens, last_use) == {1, 2}  # 7, 7 tokens
    assert Split(**cap2, fetch_order="most_recent").choose(experts, tokens, last_use) == {1, 3}  # clocks 40, 30
    assert Split(**cap2, fetch_order="lowest_id").choose(experts, tokens, last_use) == {1, 3}  # ids 2, 4
    one = dict(mode="hybrid", rule="max_fetch", max_fetch=1)
    assert Split(**one).choose(experts, tokens, last_use) == {1}  # 7 tokens, the lower id of the two


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(mode="fast"), "mode"),
        (dict(mode="hybrid", rule="magic", bp=1, bh=1), "rule"),
        (dict(mode="hybrid", bp=0, bh=10), "bp"),
        (dict(mode="hybrid", bp=10, bh=0), "bh"),
        (dict(mode="hybrid", rule="max_fetch", max_fetch=-1), "max_fetch"),
        (dict(mode="hybrid", rule="max_fetch", max_fetch=0), "max_fetch"),
        (dict(fetch_order="random"), "fetch_order"),
    ],
)
def test_bad_split_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Split(**kwargs)
