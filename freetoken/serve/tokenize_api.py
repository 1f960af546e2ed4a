"""vLLM's /tokenize and /detokenize: a prompt's token ids on this model (text, or chat messages through the chat
template), and the text of token ids. `ft launch` counts an agent's first chat request with it."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from freetoken.serve.chat import ChatInput, Params
from freetoken.serve.errors import APIError
from freetoken.serve.openai_api import ChatMessage, Lenient, chat_messages, openai_tools


class TokenizeRequest(Lenient):
    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = None
    add_special_tokens: bool = True  # vLLM's default for a text prompt
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(Lenient):
    model: str
    tokens: list[int] = Field(min_length=0)


def tokenize_input(req: TokenizeRequest) -> ChatInput:
    """The chat form of a messages request (exactly one of prompt and messages is given)."""
    if req.prompt is not None:
        raise APIError(400, "prompt: give either prompt or messages, not both", "prompt")
    return ChatInput(chat_messages(req.messages), openai_tools(req.tools, None), Params(),
                     template_kwargs=dict(req.chat_template_kwargs or {}))
