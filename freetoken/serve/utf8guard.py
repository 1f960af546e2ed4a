"""Token masks that keep constrained output valid text whatever the grammar engine admits: the bytes sampled so far
always stay a prefix of valid UTF-8 (xgrammar 0.2.8 admits UTF-8-encoded surrogates, ED A0..BF, which decode to
U+FFFD and break length and pattern checks), and under a JSON grammar no token holds a raw control character (JSON
forbids them inside strings, and the compact separators this server uses need none outside them).

One table per tokenizer: for every UTF-8 decoder state (RFC 3629's DFA, 8 states) the state each token leads to,
-1 where its bytes would break the encoding."""

from __future__ import annotations

import numpy as np
import torch

INVALID = -1


def _byte_table() -> np.ndarray:
    """[8 states, 256 bytes] -> next state; state 0 is 'between characters'."""
    t = np.full((8, 256), INVALID, dtype=np.int8)
    t[0, 0x00:0x80] = 0
    t[0, 0xC2:0xE0] = 1
    t[0, 0xE0] = 4
    t[0, 0xE1:0xED] = 2
    t[0, 0xED] = 5  # then 80..9F only: A0..BF would be a surrogate
    t[0, 0xEE:0xF0] = 2
    t[0, 0xF0] = 6
    t[0, 0xF1:0xF4] = 3
    t[0, 0xF4] = 7
    t[1, 0x80:0xC0] = 0
    t[2, 0x80:0xC0] = 1
    t[3, 0x80:0xC0] = 2
    t[4, 0xA0:0xC0] = 1
    t[5, 0x80:0xA0] = 1
    t[6, 0x90:0xC0] = 2
    t[7, 0x80:0x90] = 2
    return t


class TokenGuard:
    """Per tokenizer: next_state [8, V] and the tokens holding a control byte [V]."""

    def __init__(self, token_bytes: list[bytes], vocab_size: int):
        # T = tokens (vocab_size, the model's rows: ids past the tokenizer's have no bytes and stay banned)
        n = len(token_bytes)
        width = max((len(b) for b in token_bytes), default=1) or 1
        padded = np.zeros((n, width), dtype=np.uint8)  # [T, L]
        lengths = np.array([len(b) for b in token_bytes])  # [T]
        for i, b in enumerate(token_bytes):
            padded[i, :len(b)] = np.frombuffer(b, dtype=np.uint8)
        table = _byte_table()
        nxt = np.full((8, vocab_size), INVALID, dtype=np.int8)
        for start in range(8):
            state = np.full(n, start, dtype=np.int8)  # [T]
            for pos in range(width):
                live = (pos < lengths) & (state != INVALID)
                state[live] = table[state[live], padded[live, pos]]
            nxt[start, :n] = state
        self.next_state = nxt
        self.allowed = torch.from_numpy(nxt != INVALID)  # [8, V]
        control = np.zeros(vocab_size, dtype=bool)
        control[:n] = ((padded < 0x20) & (np.arange(width)[None, :] < lengths[:, None])).any(axis=1)
        self.control = torch.from_numpy(control)  # [V]


class GuardState:
    """One request's position in the UTF-8 DFA."""

    def __init__(self, guard: TokenGuard, no_control: bool, exempt: list[int]):
        self.guard, self.no_control, self.state = guard, no_control, 0
        self.exempt = torch.tensor(exempt, dtype=torch.long)  # stop tokens: the grammar alone decides them

    def mask(self, logits: torch.Tensor) -> None:
        """logits [V] (any device), in place: tokens that would break the text -> -inf."""
        banned = ~self.guard.allowed[self.state]
        if self.no_control:
            banned = banned | self.guard.control
        if len(self.exempt):
            banned[self.exempt] = False
        logits.masked_fill_(banned.to(logits.device), float("-inf"))

    def accept(self, token: int) -> None:
        nxt = int(self.guard.next_state[self.state, token])
        self.state = 0 if nxt == INVALID else nxt  # an exempt (stop) token
