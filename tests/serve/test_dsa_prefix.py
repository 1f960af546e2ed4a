"""GLM-5 (DeepSeek sparse attention) behind the prefix cache: a piece carries the indexer keys of its positions
beside their KV, so a turn that reuses the previous one's prefix picks the same keys as a cold run (index_topk 4,
far below the conversation's length) and answers the same."""

from __future__ import annotations

import pytest

from conftest import openai_client, reference_engine, running
from test_prefix_reuse import second_turn
from tinymodel import write_tiny_model


@pytest.fixture(scope="module")
def dsa_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("dsa") / "tiny-dsa", kind="glm_moe_dsa")


def test_second_turn_reuses_the_prefix_and_equals_a_cold_run(dsa_dir):
    with running(dsa_dir, max_running=1) as served:
        engine = reference_engine(dsa_dir)
        assert engine.config.dsa.index_topk == 4
        second_turn(openai_client(served.url), served.model_id, served.service, engine)
