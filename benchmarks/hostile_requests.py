"""Hostile and failing requests against a real server (the demo model, engine backend, 4 running), measured: a
1,000 x 1,000-character stop list (its status and time, /health's latency meanwhile, a plain 500-token request
for comparison); a batch of four where one request's JSON schema has no finite instance (the others' answers
against their solo runs); N json_schema replies with length-bounded strings (how many parse and validate).
Runs on whatever freetoken is importable, so the same script measures an older checkout (PYTHONPATH=OLD_TREE).

    .venv/bin/python benchmarks/hostile_requests.py [--replies 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

GREEDY = {"temperature": 0}
RECURSIVE = {"type": "object", "properties": {"child": {"$ref": "#"}}, "required": ["child"]}
BOUNDED = {"type": "object", "additionalProperties": False, "required": ["name", "code", "note"],
           "properties": {"name": {"type": "string", "minLength": 2, "maxLength": 8},
                          "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{2,3}$"},
                          "note": {"type": "string", "maxLength": 12}}}


def serve():
    from freetoken.serve.app import build_app
    from freetoken.serve.config import ServeConfig
    from freetoken.serve.server import Server
    from freetoken.serve.startup import build_service, load

    cfg = ServeConfig(port=0, device_budget_gb=1.0, max_running=4)
    backend, _ = load(cfg, log=lambda s: None)
    service = build_service(backend, cfg)
    server = Server(build_app(service, cfg), "127.0.0.1", 0, announce=False)
    return server, server.start_in_thread(), service


def chat(url, model, text, timeout=600, **extra):
    t = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", timeout=timeout, json={
        "model": model, "messages": [{"role": "user", "content": text}], **extra})
    return r, time.perf_counter() - t


def health_during(url, work):
    """work() while /health is polled; -> (work's result, /health latencies in s)."""
    times, stop = [], threading.Event()

    def poll():
        with httpx.Client(timeout=600) as c:
            while not stop.is_set():
                t = time.perf_counter()
                c.get(url + "/health")
                times.append(time.perf_counter() - t)
                time.sleep(0.02)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        return work(), times
    finally:
        stop.set()
        thread.join()


def stop_list(url, model) -> dict:
    plain, plain_s = chat(url, model, "count", max_tokens=500, **GREEDY)
    stops = ["".join("qxzjv"[(i * 7 + j * 3) % 5] for j in range(1000)) for i in range(1000)]
    (r, took), health = health_during(url, lambda: chat(url, model, "count", max_tokens=500, stop=stops, **GREEDY))
    return {"plain_500_tokens_s": round(plain_s, 2), "plain_status": plain.status_code,
            "stop_list_status": r.status_code, "stop_list_s": round(took, 2),
            "stop_list_message": (r.json().get("error") or {}).get("message") if r.status_code != 200 else None,
            "health_max_ms": round(max(health) * 1e3, 1), "health_median_ms": round(statistics.median(health) * 1e3, 1)}


def poison(url, model) -> dict:
    prompts = [f"tell me about expert {i}" for i in range(3)]
    solo = [chat(url, model, p, max_tokens=24, **GREEDY)[0].json()["choices"][0]["message"]["content"]
            for p in prompts]
    bad = {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": RECURSIVE}}}

    def ask(i):
        if i == 3:
            return chat(url, model, "poison", max_tokens=24, **GREEDY, **bad)[0]
        return chat(url, model, prompts[i], max_tokens=24, **GREEDY)[0]

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(ask, range(4)))
    return {"statuses": [r.status_code for r in got],
            "poison_message": got[3].text[:200],
            "batch_mates_equal_solo": [r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == s
                                       for r, s in zip(got[:3], solo)]}


def structured(url, model, n: int) -> dict:
    import jsonschema

    fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": BOUNDED}}
    counts = {"valid": 0, "invalid_json": 0, "schema_violation": 0, "unfinished": 0, "http_error": 0}
    for i in range(n):
        r, _ = chat(url, model, f"record {i}", max_tokens=200, temperature=1.0, seed=i, response_format=fmt)
        if r.status_code != 200:
            counts["http_error"] += 1
            continue
        choice = r.json()["choices"][0]
        if choice["finish_reason"] == "length":
            counts["unfinished"] += 1
            continue
        try:
            jsonschema.validate(json.loads(choice["message"]["content"]), BOUNDED)
            counts["valid"] += 1
        except json.JSONDecodeError:
            counts["invalid_json"] += 1
        except jsonschema.ValidationError:
            counts["schema_violation"] += 1
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replies", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import freetoken

    server, thread, service = serve()
    model = service.backend.model_id
    try:
        out = {"freetoken": freetoken.__file__, "stop_list": stop_list(server.url, model),
               "poison": poison(server.url, model), "structured": structured(server.url, model, args.replies)}
    finally:
        server.stop(thread)
        service.shutdown()
    print(json.dumps(out, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
