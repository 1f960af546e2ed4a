"""The engine thread's pieces: a prompt prefilled one chunk per step (no token until the last chunk) gives the
tokens of the engine's own chunked generate."""

from __future__ import annotations

from conftest import reference_engine


def test_chunked_prefill_yields_after_the_last_chunk_the_engines_tokens(tiny_model_dir):
    from freetoken.engine import SamplingParams
    from freetoken.serve.chat import Params, Prompt
    from freetoken.serve.decoding import Decoder
    from freetoken.serve.engine_backend import EngineSequence
    from freetoken.serve.generation import CachedGeneration

    engine = reference_engine(tiny_model_dir, device="cpu", prefill_chunk=3)
    prompt = list(range(5, 16))  # 11 tokens: chunks of 3, 3, 3, 2
    expect = list(engine.generate(prompt, SamplingParams(greedy=True), max_tokens=5, stop_token_ids=[]))
    greedy = SamplingParams(greedy=True)
    gen = CachedGeneration(EngineSequence(engine, 7, 16), None, Prompt(prompt, []), Decoder(Params(), greedy), 5,
                           set(), prefill_chunk=3)
    chunks = [next(gen) for _ in range(3)]
    assert chunks == [None] * 3 and not gen.started and gen.seq.length == 9
    assert [next(gen) for _ in range(5)] == expect
    assert gen.finished and gen.seq.length == len(prompt) + 4
