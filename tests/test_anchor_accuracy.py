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


def test_freetoken_prefill_meets_the_papers_own_figures():
    """sim.paper_checks: Qwen3.6-35B-A3B bf16 on the paper's RTX 5090 (52.7 GB/s), FreeToken 0.1.2's prefill
    settings. An 8192-token chunk is copy-bound: 40 layers x 256 experts x 3 x 2048 x 512 x 2 bytes = 64.4 GB at
    52.7 GB/s = 1.2225 s (hand-derived), which the prediction stays within 2% of; both figures within the goal."""
    from freetoken.sim.paper_checks import predict_checks

    checks = predict_checks()
    chunk = next(c for c in checks if c.metric == "chunk_s")
    assert chunk.predicted == pytest.approx(40 * 256 * 3 * 2048 * 512 * 2 / 52.7e9, rel=0.02)
    for check in checks:
        assert abs(check.error) <= anchors.TARGET, (check.what, check.predicted, check.low, check.high)
