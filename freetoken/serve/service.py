"""The generation service behind every API: a request queue with a bounded number of running requests, all
driven by one engine thread (scheduler.py: continuous batching, one decode step for all running sequences), each
request's tokens streamed back to the event loop and turned into text, reasoning and tool calls there.

A request's slot is freed when the engine thread has closed its sequence, not before, so a client that
disconnects mid-stream cannot leave work running in a freed slot.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol

from freetoken.serve.chat import ChatInput, ChatTokenizer, Prompt
from freetoken.serve.config import DEFAULT_MAX_RUNNING
from freetoken.serve.decoding import Decoder, TokenLogprob
from freetoken.serve.errors import APIError
from freetoken.serve.grammar import GrammarMask, Grammars
from freetoken.serve.metrics import Metrics
from freetoken.serve.output import Delta, RequestOutput
from freetoken.serve.parsers import resolve_parsers
from freetoken.serve.scheduler import END, Job, Scheduler
from freetoken.serve.tools import ToolCall


class Generation(Protocol):
    """Sampled token ids, one per step; close() ends the sequence (and caches its KV)."""

    reused_tokens: int  # prompt tokens served from the prefix cache, known after the first step

    prompt_logprobs: list | None  # per prompt token (None for the first), when the params asked for them

    started: bool  # prefilled: the next step is a decode step
    finished: bool  # no more tokens: max_new reached, a stop token sampled, or closed

    def __next__(self) -> int | None:
        """The next token; None after a prefill chunk that is not the prompt's last."""

    def close(self) -> None: ...


class Backend(Protocol):
    """What the service needs from a model (freetoken/serve/engine_backend.py adapts the live engine)."""

    model_id: str
    max_context: int  # served: the model's own, or less (--max-context, the memory plan)
    model_context: int  # the model's own (config.json), what --max-context may ask for at most
    chat: ChatTokenizer
    stop_token_ids: set[int]
    family: str  # config.json's model_type: picks the tool-call and reasoning parsers
    vocab_size: int
    generation_defaults: object  # freetoken.models.generation_config.GenerationDefaults

    def generate(self, prompt: Prompt, decoder: Decoder, max_new: int) -> "Generation":
        """A sequence, not started yet (no work in the call itself)."""

    def stats(self) -> dict:
        """Counters for /health (reused vs computed prompt tokens, ...)."""

    # optional: decode_batch(gens) -> next tokens, one decode step of several started sequences together


@dataclass(slots=True)
class Done:
    text: str  # the whole completion text (without a stop string, reasoning or tool-call blocks)
    finish: str  # "stop" (end of sequence or a stop string) | "length" | "tool_calls"
    stop: str | None  # the stop string that ended it
    tool_calls: list[ToolCall]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of the output tokens, when asked for
    prompt_logprobs: list[TokenLogprob | None] | None = None


