"""Sim = live under continuous batching: the server's engine thread runs 4 requests together (chunked prefills
between decode steps, batched decode calls over the union of their experts), and `ft sim --batch 4`'s replay of
the routing it recorded makes exactly the live Plans (LRU, S3-FIFO, static layers)."""

from __future__ import annotations

import threading

import pytest

from freetoken.sim.continuous import batched_calls
from freetoken.sim.replay import replay

PROMPTS = [[5, 9, 14, 20, 33, 41, 7], [8, 8, 3], [11, 12, 13, 14, 15], [30, 2, 60, 61]]
MAX_NEW = [6, 3, 8, 5]
CHUNK = 3


def live_batched(model_dir, policy: str, capacity: int, outputs: bool = False):
    """4 requests through the production scheduler over an engine that records routing and keeps its Plans ->
    (engine, decode batch sizes) and, with outputs, each request's generated ids."""
    from freetoken.engine import CacheConfig, Engine, SamplingParams
    from freetoken.serve.chat import Params, Prompt
    from freetoken.serve.decoding import Decoder
    from freetoken.serve.engine_backend import EngineBackend
    from freetoken.serve.scheduler import END, Job, Scheduler

    backend = EngineBackend(model_dir, "tiny")
    backend.engine = Engine(backend.ckpt, CacheConfig(policy, capacity=capacity), kernels="reference",
                            device="cpu", prefill_chunk=CHUNK, keep_plans=True, tokenizer=backend.tokenizer)
    batch_sizes, done, out = [], threading.Semaphore(0), [[] for _ in PROMPTS]
    scheduler = Scheduler(backend, batch_sizes.append)
    jobs = []
    for i, (prompt, n) in enumerate(zip(PROMPTS, MAX_NEW)):
        decoder = Decoder(Params(), SamplingParams(greedy=True))
        gen = backend.generate(Prompt(prompt, []), decoder, n)
        gen.stop_token_ids = set()  # every request runs its max_new tokens
        jobs.append(Job(gen, lambda item, i=i: out[i].append(item), lambda: None, threading.Event(), done.release))
    scheduler.submit(*jobs)
    for _ in jobs:
        assert done.acquire(timeout=60)
    scheduler.shutdown()
    assert all(o[-1] is END and len(o) == n + 1 for o, n in zip(out, MAX_NEW))
    if outputs:
        return backend.engine, batch_sizes, [_ids(o[:-1]) for o in out]
    return backend.engine, batch_sizes


def _ids(items: list) -> list[int]:
    """The token ids of a job's emitted (token, logprob) items."""
    return [token for token, _ in items]


@pytest.mark.parametrize("policy", ["lru", "s3fifo", "static_layers"])
def test_sim_batch_replays_the_live_batched_plans(tiny_model_dir, policy):
    from freetoken.placement import Split, make_policy

    engine, batch_sizes = live_batched(tiny_model_dir, policy, capacity=5)
    # iteration 1 prefills request 1 whole and a chunk of the others, so request 1 decodes alone; by iteration 3
    # request 1 is done and the other three decode together
    assert batch_sizes[:3] == [1, 3, 3]
    trace = engine.trace()
    sim = replay(batched_calls(trace, 4, CHUNK), make_policy(policy, 5, trace.num_layers, trace.num_experts),
                 Split(), keep_plans=True)
    live = engine.cache.plans
    assert len(sim.plans) == len(live) and all(a == b for a, b in zip(sim.plans, live))
    solo = replay(batched_calls(trace, 1, CHUNK), make_policy(policy, 5, trace.num_layers, trace.num_experts),
                  Split(), keep_plans=True)
    assert len(solo.plans) > len(live)  # one request at a time: more, smaller decode calls


def test_ft_sim_batch_counts_the_live_run(tiny_model_dir, tmp_path, capsys):
    import json

    from freetoken.cli import main
    from freetoken.trace import save

    engine, _ = live_batched(tiny_model_dir, "lru", capacity=5)
    path = save(engine.trace(), tmp_path / "batched.safetensors")
    assert main(["sim", "--trace", str(path), "--policy", "lru", "--capacity", "5", "--prefill-chunk", str(CHUNK),
                 "--batch", "4", "--json"]) == 0
    total, live = json.loads(capsys.readouterr().out), engine.counters
    assert (total["hits"], total["fetched"], total["evictions"]) == (live.hits, live.fetched, live.evictions)
    assert total["accesses"] == live.accesses and live.hits > 0
