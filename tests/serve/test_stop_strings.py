"""Stop strings: the automaton finds what a brute-force search finds, include_stop_str_in_output and min_tokens act
as vLLM's do, the caps are a 400 naming them, and a hostile stop list (1,000 stops of 1,000 characters, a 1 MB
body) slows neither /health nor another request's tokens."""

from __future__ import annotations

import random
import threading
import time

import httpx
import pytest

from conftest import TIMEOUT, openai_client, running
from test_textstream import decode, run

from freetoken.serve.stopmatch import MAX_STOP_CHARS, MAX_STOPS, Match, StopMatcher, check_stops
from freetoken.serve.textstream import TextStream


def brute(text: str, needles: list[str]) -> tuple[int, int] | None:
    """(end, start) of the first needle occurrence to complete in text, the earliest start among those ending
    there."""
    for end in range(1, len(text) + 1):
        starts = [end - len(n) for n in needles if n and text[:end].endswith(n)]
        if starts:
            return end, min(starts)
    return None


def partial(text: str, needles: list[str]) -> int:
    """The longest suffix of text that is a prefix of some needle (or a whole one)."""
    return max((k for n in needles for k in range(1, len(n) + 1) if text.endswith(n[:k])), default=0)


@pytest.mark.parametrize("seed", range(30))
def test_matcher_equals_brute_force(seed):
    rng = random.Random(seed)
    alphabet = "abc"
    needles = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 6))]
    text = "".join(rng.choice(alphabet) for _ in range(60))
    m, found = StopMatcher(needles), None
    for end, ch in enumerate(text, start=1):
        hit = m.feed(ch)
        assert m.partial == partial(text[:end], needles)
        if hit is not None:
            found = (end, hit.start)
            break
    assert found == brute(text, needles)


@pytest.mark.parametrize("seed", range(200))
def test_every_match_and_partial_past_the_first(seed):
    """Fed on past each match, at every position: the earliest-starting needle that ends there (its first index
    among equal needles) and the partial, against a search over the text. Letters that start no needle, and
    repeated needles, exercise the automaton's fallbacks."""
    rng = random.Random(seed)
    alphabet = "abcd"
    needles = ["".join(rng.choice(alphabet[:3]) for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 4))]
    needles += rng.sample(needles, rng.randint(0, 1))  # a needle given twice
    text = "".join(rng.choice(alphabet) for _ in range(80))
    m = StopMatcher(needles)
    for end, ch in enumerate(text, start=1):
        hit = m.feed(ch)
        ending = [(end - len(n), i) for i, n in enumerate(needles) if text[:end].endswith(n)]
        assert (hit.start, hit.needle) == min(ending) if ending else hit is None
        assert m.partial == partial(text[:end], needles)


def test_a_chunk_reports_the_stop_that_completed_first_among_equal_starts():
    # fed at once or char by char, "ab" completes before "abc" does: the same stop either way
    assert StopMatcher(["abc", "ab"]).feed("xabcd") == StopMatcher(["abc", "ab"]).feed("xab") == Match(1, 1)


def test_an_empty_stop_string_never_matches():
    hit = StopMatcher(["", "b"]).feed("ab")
    assert (hit.start, hit.needle) == (1, 1)


def test_the_caps_on_stop_strings_are_inclusive():
    check_stops(["x"] * MAX_STOPS)
    check_stops(["x" * MAX_STOP_CHARS])
    with pytest.raises(ValueError, match=f"at most {MAX_STOPS} stop strings, got {MAX_STOPS + 1}"):
        check_stops(["x"] * (MAX_STOPS + 1))
    with pytest.raises(ValueError, match=rf"stop\[1\]: a stop string is at most {MAX_STOP_CHARS} characters"):
        check_stops(["x", "x" * (MAX_STOP_CHARS + 1)])


