"""Real servers on free loopback ports, in background threads: one over the shipped demo model, one over a tiny
character-level model whose chat template renders tools. Bounded timeouts everywhere."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tinymodel import write_tiny_model  # noqa: E402

TIMEOUT = 30.0  # seconds, for every client call
LONG = " ".join(str(i) for i in range(1500))  # > 2048 tokens for the demo model, > 1024 for the tiny one


class Served(NamedTuple):
    """A running server: its base url and the service behind it."""
    url: str
    service: object

    @property
    def model_id(self) -> str:
        return self.service.backend.model_id


def openai_client(url: str, api_key: str = "unused"):
    """The official OpenAI client on a server's /v1, with the bounded timeout and no retries."""
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key=api_key, timeout=TIMEOUT, max_retries=0)


def anthropic_client(url: str, api_key: str = "unused"):
    """The official Anthropic client on a server, with the bounded timeout and no retries."""
    import anthropic

    return anthropic.Anthropic(base_url=url, api_key=api_key, timeout=TIMEOUT, max_retries=0)


class Greedy(NamedTuple):
    prompt_tokens: int
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


def start_server(model_dir: Path | None, backend: str = "engine", **overrides):
    """-> (server, thread, service); the caller stops it. model_dir None: the shipped demo model."""
    from freetoken.serve.app import build_app
    from freetoken.serve.config import ServeConfig
    from freetoken.serve.server import Server
    from freetoken.serve.startup import build_service, load

    cfg = ServeConfig(**{"model": model_dir, "backend": backend, "port": 0, "device_budget_gb": 1.0, **overrides})
    backend_obj, _ = load(cfg, log=lambda s: None)
    service = build_service(backend_obj, cfg)
    server = Server(build_app(service, cfg), "127.0.0.1", 0, announce=False)
    thread = server.start_in_thread()
    return server, thread, service


@contextlib.contextmanager
def running(model_dir: Path | None, **overrides):
    """-> Served (url, service) while the block runs; model_dir None: the shipped demo model."""
    server, thread, service = start_server(model_dir, **overrides)
    try:
        yield Served(server.url, service)
    finally:
        server.stop(thread)
        service.shutdown()


@pytest.fixture(scope="session")
def served():
    """(base url, service): the demo model on the engine, 2 running requests."""
    with running(None, max_running=2) as s:
        yield s


@pytest.fixture(scope="session")
def model_id(served):
    return served.model_id


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-moe")


@pytest.fixture(scope="session")
def tiny_served(tiny_model_dir):
    """(base url, service): the character-level tiny model (its template renders tools)."""
    with running(tiny_model_dir, max_running=2) as s:
        yield s


def reference_engine(model_dir: Path, **options):
    """A separate Engine on a checkpoint (reference kernels, as the CPU server runs), for cold runs and its
    tokenizer."""
    from freetoken.engine import Engine

    return Engine.from_pretrained(model_dir, kernels="host", **options)


@pytest.fixture(scope="session")
def tiny_client(tiny_served):
    """The OpenAI client on the tiny model's server."""
    return openai_client(tiny_served.url)


@pytest.fixture(scope="session")
def tiny_model_id(tiny_served):
    return tiny_served.model_id


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir):
    return reference_engine(tiny_model_dir)


@pytest.fixture(scope="session")
def greedy():
    """greedy(user text, max_tokens) -> Greedy: what `ft generate --chat --greedy` prints for the demo model
    (reference kernels as the CPU server runs, every expert resident as the server's plan has them)."""
    from freetoken.cli import main
    from freetoken.models.tokenizer import load_tokenizer
    from freetoken.paths import DEMO_MODEL

    stops = {load_tokenizer(DEMO_MODEL).eos_token_id}
    memo = {}

    def run(text: str, max_tokens: int) -> Greedy:
        if (text, max_tokens) not in memo:
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                assert main(["generate", "--chat", "--prompt", text, "--greedy", "--max-tokens", str(max_tokens),
                             "--kernels", "host", "--device", "cpu", "--fraction", "1", "--json"]) == 0
            r = json.loads(out.getvalue())
            finish = "stop" if r["token_ids"][-1] in stops else "length"
            memo[text, max_tokens] = Greedy(r["prompt_tokens"], r["text"], r["token_ids"], finish)
        return memo[text, max_tokens]

    return run


@pytest.fixture(scope="session")
def engine_steps():
    """steps(text | ids, n, shape, stops) -> (token ids, per-step log-softmax [V]) of greedy decoding of the demo
    model on the engine itself (not through a server), the text as one chat turn or the ids as given, with
    shape(logits, earlier ids) applied before each argmax; it stops after a token in stops."""
    import torch

    from freetoken.models.tokenizer import chat_prompt
    from freetoken.paths import DEMO_MODEL

    engine = reference_engine(DEMO_MODEL, device="cpu")

    def steps(text, n: int, shape=lambda logits, ids: logits, stops=()):
        ids = chat_prompt(engine.tokenizer, text) if isinstance(text, str) else list(text)
        kv = engine.new_kv()
        logits = engine.prefill(ids, kv)[-1].float()
        out, logprobs = [], []
        for _ in range(n):
            logprobs.append(torch.log_softmax(logits, -1))
            out.append(int(torch.argmax(shape(logits.clone(), out))))
            if out[-1] in stops:
                break
            logits = engine.decode(out[-1], kv)[-1].float()
        return out, logprobs

    steps.engine = engine
    return steps
