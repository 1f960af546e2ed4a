"""Continuous batching: one engine thread runs every admitted sequence. Each iteration it ends the finished or
cancelled ones (closing them caches their KV, then tells their request), runs one prefill chunk of each new one
(the engine's own chunk size, so the numbers equal a solo run's), then one decode step for all the others together
(one batched forward where the backend has decode_logits, so a MoE layer call is the union of their experts), and
hands each sampled token to its request. A batched step reads its choices back once: every sequence shapes its row
of the logits on their device (shape_), one choose() samples and checks the batch, one read brings the step's
choices back, then each commits.

Faults stay with their sequence: sampling (grammar, NaN logits, a request's own limits) runs per sequence after the
shared forward, so a sequence that fails there fails alone; a batched forward that fails is undone (the backend
cuts every KV back) and its sequences are stepped one at a time, so only the one that fails on its own fails."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

log = logging.getLogger("freetoken.serve")

END = object()  # a sequence's last item: nothing more comes


@dataclass(eq=False)
class Job:
    gen: object  # a service.Generation
    emit: Callable[[object], None]  # hands (token, logprob), an exception or END to the request (thread-safe)
    logprob: Callable[[], object]  # the logprob record of the token just sampled (None unless asked for)
    cancel: threading.Event  # set by the request: stop generating
    release: Callable[[], None]  # called once the sequence has ended (thread-safe)
    done: bool = False  # failed or exhausted


class Scheduler:
    def __init__(self, backend, observe_batch: Callable[[int], None], after_step: Callable[[], None] = lambda: None):
        """after_step: called on the engine thread to deliver the items emitted so far (the service hands them to
        their requests with one event-loop wakeup): as the next forward begins, so that the event loop's work on
        them overlaps the forward's native call (which frees the GIL; right after the step it contended with the
        engine thread's own Python), before a prefill chunk, and before the engine thread waits for work."""
        self.backend, self.observe_batch, self.after_step = backend, observe_batch, after_step
        self.batched = hasattr(backend, "decode_logits")
        self._cv = threading.Condition()
        self._new: list[Job] = []
        self.active: list[Job] = []  # the engine thread's; others only read it (the KV-usage gauge)
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name="ft-engine")
        self._thread.start()

    def submit(self, *jobs: Job) -> None:
        """Jobs given together are admitted in the same iteration, in order (a follower after its leader)."""
        with self._cv:
            self._new.extend(jobs)
            self._cv.notify()

    def shutdown(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout)

    def _loop(self) -> None:
        active = self.active
        while True:
            if not self._new and not active:  # (read unlocked: at worst one flush too many)
                self.after_step()  # nothing left to run: deliver the last step's items before waiting
            with self._cv:
                while not self._new and not active and not self._stop:
                    self._cv.wait()
                if self._stop:
                    break
                active += self._new
                self._new.clear()
            for job in [j for j in active if j.done or j.cancel.is_set() or j.gen.finished]:
                active.remove(job)
                self._end(job)
            starting = [j for j in active if not j.gen.started]
            if starting:
                self.after_step()  # (a prefill chunk can be long: what the last step emitted goes out first)
            for job in starting:  # a prefill chunk each, between decode steps
                self._solo(job)
            ready = [j for j in active if j.gen.started and not j.done and not j.cancel.is_set()
                     and not j.gen.finished]
            self.after_step()  # the last step's tokens to their requests now, as this step's forward begins
            if len(ready) > 1 and self.batched:
                self._batch(ready)
            else:
                for job in ready:
                    self.observe_batch(1)
                    self._solo(job)
        self.after_step()

    def _batch(self, jobs: list[Job]) -> None:
        try:
            rows = self.backend.decode_logits([j.gen for j in jobs])
        except Exception:
            log.exception("batched decode step failed; stepping its %d sequences one at a time", len(jobs))
            for job in jobs:
                self.observe_batch(1)
                self._solo(job)
            return
        self.observe_batch(len(jobs))
        logits = rows.detach().float()  # [B, V]
        shaped = logits.clone()  # each sequence shapes its own row, then one choose() samples and checks them all
        ok = [b for b, job in enumerate(jobs)  # (True unless the sequence failed)
              if self._attempt(job, lambda job=job, b=b: job.gen.shape_(logits[b], shaped[b]) or True)]
        if not ok:
            return
        if len(ok) < len(jobs):
            logits, shaped = logits[ok], shaped[ok]
        gens = [jobs[b].gen for b in ok]
        try:
            values = gens[0].choose(gens, logits, shaped).tolist()  # [B, 3]: the step's one read-back
        except Exception:  # a sequence's own draw failed: each chooses alone, so that one fails alone
            values = [self._attempt(jobs[b], lambda g=g, i=i: g.choose([g], logits[i], shaped[i]).tolist())
                      for i, (b, g) in enumerate(zip(ok, gens))]
        for b, v in zip(ok, values):
            if v is not None:
                self._run(jobs[b], lambda job=jobs[b], v=v: job.gen.commit(v))

    def _solo(self, job: Job) -> None:
        self._run(job, lambda: next(job.gen))

    @classmethod
    def _run(cls, job: Job, step: Callable[[], int | None]) -> None:
        """One step of one sequence; what goes wrong goes to its request alone."""
        token = cls._attempt(job, step)
        if token is not None:  # None: a prefill chunk, no token yet (or the step failed)
            job.emit((token, job.logprob()))

    @staticmethod
    def _attempt(job: Job, step: Callable[[], Any]) -> Any:
        """step()'s result, or None with its failure handed to the job's request (never lost in the thread)."""
        try:
            return step()
        except StopIteration:  # e.g. max_tokens 0: the prefill was all
            job.done = True
        except Exception as e:
            if getattr(e, "status", 500) >= 500:
                log.exception("sequence failed")
            job.emit(e)
            job.done = True
        return None

    @staticmethod
    def _end(job: Job) -> None:
        try:
            job.gen.close()
        except Exception as e:
            job.emit(e)
        job.emit(END)
        job.release()
