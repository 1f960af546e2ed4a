"""Cache anchors through the server for the models whose state cannot be cut back: a tiny character-level
Qwen3.5-MoE (a Gated DeltaNet layer and a gated-attention layer: recurrent state) and DeepSeek-V4 (a compressed sparse
and a heavily compressed layer: the compressors' open windows; its pieces carry the compressed entries closing inside
them). The prefix cache keeps state snapshots at message boundaries and at each sequence's end; the next turn resumes
from the deepest one its prompt shares. Reference: the engine alone on the whole prompt with an empty cache (cold)."""

from __future__ import annotations

import pytest

from conftest import openai_client, reference_engine, running
from test_prefix_reuse import CONVO, EDITED, ask, cold, naive_lcp, prefix_stats, render, second_turn
from tinymodel import write_tiny_model


@pytest.fixture(scope="module", params=["qwen3_5_moe", "deepseek_v4"])
def hybrid_dir(request, tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp(request.param) / f"tiny-{request.param}", kind=request.param)


@pytest.fixture(scope="module")
def hybrid_served(hybrid_dir):
    with running(hybrid_dir, max_running=1) as s:
        yield s


@pytest.fixture(scope="module")
def hybrid_engine(hybrid_dir):
    return reference_engine(hybrid_dir)


@pytest.fixture(scope="module")
def client(hybrid_served):
    return openai_client(hybrid_served.url)


def test_the_model_is_what_it_claims(hybrid_served):
    cfg = hybrid_served[1].backend.engine.config
    if cfg.v4 is not None:
        assert cfg.v4.kinds == ("csa", "hca")
    else:
        assert cfg.linear_attention.layers == (0,) and cfg.attention_layers == (1,)


def test_second_turn_prefills_only_the_new_tokens(client, hybrid_served, hybrid_engine):
    """All of turn 1's tokens are reused: the recurrent state at turn 1's end was kept."""
    _, before, after, _ = second_turn(client, hybrid_served.model_id, hybrid_served.service, hybrid_engine)
    assert after["anchor_hits"] - before["anchor_hits"] == 1
    assert after["snapshot_hits"] - before["snapshot_hits"] == 1  # resumed from the recurrent state kept there


def test_an_edit_resumes_from_the_anchor_before_it(client, hybrid_served, hybrid_engine):
    """KV could be reused up to the edit, but the recurrent state exists only at anchors: the reuse falls back to
    the system message's end, and the answer still equals a cold run."""
    service, model_id = hybrid_served.service, hybrid_served.model_id
    ask(client, model_id, CONVO, max_tokens=2)
    ids, text, _ = cold(hybrid_engine, EDITED, 3)
    before = prefix_stats(service)
    r = ask(client, model_id, EDITED, max_tokens=3)
    after = prefix_stats(service)
    system_end = len(render(hybrid_engine, CONVO[:1], False))
    assert system_end < naive_lcp(render(hybrid_engine, CONVO, True), ids)  # the KV prefix reaches past the anchor
    assert after["reused_tokens"] - before["reused_tokens"] == system_end
    assert after["computed_tokens"] - before["computed_tokens"] == len(ids) - system_end
    assert r.choices[0].message.content == text


@pytest.mark.parametrize("kind", ["qwen3_5_moe", "deepseek_v4"])
def test_hf_backend_serves_a_hybrid_model_without_a_prefix_cache(tmp_path, kind):
    """transformers' cache of a hybrid model cannot be cut into KV pieces: the HF backend runs it uncached, and its
    greedy answer is the engine's."""
    from freetoken.engine import SamplingParams
    from freetoken.serve.chat import Params, Prompt
    from freetoken.serve.decoding import Decoder
    from freetoken.serve.hf_backend import HFBackend
    from freetoken.placement.memory import ModelMemory, plan_memory

    hybrid_dir = write_tiny_model(tmp_path / "tiny-hybrid", kind=kind)
    hybrid_engine = reference_engine(hybrid_dir)
    backend = HFBackend(hybrid_dir, "tiny-hybrid")
    backend.use_plan(plan_memory(ModelMemory(0, 1, 1, 1, 0, 64), 10**6, kv_floor=64))
    assert backend.prefix_cache is None
    ids, _, out = cold(hybrid_engine, [{"role": "user", "content": "hi there"}], 4)
    gen = backend.generate(Prompt(ids, []), Decoder(Params(max_tokens=4), SamplingParams(greedy=True)), 4)
    got = [t for _, t in zip(range(4), gen)]
    gen.close()
    assert got == out[:len(got)]
