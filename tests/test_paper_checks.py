"""sim.paper_checks' arithmetic and doc rows on hand-made values (the predictions themselves:
tests/test_anchor_accuracy.py)."""

import pytest

from freetoken.sim.paper_checks import DecodeFigure, PaperCheck, render_section


@pytest.mark.parametrize("predicted, error", [(1.20, 0.0), (1.25, 1.25 / 1.22 - 1), (1.10, 1.10 / 1.19 - 1)])
def test_error_is_the_distance_to_the_published_range(predicted, error):
    check = PaperCheck("chunk", 8192, "chunk_s", 1.19, 1.22, predicted)
    assert check.error == pytest.approx(error, abs=1e-12)


def test_decode_rows_show_the_band_and_say_which_figures_lie_above_it():
    above = DecodeFigure("m", None, 77.0, 83.0, {"pinned": 50.0, "uniform": 20.0, "granite decode": 60.0})
    inside = DecodeFigure("n", "mxfp4", 22.0, 25.0, {"pinned": 23.0, "uniform": 10.0, "granite decode": 30.0})
    text = "\n".join(render_section([PaperCheck("chunk", 8192, "chunk_s", 1.19, 1.22, 1.23)], [above, inside]))
    assert "| m (bf16) | 77 .. 83 | 50.0 | 20.0 .. 60.0 | -35% |" in text  # 50 / 77 - 1
    assert "| n (mxfp4) | 22 .. 25 | 23.0 | 10.0 .. 30.0 | +0% |" in text
    assert "| one" not in text and "| chunk | 1.19 .. 1.22 | 1.23 | +1% |" in text
    assert "m lies above every locality's prediction" in text and "n lies" not in text
