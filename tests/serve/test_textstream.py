"""Incremental detokenizing and stop strings against the whole-text answer, on a byte-level toy vocabulary."""

from __future__ import annotations

import random

import pytest

from freetoken.serve.textstream import TextStream
from freetoken.serve.tools import parse_tool_calls

# token id = one byte, so multi-byte characters span several tokens, like byte-level BPE
decode = lambda ids: bytes(ids).decode("utf-8", errors="replace")  # noqa: E731


def run(text: str, stops=(), markers=()):
    ts = TextStream(decode, stops, markers)
    deltas = []
    for b in text.encode():
        deltas.append(ts.push(b))
        if ts.stop:
            break
    deltas.append(ts.finish())
    return deltas, ts


@pytest.mark.parametrize("seed", range(20))
def test_deltas_add_up_to_the_text_cut_at_the_earliest_stop(seed):
    rng = random.Random(seed)
    alphabet = "ab é€\n"
    text = "".join(rng.choice(alphabet) for _ in range(40))
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3))) for _ in range(2)]
    deltas, ts = run(text, stops)
    cuts = [text.find(s) for s in stops if s in text]
    expect = text[: min(cuts)] if cuts else text
    assert "".join(deltas) == expect
    assert ts.stop == (min((text.find(s), s) for s in stops if s in text)[1] if cuts else None)
    assert all("\ufffd" not in d for d in deltas)  # never half a character
    # no delta ever shows part of a stop string that later completes
    emitted = ""
    for d in deltas:
        emitted += d
        assert emitted == expect[: len(emitted)]


def test_text_after_a_hold_marker_is_kept_back_for_parsing():
    text = 'Let me look.<tool_call>\n{"name": "ls", "arguments": {"path": "/tmp"}}\n</tool_call>'
    deltas, ts = run(text, markers=["<tool_call>"])
    assert "".join(deltas) == "Let me look."
    content, calls = parse_tool_calls(ts.text)
    assert content == "Let me look."
    assert [(c.name, c.arguments) for c in calls] == [("ls", '{"path": "/tmp"}')]


def test_tool_parsing_leaves_malformed_blocks_as_text():
    assert parse_tool_calls("<tool_call>{not json}</tool_call>") == ("<tool_call>{not json}</tool_call>", [])
    assert parse_tool_calls("plain") == ("plain", [])
    two = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": "{}"}'
    content, calls = parse_tool_calls(two)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("a", "{}"), ("b", "{}")]
