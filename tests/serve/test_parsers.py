"""Reasoning and tool-call parsers on each family's documented output format: the pieces streamed in any split
add up to the pieces of the whole text, calls come out with their arguments, malformed calls stay text; the family
picks the parser; a reasoning budget closes the reasoning with the family's closing text."""

from __future__ import annotations

import json
import random
import re

import pytest

from freetoken.serve.parsers import output_parser, resolve_parsers

CALL = {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}
OUTPUTS = {  # tool parser -> (model output, content before the calls)
    "hermes": ('Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>',
               "Sure."),
    "mistral": ('Sure.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]', "Sure."),
    "deepseek": ("Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                 '{"city": "Paris", "days": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "Sure."),
    "glm": ("Sure.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>", "Sure."),
}
OTHER_FORMS = {  # second documented form of a format
    "mistral": 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}',
    "deepseek": ('Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris", "days": 2}'
                 "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
}


def run(parser, text: str, seed: int) -> tuple[list, list]:
    """Feeds text in random pieces (seed None: in one); -> (merged (kind, text) pieces, calls)."""
    rng, pieces, i = random.Random(seed), [], 0
    while i < len(text):
        n = rng.randint(1, 6) if seed is not None else len(text)  # None: the whole text at once
        pieces += parser.feed(text[i:i + n])
        i += n
    rest, calls = parser.finish()
    merged = []
    for kind, t in pieces + rest:
        if merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + t)
        else:
            merged.append((kind, t))
    return merged, calls


@pytest.mark.parametrize("fmt", sorted(OUTPUTS))
@pytest.mark.parametrize("seed", range(3))
def test_tool_formats_streamed_in_any_split(fmt, seed):
    for text in (OUTPUTS[fmt][0], OTHER_FORMS.get(fmt, OUTPUTS[fmt][0])):
        parser = output_parser(fmt, "none", tools_enabled=True, thinking_open=False)
        pieces, calls = run(parser, text, seed)
        # streamed: the text before the marker (a newline before it may already be out); final: without it
        assert [(k, t.rstrip()) for k, t in pieces] == [("content", OUTPUTS[fmt][1])] and parser.content == "Sure."
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [(CALL["name"], CALL["arguments"])]


@pytest.mark.parametrize("fmt", sorted(OUTPUTS))
@pytest.mark.parametrize("seed", [0, None])
def test_calls_with_no_text_before_them(fmt, seed):
    # the model answers with the call alone: no content, the call parsed (its id as OpenAI's: call_ + 24 hex)
    for text in (OUTPUTS[fmt][0], OTHER_FORMS.get(fmt, OUTPUTS[fmt][0])):
        text = text.removeprefix("Sure.").lstrip("\n")
        parser = output_parser(fmt, "none", tools_enabled=True, thinking_open=False)
        pieces, calls = run(parser, text, seed)
        assert pieces == [] and parser.content == ""
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [(CALL["name"], CALL["arguments"])]
        assert re.fullmatch(r"call_[0-9a-f]{24}", calls[0].id)


def test_deepseek_v2_arguments_over_several_lines():
    # the name<sep>{json} form with pretty-printed JSON: a newline in the body does not make it the V3 form
    text = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\n  "city": "Paris",\n  "days": 2\n}'
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    _, calls = run(output_parser("deepseek", "none", tools_enabled=True, thinking_open=False), text, None)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [(CALL["name"], CALL["arguments"])]


@pytest.mark.parametrize("fmt", sorted(OUTPUTS))
def test_malformed_calls_stay_text(fmt):
    text = OUTPUTS[fmt][0].replace('"Paris"', '"Par').replace("<arg_key>days</arg_key>", "")
    text = text.replace("get_weather", "") if fmt == "glm" else text
    pieces, calls = run(output_parser(fmt, "none", tools_enabled=True, thinking_open=False), text, 0)
    assert calls == [] and "".join(t for _, t in pieces) == text


@pytest.mark.parametrize("seed", range(3))
def test_think_blocks_split_reasoning_from_content(seed):
    text = '<think>\nThe user wants weather.\n</think>\n\nCalling it.<tool_call>{"name": "get_weather", ' \
           '"arguments": {"city": "Paris", "days": 2}}</tool_call>'
    pieces, calls = run(output_parser("hermes", "think", True, False), text, seed)
    assert pieces == [("reasoning", "\nThe user wants weather.\n"), ("content", "Calling it.")]
    assert calls[0].name == "get_weather"
    # DeepSeek-R1 / Qwen3 templates that open <think> in the prompt: the output starts inside it
    pieces, _ = run(output_parser("hermes", "think", False, thinking_open=True), "plan</think>answer", seed)
    assert pieces == [("reasoning", "plan"), ("content", "answer")]
    pieces, _ = run(output_parser("hermes", "think", False, False), "no reasoning here <think> later", seed)
    assert pieces == [("content", "no reasoning here <think> later")]


