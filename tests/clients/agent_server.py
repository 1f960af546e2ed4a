"""Helpers of tests/clients (a plain module: a second conftest.py would take the name `conftest` from
tests/serve's, which its tests import). The recorded requests of real coding agents (fixtures/<agent>/<agent>-NNN.json, captured by benchmarks/agents.sh
--capture from Claude Code, Codex and opencode talking to `ft serve`) and a server to replay them against: the demo
model built with a 32K context, as agents.sh serves it, behind an API key."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest


def _serve_helpers():
    """tests/serve/conftest.py under its own name (servers in threads), not the `conftest` pytest holds."""
    spec = importlib.util.spec_from_file_location("serve_helpers", Path(__file__).parents[1] / "serve" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


running = _serve_helpers().running

FIXTURES = Path(__file__).resolve().parent / "fixtures"
AGENTS = ("claude", "codex", "opencode")
KEY = "replay-key"
TIMEOUT = 120.0


def recorded(agent: str) -> list[dict]:
    """The agent's requests in the order their replies ended (two turns of one session)."""
    return [json.loads(p.read_text()) for p in sorted((FIXTURES / agent).glob(f"{agent}-*.json"))]


@pytest.fixture(scope="session")
def demo_32k(tmp_path_factory) -> Path:
    from freetoken.demo.build import build_demo

    return build_demo(tmp_path_factory.mktemp("demo") / "freetoken-demo", context=32768)


@pytest.fixture(scope="session")
def agent_server(demo_32k):
    """(url, service): the 32K demo on the engine, keyed, four requests at a time."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with running(demo_32k, max_running=4, api_key=KEY, served_name="freetoken-demo") as s:
        yield s
    torch.set_num_threads(before)
