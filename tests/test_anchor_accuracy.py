"""The accuracy goal: every seed cell within 25% of its published value (sim.anchors.TARGET), with physical inputs
and the settings each row names. The cells this version misses are strict expected failures, each with its reason
in sim.anchors.NOTES (docs/anchors.md shows why and the band); a miss that starts to meet the goal fails until it
is taken off sim.anchors.MISSES. Regression pins are a separate thing (tests/test_anchors.py)."""

import pytest

from freetoken.sim import anchors

CELL_IDS = [(label, metric) for label in anchors.PINS_LABELS for metric in ("decode_tok_s", "prefill_tok_s")]


@pytest.mark.parametrize("label, metric", [
    pytest.param(label, metric, id=f"{label} {metric}",
                 marks=[pytest.mark.xfail(strict=True, reason=anchors.NOTES[(label, metric)][0])]
                 if (label, metric) in anchors.MISSES else [])
    for label, metric in CELL_IDS])
def test_cell_is_within_the_accuracy_goal(anchor_cells, label, metric):
    cell = next(c for c in anchor_cells if (c.label, c.metric) == (label, metric))
    assert abs(cell.error) <= anchors.TARGET, (f"{label} {metric}: predicted {cell.predicted:.1f}, published "
                                               f"{cell.published}, error {cell.error:+.0%}")


def test_every_miss_is_explained():
    assert anchors.MISSES <= set(anchors.NOTES)
