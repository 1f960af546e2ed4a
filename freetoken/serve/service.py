"""The generation service behind every API: a request queue with a bounded number of running requests, all
driven by one engine thread (scheduler.py: continuous batching, one decode step for all running sequences), each
request's tokens streamed back to the event loop and turned into text, reasoning and tool calls there. A request
may hold several sequences (n samples of a prompt, which share its prefilled KV, and batched prompts); they decode
in the same batch and come back as choices by index.

A request's slot is freed when the engine thread has closed all its sequences, not before, so a client that
disconnects mid-stream cannot leave work running in a freed slot.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol

from freetoken.serve.chat import ChatInput, ChatTokenizer, Prompt
from freetoken.serve.config import DEFAULT_MAX_RUNNING
from freetoken.serve.decoding import TokenLogprob, make_decoder, stop_ids
from freetoken.serve.errors import APIError
from freetoken.serve.grammar import Grammars, validate
from freetoken.serve.inbox import Inbox
from freetoken.serve.metrics import Metrics
from freetoken.serve.output import Delta, RequestOutput
from freetoken.serve.parsers import resolve_parsers
from freetoken.serve.scheduler import END, Job, Scheduler
from freetoken.serve.stopmatch import StopAutomaton
from freetoken.serve.tools import ToolCall

log = logging.getLogger("freetoken.serve")
MAX_SEQUENCES = 128  # n x prompts of one request (OpenAI's n is at most 128)


class Generation(Protocol):
    """Sampled token ids, one per step; close() ends the sequence (and caches its KV)."""

    reused_tokens: int  # prompt tokens served from the prefix cache, known after the first step

    prompt_logprobs: list | None  # per prompt token (None for the first), when the params asked for them

    started: bool  # prefilled: the next step is a decode step
    finished: bool  # no more tokens: max_new reached, a stop token sampled, or closed

    def __next__(self) -> int | None:
        """The next token; None after a prefill chunk that is not the prompt's last."""

    def close(self) -> None: ...

    def follow(self, leader: "Generation") -> None:
        """Start from the leader's prefilled prompt (the same prompt) where the sequence can, instead of
        prefilling it again."""


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

    def generate(self, prompt: Prompt, decoder, max_new: int, stop_token_ids: set[int] | None = None) -> "Generation":
        """A sequence, not started yet (no work in the call itself); stop_token_ids: the request's (None: the
        model's)."""

    def stats(self) -> dict:
        """Counters for /health (reused vs computed prompt tokens, ...)."""

    # optional: decode_logits(gens) -> their logits [B, V], one decode step of several started sequences together
    # (their Generations then take shape_() and choose(), generation.py)


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
    index: int = 0  # the choice: prompt i's sample j is i * n + j
    cumulative_logprob: float = 0.0  # of the sampled tokens (when tracked: best_of)


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
        self.metrics = Metrics(self.counters, self.backend.stats, self.kv_usage, self.backend.model_id)
        self._inboxes: dict[asyncio.AbstractEventLoop, Inbox] = {}
        self.scheduler = Scheduler(self.backend, self.metrics.decode_batch.observe, self._flush_inboxes)

    # prompts
    def check_length(self, chars: int, param: str = "messages") -> None:
        """Before any rendering or tokenizing: text that cannot fit in the context whatever its tokens."""
        ctx, per_token = self.backend.max_context, self.backend.chat.max_token_chars
        if chars > ctx * per_token:
            raise APIError(400, f"the prompt is {chars} characters, more than this model's context of {ctx} tokens "
                                f"can hold ({per_token} characters per token at most)", param,
                           "context_length_exceeded")

    async def prepare(self, chat: ChatInput) -> Prompt:
        """The rendered prompt (rendering and tokenizing off the event loop), after the cheap length check."""
        if not chat.params.truncate_prompt_tokens:
            self.check_length(sum(len(m.get("content") or "") for m in chat.messages))
        return await asyncio.to_thread(self.prompt, chat)

    def render(self, chat: ChatInput) -> Prompt:
        try:
            return self.backend.chat.render(chat.messages, chat.tools, chat.add_generation_prompt,
                                            chat.continue_final_message, chat.chat_template, **chat.template_kwargs)
        except ValueError as e:
            raise APIError(400, str(e), "messages")
        except Exception as e:  # a template that raises on these messages (jinja's own exception types)
            raise APIError(400, f"the chat template rejected these messages: {e}", "messages")

    def prompt(self, chat: ChatInput) -> Prompt:
        """The rendered prompt (its last truncate_prompt_tokens), if it leaves room to generate. Context-management
        edits that removed something get the tokens they cleared (the prompt rendered without them, less this
        one)."""
        prompt = truncated(self.render(chat), chat.params.truncate_prompt_tokens)
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

    # generation
    async def run(self, chat: ChatInput, prompt: Prompt | None = None) -> AsyncIterator[Delta | Done]:
        """One sequence: deltas of text, then one Done. Raises APIError before the first event for bad or
        unservable requests."""
        async for _, event in self.run_many(chat, [prompt] if prompt else None):
            yield event

    async def complete(self, chat: ChatInput, prompt: Prompt | None = None) -> Done:
        return (await self.complete_many(chat, [prompt] if prompt else None))[0]

    async def complete_many(self, chat: ChatInput, prompts: list[Prompt] | None = None, n: int = 1) -> list[Done]:
        """Every sequence's Done, by index."""
        done = [event async for _, event in self.run_many(chat, prompts, n) if isinstance(event, Done)]
        return sorted(done, key=lambda d: d.index)

    async def run_many(self, chat: ChatInput, prompts: list[Prompt] | None = None,
                       n: int = 1) -> AsyncIterator[tuple[int, Delta | Done]]:
        """(index, Delta or Done) of n samples of each prompt (prompt i's sample j is index i * n + j), as they
        come; raises APIError before the first event for bad or unservable requests. A sequence that fails fails
        its request (an APIError from the event iterator); other requests decoding beside it go on unharmed."""
        arrived = time.perf_counter()
        prompts = prompts or [await self.prepare(chat)]
        if len(prompts) * n > MAX_SEQUENCES:
            raise APIError(400, f"n: {len(prompts)} prompts x n={n} is more than {MAX_SEQUENCES} sequences", "n")
        order = [(i, j) for i in range(len(prompts)) for j in range(n)]
        def build():  # grammars compile and the stop automaton is built off the event loop
            return ([make_decoder(self.backend, self.grammars, chat.params, prompts[i].tokens, j) for i, j in order],
                    StopAutomaton([s for s in chat.params.stop if s]))

        decoders, stop_strings = await asyncio.to_thread(build)
        stops = stop_ids(self.backend, chat.params)
        room = [self.backend.max_context - len(p.tokens) for p in prompts]
        max_new = [r if chat.params.max_tokens is None else min(chat.params.max_tokens, r) for r in room]
        if self.counters.waiting >= self.max_waiting and self._slots.locked():
            self.counters.rejected += 1
            raise APIError(503, f"server busy: {self.counters.running} running, {self.counters.waiting} waiting")
        self.counters.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.counters.waiting -= 1
        self.counters.running += 1
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        ended = [0]

        def end_one():  # on the engine thread: the slot goes back once every sequence has ended
            ended[0] += 1
            if ended[0] == len(order):
                loop.call_soon_threadsafe(self._release_slot)

        try:
            gens = [self.backend.generate(prompts[i], decoders[k], max_new[i], stops) for k, (i, _) in enumerate(order)]
        except BaseException:
            self._release_slot()
            raise
        for k, (i, j) in enumerate(order):
            if j:
                gens[k].follow(gens[k - j])  # shares the first sample's prefilled prompt
        inbox = self._inboxes.get(loop) or self._inboxes.setdefault(loop, Inbox(loop))
        jobs = [Job(gen, lambda item, k=k: inbox.put(queue, (k, item)),
                    lambda d=decoders[k]: d.logprob, threading.Event(), end_one) for k, gen in enumerate(gens)]
        self.scheduler.submit(*jobs)
        outs = [RequestOutput(chat, self.backend.chat, prompts[i].tokens, self.parsers, decoders[k], stop_strings)
                for k, (i, _) in enumerate(order)]
        generated, last, first = [0] * len(order), [None] * len(order), None
        open_ = set(range(len(order)))
        finished = False
        try:
            while open_:
                k, item = await queue.get()
                if k not in open_:
                    continue  # a token that arrived after this sequence was ended
                if isinstance(item, BaseException):
                    raise item
                finish = None
                if item is END:
                    finish = "length"
                else:
                    tok, logprob = item
                    now = time.perf_counter()
                    if first is None:
                        first = now
                        self.metrics.ttft.observe(now - arrived)
                    elif last[k] is not None:
                        self.metrics.inter_token.observe(now - last[k])
                    last[k] = now
                    generated[k] += 1
                    if tok in stops:
                        finish = "stop"
                    else:
                        for delta in outs[k].push(tok, logprob):
                            yield k, delta
                        if outs[k].stopped:
                            finish = "stop"
                        elif generated[k] >= max_new[order[k][0]]:
                            finish = "length"
                if finish is None:
                    continue
                open_.discard(k)
                jobs[k].cancel.set()
                for delta in outs[k].finish():
                    yield k, delta
                done = self._done(chat, outs[k], gens[k], decoders[k], prompts[order[k][0]], finish, generated[k], k)
                self.metrics.finished(done.finish, done.prompt_tokens, done.completion_tokens)
                yield k, done
            self.counters.served += 1
            self.metrics.request_done(arrived, started, first, time.perf_counter())
            finished = True
        finally:
            for job in jobs:
                job.cancel.set()
            self.counters.cancelled += not finished

    def _done(self, chat: ChatInput, out: RequestOutput, gen, decoder, prompt: Prompt, finish: str, generated: int,
              index: int) -> Done:
        """A sequence's result, its constraint checked again on the text it returns (a failure is counted in
        /metrics, logged, and a 500: the reply is not what was asked for)."""
        finish = "tool_calls" if out.calls else finish
        constraint = chat.params.constraint
        if constraint is not None and finish != "length":  # cut by max_tokens: incomplete, as the finish says
            why = validate(constraint, out.stream.text, self.grammars)
            if why is not None:
                self.metrics.structured_invalid.labels(constraint.kind).inc()
                log.error("structured output failed its own check (%s %s): %s; text: %.2000r", constraint.kind,
                          constraint.param, why, out.stream.text)
                raise APIError(500, f"{constraint.param}: the reply does not satisfy the constraint ({why})", None,
                               "structured_output_invalid")
        return Done(out.text, finish, out.stream.stop, out.calls, len(prompt.tokens), generated, gen.reused_tokens,
                    out.reasoning, out.logprobs, gen.prompt_logprobs, index, decoder.cumulative)

    def _flush_inboxes(self) -> None:
        for inbox in list(self._inboxes.values()):
            inbox.flush()

    def _release_slot(self) -> None:
        self.counters.running -= 1
        self._slots.release()

    def kv_usage(self) -> float:
        """KV tokens held by running sequences and the prefix cache over the plan's KV tokens (0 when unknown)."""
        total = getattr(self.backend, "kv_tokens", 0)
        if not total:
            return 0.0
        running = sum(getattr(getattr(job.gen, "seq", None), "length", 0) for job in list(self.scheduler.active))
        cached = ((self.backend.stats().get("prefix_cache") or {}).get("cached_tokens", 0))
        return min(1.0, (running + cached) / total)

    def health(self) -> dict:
        return {"status": "ok", "model": self.backend.model_id, "max_context": self.backend.max_context,
                "model_context": self.backend.model_context,
                "max_running": self.max_running, **self.counters.to_dict(), "engine": self.backend.stats()}

    def shutdown(self) -> None:
        self.scheduler.shutdown()


def truncated(prompt: Prompt, keep: int | None) -> Prompt:
    """The last `keep` tokens of a prompt (vLLM's truncate_prompt_tokens), its anchors moved with them."""
    if not keep or len(prompt.tokens) <= keep:
        return prompt
    cut = len(prompt.tokens) - keep
    return Prompt(prompt.tokens[cut:], [a - cut for a in prompt.anchors if a > cut])
