"""Writes freetoken/launch/first_requests/<agent>.json from the recorded fixtures: each agent's first request that
carries its tools (what it sends before any answer), the fields its API's count endpoint takes. `ft launch` has the
server count it; tests/clients/test_replay.py checks the two stay equal. Run after re-capturing the fixtures."""

from __future__ import annotations

import json
from pathlib import Path

from freetoken.launch.probe import COUNTERS, FIRST_REQUESTS

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def first_request(agent: str) -> dict:
    for path in sorted((FIXTURES / agent).glob(f"{agent}-*.json")):
        body = json.loads(path.read_text()).get("body") or {}
        if body.get("tools"):
            return {k: body[k] for k in COUNTERS[agent][1] if k in body}
    raise ValueError(f"no request of {agent} with tools in {FIXTURES / agent}")


if __name__ == "__main__":
    FIRST_REQUESTS.mkdir(exist_ok=True)
    for agent in COUNTERS:
        (FIRST_REQUESTS / f"{agent}.json").write_text(json.dumps(first_request(agent), ensure_ascii=False) + "\n")
        print(f"{FIRST_REQUESTS / agent}.json")