@pytest.mark.parametrize("seed", range(3))
def test_harmony_channels_and_calls(seed):
    text = ("<|channel|>analysis<|message|>Need the weather tool.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "days": 2}')  # <|call|> stops
    pieces, calls = run(output_parser("harmony", "harmony", True, False), text, seed)
    assert pieces == [("reasoning", "Need the weather tool.")]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [(CALL["name"], CALL["arguments"])]
    text = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hello!"
    pieces, calls = run(output_parser("harmony", "harmony", False, False), text, seed)
    assert pieces == [("reasoning", "Think."), ("content", "Hello!")] and calls == []
    pieces, _ = run(output_parser("harmony", "harmony", False, False), "plain text, no channels", seed)
    assert pieces == [("content", "plain text, no channels")]


@pytest.mark.parametrize("seed", [*range(3), None])
def test_harmony_edges(seed):
    """Every message of a whole text in one feed (seed None) or in pieces: what each channel accumulated, a header
    left without its message, a malformed call's body as text, and a final body ending in a marker's first char."""
    parser = output_parser("harmony", "harmony", False, False)
    text = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi<|end|>" \
           "<|start|>assistant"  # a header the output ended in
    assert run(parser, text, seed) == ([("reasoning", "Think."), ("content", "Hi")], [])
    assert (parser.reasoning, parser.content) == ("Think.", "Hi")
    body = '{"city": "Par'  # the call's JSON cut short: the body is text
    text = f"<|channel|>commentary to=functions.get_weather<|message|>{body}"
    assert run(output_parser("harmony", "harmony", True, False), text, seed) == ([("content", body)], [])
    text = "<|channel|>final<|message|>a <"
    assert run(output_parser("harmony", "harmony", False, False), text, seed) == ([("content", "a <")], [])
    assert run(output_parser("harmony", "harmony", False, False), "", seed) == ([], [])


def test_harmony_in_reasoning_follows_the_channel():
    parser = output_parser("harmony", "harmony", False, False)
    parser.feed("<|channel|>analysis<|message|>Thi")
    assert parser.in_reasoning
    parser.feed("nk.<|end|><|start|>assistant<|channel|>final<|message|>He")
    assert not parser.in_reasoning


@pytest.mark.parametrize("seed", [*range(3), None])
def test_think_and_tool_edges(seed):
    # content and reasoning that end in a marker's first characters at the end, and a bare start of <think>
    assert run(output_parser("hermes", "none", True, False), "a <tool", seed) == ([("content", "a <tool")], [])
    assert run(output_parser("hermes", "think", False, True), "plan </thi", seed) == ([("reasoning", "plan </thi")], [])
    assert run(output_parser("hermes", "think", False, False), "<thi", seed) == ([("content", "<thi")], [])


def test_family_picks_the_parsers_and_flags_override():
    assert resolve_parsers("qwen3_moe") == ("hermes", "think")
    assert resolve_parsers("gpt_oss") == ("harmony", "harmony")
    assert resolve_parsers("deepseek_v3") == ("deepseek", "think")
    assert resolve_parsers("mixtral") == ("mistral", "none")
    assert resolve_parsers("glm4_moe") == ("glm", "think")
    assert resolve_parsers("olmoe") == ("hermes", "none")
    assert resolve_parsers("qwen3_moe", "glm", "none") == ("glm", "none")


def test_thinking_budget_forces_the_closing_text(tiny_engine):
    from freetoken.engine.sampling import SamplingParams
    from freetoken.serve.chat import ChatInput, ChatTokenizer, Params
    from freetoken.serve.decoding import Decoder
    from freetoken.serve.output import RequestOutput

    chat_tok = ChatTokenizer(tiny_engine.tokenizer)
    params = Params(thinking_budget=5)
    decoder = Decoder(params, SamplingParams(greedy=True))
    out = RequestOutput(ChatInput([], None, params), chat_tok, [], ("hermes", "think"), decoder)
    for t in chat_tok.encode("<think>abcdefgh"):
        out.push(t, None)
        if decoder.forced:
            break
    # 5 reasoning tokens: the one completing the <think> tag, then a b c d
    assert out.reasoning_tokens == 5 and out.reasoning == "abcd" and decoder.forced == chat_tok.encode("\n</think>\n\n")