def test_include_stop_str_in_output_and_min_tokens():
    text = "one stop two stop three"
    deltas, ts = run(text, ["stop"])
    assert "".join(deltas) == "one " and ts.stop == "stop"
    ts = TextStream(decode, ["stop"], include_stop=True)
    out = "".join(ts.push(b) for b in text.encode()[:9])
    assert out + ts.finish() == "one stop" and ts.stop == "stop"
    ts = TextStream(decode, ["stop"], armed=False)  # min_tokens not reached: the first stop does not count
    out = "".join(ts.push(b) for b in text.encode()[:10])
    ts.arm()
    out += "".join(ts.push(b) for b in text.encode()[10:]) + ts.finish()
    assert out == "one stop two " and ts.stop == "stop"


def hostile(n: int, chars: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice("qxzjv") for _ in range(chars)) for _ in range(n)]


class HealthProbe:
    """/health polled in a loop on its own connection while something else runs; the slowest answer (at least one
    poll, even when the other work ends before the first one does)."""

    def __init__(self, url: str):
        self.url, self.times, self._stop = url, [], threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        with httpx.Client(timeout=TIMEOUT) as c:
            while True:
                t = time.perf_counter()
                assert c.get(self.url + "/health").status_code == 200
                self.times.append(time.perf_counter() - t)
                if self._stop.wait(0.01):
                    break

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join()


def test_a_thousand_stops_of_a_thousand_chars_are_a_400_and_health_stays_fast(served, model_id):
    body = {"model": model_id, "max_tokens": 500, "messages": [{"role": "user", "content": "hi"}],
            "stop": hostile(1000, 1000)}
    with HealthProbe(served.url) as probe:
        t = time.perf_counter()
        r = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
        took = time.perf_counter() - t
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"
    assert r.json()["error"]["message"] == f"stop: at most {MAX_STOPS} stop strings, got 1000"
    assert took < 5 and max(probe.times) < 0.1, (took, max(probe.times))
    one_long = {**body, "stop": ["x" * (MAX_STOP_CHARS + 1)]}
    r = httpx.post(served.url + "/v1/chat/completions", json=one_long, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("stop[0]: a stop string is at most")
    r = httpx.post(served.url + "/v1/messages", json={"model": model_id, "max_tokens": 4, "messages": body["messages"],
                                                      "stop_sequences": hostile(100, 10)}, timeout=TIMEOUT)
    assert r.status_code == 400 and "stop_sequences: at most" in r.json()["error"]["message"]


def test_the_longest_stop_list_allowed_slows_neither_health_nor_a_batch_mate():
    """64 stops of 1,024 characters (the caps) on a 300-token request beside a plain 300-token one, against the
    same pair without stops: the plain request's time and /health's latency stay where they were."""
    with running(None, max_running=2) as (url, service):
        client = openai_client(url)
        model = service.backend.model_id

        def ask(stop=None):
            t = time.perf_counter()
            r = client.chat.completions.create(model=model, max_tokens=300, temperature=0, seed=1,
                                               messages=[{"role": "user", "content": "count"}],
                                               extra_body={"ignore_eos": True, **({"stop": stop} if stop else {})})
            assert r.usage.completion_tokens == 300
            return time.perf_counter() - t

        def pair(stop):
            with HealthProbe(url) as probe:
                out = {}
                other = threading.Thread(target=lambda: out.setdefault("hostile", ask(stop)))
                other.start()
                out["plain"] = ask()
                other.join()
            return out, max(probe.times)

        ask()  # warm up
        base, base_health = pair(None)
        hard, hard_health = pair(hostile(MAX_STOPS, MAX_STOP_CHARS))
    print(f"\nplain beside plain {base['plain']:.2f}s, beside the stop list {hard['plain']:.2f}s; the stop-list "
          f"request {hard['hostile']:.2f}s (without: {base['hostile']:.2f}s); /health max {base_health * 1e3:.0f} "
          f"/ {hard_health * 1e3:.0f} ms")
    assert hard["plain"] < 1.5 * base["plain"] + 0.5 and hard["hostile"] < 1.5 * base["hostile"] + 1.0
    assert hard_health < 0.1
