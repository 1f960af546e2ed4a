"""The generation service behind every API: a request queue with a bounded number of running requests, each one
driven token by token on a worker thread, its text streamed back to the event loop.

A backend generates one sequence per call; steps of concurrent requests interleave under one lock (the engine runs
one step at a time). A request's slot is freed when its worker has stopped the engine, not before, so a client
that disconnects mid-stream cannot leave work running in a freed slot.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol

from freetoken.serve.chat import ChatInput, ChatTokenizer, Params, Prompt
from freetoken.serve.errors import APIError
from freetoken.serve.textstream import TextStream
from freetoken.serve.tools import TOOL_OPEN, ToolCall, parse_tool_calls


class Generation(Protocol):
    """Sampled token ids, one per step; close() ends the sequence (and caches its KV)."""

    reused_tokens: int  # prompt tokens served from the prefix cache, known after the first step

    def __next__(self) -> int: ...

    def close(self) -> None: ...


class Backend(Protocol):
    """What the service needs from a model (freetoken/serve/engine_backend.py adapts the live engine)."""

    model_id: str
    max_context: int
    chat: ChatTokenizer
    stop_token_ids: set[int]

    def generate(self, prompt: Prompt, params: Params, max_new: int) -> "Generation":
        """A sequence, not started yet (no work in the call itself)."""

    def stats(self) -> dict:
        """Counters for /health (reused vs computed prompt tokens, ...)."""


@dataclass(slots=True)
class Delta:
    text: str


@dataclass(slots=True)
class Done:
    text: str  # the whole completion text (without a stop string or tool-call blocks)
    finish: str  # "stop" (end of sequence or a stop string) | "length" | "tool_calls"
    stop: str | None  # the stop string that ended it
    tool_calls: list[ToolCall]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(slots=True)
class Counters:
    running: int = 0
    waiting: int = 0
    served: int = 0
    cancelled: int = 0
    rejected: int = 0

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


_END = object()


@dataclass
class Service:
    backend: Backend
    max_running: int = 1
    max_waiting: int = 64
    counters: Counters = field(default_factory=Counters)

    def __post_init__(self) -> None:
        if self.max_running < 1 or self.max_waiting < 0:
            raise ValueError(f"--max-running must be >= 1 and --max-waiting >= 0, got {self.max_running}, "
                             f"{self.max_waiting}")
        self._slots = asyncio.Semaphore(self.max_running)
        self._pool = ThreadPoolExecutor(self.max_running, thread_name_prefix="ft-gen")
        self._engine_lock = threading.Lock()

    def render(self, chat: ChatInput) -> Prompt:
        try:
            return self.backend.chat.render(chat.messages, chat.tools)
        except ValueError as e:
            raise APIError(400, str(e), "messages")
        except Exception as e:  # a template that raises on these messages (jinja's own exception types)
            raise APIError(400, f"the chat template rejected these messages: {e}", "messages")

    def prompt(self, chat: ChatInput) -> Prompt:
        """The rendered prompt, if it leaves room to generate."""
        prompt = self.render(chat)
        n, ctx = len(prompt.tokens), self.backend.max_context
        if n >= ctx:
            raise APIError(400, f"the prompt is {n} tokens; this model's context is {ctx} tokens, "
                                f"leaving no room to generate", "messages", "context_length_exceeded")
        return prompt

    async def run(self, chat: ChatInput, prompt: Prompt | None = None) -> AsyncIterator[Delta | Done]:
        """Deltas of text, then one Done. Raises APIError before the first event for bad or unservable requests."""
        prompt = prompt or self.prompt(chat)
        room = self.backend.max_context - len(prompt.tokens)
        max_new = room if chat.params.max_tokens is None else min(chat.params.max_tokens, room)
        if self.counters.waiting >= self.max_waiting and self._slots.locked():
            self.counters.rejected += 1
            raise APIError(503, f"server busy: {self.counters.running} running, {self.counters.waiting} waiting")
        self.counters.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.counters.waiting -= 1
        self.counters.running += 1
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()
        release = self._release_slot
        gen: Generation | None = None

        def work():
            try:
                try:
                    while not cancel.is_set():
                        with self._engine_lock:
                            tok = next(gen, _END)
                        loop.call_soon_threadsafe(queue.put_nowait, tok)
                        if tok is _END:
                            break
                finally:
                    with self._engine_lock:
                        gen.close()
            except BaseException as e:  # surfaced to the request, never lost in the thread
                loop.call_soon_threadsafe(queue.put_nowait, e)
            finally:
                loop.call_soon_threadsafe(release)

        try:
            gen = self.backend.generate(prompt, chat.params, max_new)
            self._pool.submit(work)
        except BaseException:
            release()
            raise
        stop_ids = self.backend.stop_token_ids
        stream = TextStream(self.backend.chat.decode, chat.params.stop, [TOOL_OPEN] if chat.tools else [])
        finish, generated, finished = "length", 0, False
        try:
            while True:
                tok = await queue.get()
                if isinstance(tok, BaseException):
                    raise tok
                if tok is _END:
                    break
                generated += 1
                if tok in stop_ids:
                    finish = "stop"
                    break
                delta = stream.push(tok)
                if delta:
                    yield Delta(delta)
                if stream.stop is not None:
                    finish = "stop"
                    break
                if generated >= max_new:
                    break
            cancel.set()
            rest = stream.finish()
            if rest:
                yield Delta(rest)
            text, calls = stream.text, []
            if stream.held:  # output from a tool-call tag on, kept back from the text deltas
                content, calls = parse_tool_calls(stream.text)
                if calls:
                    text, finish = content, "tool_calls"
                else:  # not a well-formed call after all: it is text
                    yield Delta(stream.held)
            self.counters.served += 1
            finished = True
            yield Done(text, finish, stream.stop, calls, len(prompt.tokens), generated, gen.reused_tokens)
        finally:
            cancel.set()
            self.counters.cancelled += not finished

    async def complete(self, chat: ChatInput) -> Done:
        events = [event async for event in self.run(chat)]
        return events[-1]

    def _release_slot(self) -> None:
        self.counters.running -= 1
        self._slots.release()

    def health(self) -> dict:
        return {"status": "ok", "model": self.backend.model_id, "max_context": self.backend.max_context,
                "max_running": self.max_running, **self.counters.to_dict(), "engine": self.backend.stats()}

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