@dataclass(slots=True)
class Counters:
    running: int = 0
    waiting: int = 0
    served: int = 0
    cancelled: int = 0
    rejected: int = 0

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass
class Service:
    backend: Backend
    max_running: int = DEFAULT_MAX_RUNNING
    max_waiting: int = 64
    tool_parser: str = "auto"
    reasoning_parser: str = "auto"
    counters: Counters = field(default_factory=Counters)

    def __post_init__(self) -> None:
        if self.max_running < 1 or self.max_waiting < 0:
            raise ValueError(f"--max-running must be >= 1 and --max-waiting >= 0, got {self.max_running}, "
                             f"{self.max_waiting}")
        self._slots = asyncio.Semaphore(self.max_running)
        self.parsers = resolve_parsers(self.backend.family, self.tool_parser, self.reasoning_parser)
        self.grammars = Grammars(self.backend.chat.tok, self.backend.vocab_size, self.backend.stop_token_ids)
        self.metrics = Metrics(self.counters, self.backend.stats)
        self.scheduler = Scheduler(self.backend, self.metrics.decode_batch.observe)

    def check_length(self, chars: int, param: str = "messages") -> None:
        """Before any rendering or tokenizing: text that cannot fit in the context whatever its tokens."""
        ctx, per_token = self.backend.max_context, self.backend.chat.max_token_chars
        if chars > ctx * per_token:
            raise APIError(400, f"the prompt is {chars} characters, more than this model's context of {ctx} tokens "
                                f"can hold ({per_token} characters per token at most)", param,
                           "context_length_exceeded")

    async def prepare(self, chat: ChatInput) -> Prompt:
        """The rendered prompt (rendering and tokenizing off the event loop), after the cheap length check."""
        self.check_length(sum(len(m.get("content") or "") for m in chat.messages))
        return await asyncio.to_thread(self.prompt, chat)

    def render(self, chat: ChatInput) -> Prompt:
        try:
            return self.backend.chat.render(chat.messages, chat.tools, **chat.template_kwargs)
        except ValueError as e:
            raise APIError(400, str(e), "messages")
        except Exception as e:  # a template that raises on these messages (jinja's own exception types)
            raise APIError(400, f"the chat template rejected these messages: {e}", "messages")

    def prompt(self, chat: ChatInput) -> Prompt:
        """The rendered prompt, if it leaves room to generate. Context-management edits that removed something get
        the tokens they cleared (the prompt rendered without them, less this one)."""
        prompt = self.render(chat)
        if chat.uncleared is not None and chat.edits:
            before = self.render(ChatInput(chat.uncleared, chat.tools, chat.params,
                                           template_kwargs=chat.template_kwargs))
            edit = next(e for e in chat.edits if e["cleared_thinking_turns"])
            edit["cleared_input_tokens"] = max(0, len(before.tokens) - len(prompt.tokens))
        self.check_room(prompt)
        return prompt

    def check_room(self, prompt: Prompt, param: str = "messages") -> None:
        n, ctx = len(prompt.tokens), self.backend.max_context
        if n >= ctx:
            raise APIError(400, f"the prompt is {n} tokens; this model's context is {ctx} tokens, "
                                f"leaving no room to generate", param, "context_length_exceeded")

    def decoder(self, chat: ChatInput) -> Decoder:
        """The request's sampling (unset fields from generation_config.json) and grammar."""
        p = chat.params
        for token in p.logit_bias:
            if not 0 <= token < self.backend.vocab_size:
                raise APIError(400, f"logit_bias: token id {token} is not in the vocabulary of "
                                    f"{self.backend.vocab_size}", "logit_bias")
        from freetoken.engine.sampling import sampling_params

        try:
            sampling = sampling_params(self.backend.generation_defaults, p.temperature, p.top_p, p.top_k, seed=p.seed)
        except ValueError as e:  # SamplingParams' messages begin with the field's name
            raise APIError(400, str(e), str(e).split(" ", 1)[0])
        grammar = None
        if p.json_schema is not None:
            try:
                grammar = GrammarMask(self.grammars.compile(p.json_schema), self.backend.vocab_size)
            except ValueError as e:
                raise APIError(400, f"{chat.schema_param}: {e}", chat.schema_param)
        return Decoder(p, sampling, grammar)

    async def run(self, chat: ChatInput, prompt: Prompt | None = None) -> AsyncIterator[Delta | Done]:
        """Deltas of text, then one Done. Raises APIError before the first event for bad or unservable requests."""
        arrived = time.perf_counter()
        prompt = prompt or await self.prepare(chat)
        decoder = await asyncio.to_thread(self.decoder, chat)  # a schema's grammar compiles off the event loop
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
        release = lambda: loop.call_soon_threadsafe(self._release_slot)  # noqa: E731
        try:
            gen = self.backend.generate(prompt, decoder, max_new)
        except BaseException:
            self._release_slot()
            raise
        self.scheduler.submit(Job(gen, lambda item: loop.call_soon_threadsafe(queue.put_nowait, item),
                                  lambda: decoder.logprob, cancel, release))
        stop_ids = self.backend.stop_token_ids
        out = RequestOutput(chat, self.backend.chat, prompt.tokens, self.parsers, decoder)
        finish, generated, finished, last = "length", 0, False, None
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item is END:
                    break
                tok, logprob = item
                now = time.perf_counter()
                if last is None:
                    self.metrics.ttft.observe(now - arrived)
                else:
                    self.metrics.inter_token.observe(now - last)
                last = now
                generated += 1
                if tok in stop_ids:
                    finish = "stop"
                    break
                for delta in out.push(tok, logprob):
                    yield delta
                if out.stopped:
                    finish = "stop"
                    break
                if generated >= max_new:
                    break
            cancel.set()
            for delta in out.finish():
                yield delta
            finish = "tool_calls" if out.calls else finish
            self.counters.served += 1
            self.metrics.finished(finish, len(prompt.tokens), generated)
            finished = True
            yield Done(out.text, finish, out.stream.stop, out.calls, len(prompt.tokens), generated,
                       gen.reused_tokens, out.reasoning, out.logprobs, gen.prompt_logprobs)
        finally:
            cancel.set()
            self.counters.cancelled += not finished

    async def complete(self, chat: ChatInput, prompt: Prompt | None = None) -> Done:
        events = [event async for event in self.run(chat, prompt)]
        return events[-1]

    def _release_slot(self) -> None:
        self.counters.running -= 1
        self._slots.release()

    def health(self) -> dict:
        return {"status": "ok", "model": self.backend.model_id, "max_context": self.backend.max_context,
                "model_context": self.backend.model_context,
                "max_running": self.max_running, **self.counters.to_dict(), "engine": self.backend.stats()}

    def shutdown(self) -> None:
        self.scheduler.shutdown()
