"""A batched decode step reads its sequences' choices back once: the scheduler has every sequence propose (shape and
sample on the logits' device) before any commits, stacks the proposals into one read, and a sequence whose
proposal fails fails alone."""

from __future__ import annotations

import threading

import torch

from freetoken.serve.errors import APIError
from freetoken.serve.scheduler import END, Job, Scheduler


class Gen:
    """A started sequence that proposes row[0] + its index and ends after `steps` tokens."""

    def __init__(self, k: int, log: list, steps: int = 3, fail_at: int | None = None, draw_fails_at: int | None = None):
        self.k, self.log, self.steps, self.fail_at, self.draw_fails_at = k, log, steps, fail_at, draw_fails_at
        self.started, self.generated, self.closed = True, [], False

    @property
    def finished(self) -> bool:
        return self.closed or len(self.generated) >= self.steps

    def shape_(self, logits: torch.Tensor, shaped: torch.Tensor) -> None:
        self.log.append(("propose", self.k))
        if self.fail_at == len(self.generated):
            raise APIError(400, f"sequence {self.k} cannot go on", None, "no_token_allowed")
        shaped[0] += self.k

    @staticmethod
    def choose(gens, logits: torch.Tensor, shaped: torch.Tensor) -> torch.Tensor:
        """[B, V] -> [B, 3] ([V] -> [3] for one); raises for all where one's draw fails (a sampler's own error)."""
        if any(g.draw_fails_at == len(g.generated) for g in gens):
            raise RuntimeError("a draw failed")
        rows = shaped.view(len(gens), -1)
        zero = torch.zeros(len(gens), dtype=torch.long)
        return torch.stack([rows[:, 0].long(), zero, zero], 1).view(*shaped.shape[:-1], 3)

    def commit(self, values: list[int]) -> int:
        self.log.append(("commit", self.k))
        self.generated.append(values[0])
        return values[0]

    def close(self) -> None:
        self.closed = True


class Backend:
    def __init__(self):
        self.steps = 0

    def decode_logits(self, gens) -> torch.Tensor:
        self.steps += 1
        return torch.full((len(gens), 5), 10 * self.steps, dtype=torch.long)


def _serve(gens) -> tuple[list[list[int]], list]:
    """The sequences through a Scheduler over Backend until each ends: (tokens, error) per sequence."""
    tokens, errors, done = [[] for _ in gens], [None] * len(gens), threading.Semaphore(0)

    def emit(item, k):
        if isinstance(item, BaseException):
            errors[k] = item
        elif item is not END:
            tokens[k].append(item[0])

    jobs = [Job(g, lambda item, k=k: emit(item, k), lambda: None, threading.Event(), done.release)
            for k, g in enumerate(gens)]
    scheduler = Scheduler(Backend(), lambda n: None)
    try:
        scheduler.submit(*jobs)
        for _ in jobs:
            assert done.acquire(timeout=30)
    finally:
        scheduler.shutdown()
    return tokens, errors


def test_a_batched_step_proposes_every_sequence_then_reads_back_once(monkeypatch):
    log, reads = [], []
    real = torch.Tensor.tolist

    def tolist(t):
        reads.append(tuple(t.shape))
        return real(t)

    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    gens = [Gen(k, log, fail_at=1 if k == 2 else None) for k in range(4)]
    tokens, errors = _serve(gens)
    assert tokens[0] == [10, 20, 30] and tokens[3] == [13, 23, 33]  # row[0] + k, step after step
    assert tokens[2] == [12] and errors[2].code == "no_token_allowed" and errors[:2] + errors[3:] == [None] * 3
    proposes = lambda ks: [("propose", k) for k in ks]  # noqa: E731
    commits = lambda ks: [("commit", k) for k in ks]  # noqa: E731
    assert log == (proposes(range(4)) + commits(range(4)) + proposes(range(4)) + commits((0, 1, 3)) +
                   proposes((0, 1, 3)) + commits((0, 1, 3)))  # every proposal of a step before its commits
    assert reads == [(4, 3), (3, 3), (3, 3)]  # one [B, 3] read per step, none per sequence


def test_a_failed_draw_fails_its_own_sequence_alone():
    """choose() raising for the batch: each sequence chooses again alone; only the one whose draw fails fails."""
    log = []
    gens = [Gen(k, log, draw_fails_at=1 if k == 1 else None) for k in range(3)]
    tokens, errors = _serve(gens)
    assert tokens == [[10, 20, 30], [11], [12, 22, 32]]
    assert isinstance(errors[1], RuntimeError) and errors[0] is None and errors[2] is None
