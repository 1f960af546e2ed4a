"""Incremental detokenizing and stop strings against the whole-text answer, on a byte-level toy vocabulary."""

from __future__ import annotations

import random

import pytest

from freetoken.serve.textstream import TextStream
from freetoken.serve.tools import parse_tool_calls

# token id = one byte, so multi-byte characters span several tokens, like byte-level BPE
decode = lambda ids: bytes(ids).decode("utf-8", errors="replace")  # noqa: E731


def clean_stop(text: str) -> str:
    """A stop string that occurs in text after its first character: its first ASCII letter or digit there, with
    the next one if that is one too (random-weight models print mostly broken bytes)."""
    for i in range(1, len(text)):
        if text[i].isascii() and text[i].isalnum():
            return text[i:i + 2] if text[i:i + 2].isascii() and text[i:i + 2].isalnum() else text[i]
    raise AssertionError(f"no ASCII letter or digit after the first character of {text!r}")


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


def test_text_streams_as_it_comes_holding_back_only_a_stop_in_the_making():
    # after each byte, everything but the longest tail that could still become the stop string has been emitted
    text, stop = "we wow work wo", "wox"
    ts, emitted = TextStream(decode, [stop]), ""
    for k, b in enumerate(text.encode(), start=1):
        emitted += ts.push(b)
        tail = max((n for n in range(1, len(stop)) if text[:k].endswith(stop[:n])), default=0)
        assert emitted == text[:k - tail]
    assert emitted + ts.finish() == text and ts.stop is None


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_string_completed_inside_a_token(include):
    # multi-character tokens: the stop ends in the middle of the second one, a character of its own on each side
    vocab = ["ab", "cSTOPde", "fg"]
    ts = TextStream(lambda ids: "".join(vocab[i] for i in ids), ["STOP"], include_stop=include)
    deltas = [ts.push(0), ts.push(1), ts.push(2), ts.finish()]
    assert "".join(deltas) == ts.text == ("abcSTOP" if include else "abc")
    assert ts.stop == "STOP"


@pytest.mark.parametrize("seed", range(10))
def test_invalid_bytes_stream_to_the_whole_text_decode(seed):
    # random bytes: broken and unfinished UTF-8 sequences, as a random-weight byte-level model emits
    rng = random.Random(seed)
    ids = [rng.choice([0x41, 0x20, 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0x80, 0xFF]) for _ in range(30)]
    ts = TextStream(decode)
    deltas = [ts.push(t) for t in ids] + [ts.finish()]
    assert "".join(deltas) == decode(ids) == ts.text


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


def test_the_raw_decoder_decodes_as_the_transformers_wrapper():
    """ChatTokenizer decodes through the tokenizers library where transformers' wrapper adds nothing: the same text
    for every id sequence (special tokens kept or skipped); a tokenizer that cleans up spaces keeps the wrapper."""
    import copy
    import random

    from freetoken.models.tokenizer import load_tokenizer
    from freetoken.paths import DEMO_MODEL
    from freetoken.serve.chat import ChatTokenizer, raw_decoder

    tok = load_tokenizer(DEMO_MODEL)
    chat = ChatTokenizer(tok)
    assert chat._raw is not None
    rng = random.Random(0)
    special = sorted(tok.all_special_ids)
    for _ in range(200):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 12))] + rng.sample(special, 1)
        rng.shuffle(ids)
        assert chat.decode(ids) == tok.decode(ids, skip_special_tokens=True)
        assert chat.decode_special(ids) == tok.decode(ids, skip_special_tokens=False)
    cleaning = copy.deepcopy(tok)
    cleaning.clean_up_tokenization_spaces = True
    assert raw_decoder(cleaning) is None
