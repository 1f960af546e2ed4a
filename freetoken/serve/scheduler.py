"""Continuous batching: one engine thread runs every admitted sequence. Each iteration it ends the finished or
cancelled ones (closing them caches their KV, then frees their request's slot), runs one prefill chunk of each new
one (the engine's own chunk size, so the numbers equal a solo run's), then one decode step for all the others
together (one batched forward where the backend has decode_batch, so a MoE layer call is the union of their
experts), and hands each sampled token to its request's queue."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger("freetoken.serve")

END = object()  # a sequence's last item: nothing more comes


@dataclass(eq=False)
class Job:
    gen: object  # a service.Generation
    emit: Callable[[object], None]  # hands (token, logprob), an exception or END to the request (thread-safe)
    logprob: Callable[[], object]  # the logprob record of the token just sampled (None unless asked for)
    cancel: threading.Event  # set by the request: stop generating
    release: Callable[[], None]  # frees the request's slot (thread-safe)
    done: bool = False  # failed or exhausted


class Scheduler:
    def __init__(self, backend, observe_batch: Callable[[int], None]):
        self.backend, self.observe_batch = backend, observe_batch
        self.batched = hasattr(backend, "decode_batch")
        self._cv = threading.Condition()
        self._new: list[Job] = []
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name="ft-engine")
        self._thread.start()

    def submit(self, *jobs: Job) -> None:
        """Jobs given together are admitted in the same iteration."""
        with self._cv:
            self._new.extend(jobs)
            self._cv.notify()

    def shutdown(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout)

    def _loop(self) -> None:
        active: list[Job] = []
        while True:
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
            for job in [j for j in active if not j.gen.started]:  # a prefill chunk each, between decode steps
                self._step([job], lambda job=job: [next(job.gen)])
            ready = [j for j in active if j.gen.started and not j.done and not j.cancel.is_set()
                     and not j.gen.finished]
            if len(ready) > 1 and self.batched:
                self.observe_batch(len(ready))
                self._step(ready, lambda: self.backend.decode_batch([j.gen for j in ready]))
            else:
                for job in ready:
                    self.observe_batch(1)
                    self._step([job], lambda job=job: [next(job.gen)])

    @staticmethod
    def _step(jobs: list[Job], run: Callable[[], list[int]]) -> None:
        try:
            tokens = run()
        except StopIteration:  # e.g. max_tokens 0: the prefill was all
            for job in jobs:
                job.done = True
            return
        except BaseException as e:  # surfaced to each request, never lost in the thread
            log.exception("engine step failed")
            for job in jobs:
                job.emit(e)
                job.done = True
            return
        for job, token in zip(jobs, tokens):
            if token is not None:  # None: a prefill chunk, no token yet
                job.emit((token, job.logprob()))

    @staticmethod
    def _end(job: Job) -> None:
        try:
            job.gen.close()
        except BaseException as e:
            job.emit(e)
        job.emit(END)
        job.release()
