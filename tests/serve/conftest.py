"""A real server on a free loopback port, in a background thread, over a tiny model; bounded timeouts everywhere."""

from __future__ import annotations

import sys
from typing import NamedTuple
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tinymodel import write_tiny_model  # noqa: E402

TIMEOUT = 30.0  # seconds, for every client call


class Greedy(NamedTuple):
    ids: list[int]  # the chat prompt
    text: str  # the completion, stop token dropped
    out: list[int]  # the sampled ids (stop token included)
    finish: str  # "stop" | "length"


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    """The server's worker, its event loop and the test's clients share two cores: with torch's intra-op threads
    spinning between ops they starve each other (a 6-token request took ~1 s instead of ~0.1 s)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-moe")


def start_server(model_dir: Path, backend: str = "engine", **overrides):
    """-> (server, thread, service); the caller stops it."""
    from freetoken.serve.app import build_app
    from freetoken.serve.config import ServeConfig
    from freetoken.serve.server import Server
    from freetoken.serve.service import Service
    from freetoken.serve.startup import load

    cfg = ServeConfig(model=model_dir, backend=backend, port=0, device_budget_gb=1.0, **overrides)
    backend_obj, _ = load(cfg, log=lambda s: None)
    service = Service(backend_obj, cfg.max_running, cfg.max_waiting)
    server = Server(build_app(service), "127.0.0.1", 0, announce=False)
    thread = server.start_in_thread()
    return server, thread, service


@pytest.fixture(scope="session")
def served(tiny_model_dir):
    """(base url, service) of the shared server: engine backend, 2 running requests."""
    server, thread, service = start_server(tiny_model_dir, max_running=2)
    yield server.url, service
    server.stop(thread)
    service.shutdown()


@pytest.fixture(scope="session")
def reference_engine(tiny_model_dir):
    """A separate Engine on the same checkpoint: what `ft generate --chat` runs."""
    from freetoken.engine import Engine

    return Engine.from_pretrained(tiny_model_dir, kernels="reference")


@pytest.fixture(scope="session")
def greedy(reference_engine):
    """greedy(user text, max_tokens) -> Greedy(prompt ids, text, token ids, finish) from the engine, no server."""
    from freetoken.engine import SamplingParams
    from freetoken.models.tokenizer import chat_prompt

    memo = {}

    def run(text: str, max_tokens: int):
        if (text, max_tokens) not in memo:
            tok = reference_engine.tokenizer
            ids = chat_prompt(tok, text)
            out = list(reference_engine.generate(ids, SamplingParams(greedy=True), max_tokens=max_tokens))
            stops = reference_engine.default_stop_ids()
            finish = "stop" if out[-1] in stops else "length"
            memo[text, max_tokens] = Greedy(ids, tok.decode([t for t in out if t not in stops]), out, finish)
        return memo[text, max_tokens]

    return run


@pytest.fixture(scope="session")
def model_id(served):
    return served[1].backend.model_id
