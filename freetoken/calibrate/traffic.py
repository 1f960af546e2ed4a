"""Bytes one decode token reads, from the weights it touches in their stored format, and the memory read bandwidth
they are compared with.

A decode token reads its top-k experts in every MoE layer (at the format's bytes: packed values and scales), every
dense weight once (attention, norms, router, shared expert, lm_head) and one row of the embedding. For ft that is
counted from the loaded checkpoint's tensors; for llama.cpp from the GGUF file's tensor sizes, where a layer's
experts are one tensor of all E (so k / E of it is read).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

GGUF_EXPERTS = re.compile(r"\.ffn_(gate|up|down|gate_up)_exps\.")
GGUF_EMBEDDING = "token_embd.weight"
GGUF_LM_HEAD = "output.weight"


@dataclass(frozen=True, slots=True)
class Traffic:
    experts: float  # the active experts of every MoE layer
    dense: float  # everything else read in full, lm_head excluded
    lm_head: float
    embedding_row: float

    @property
    def total(self) -> float:
        return self.experts + self.dense + self.lm_head + self.embedding_row

    def to_dict(self) -> dict:
        return {"experts": round(self.experts), "dense": round(self.dense), "lm_head": round(self.lm_head),
                "embedding_row": round(self.embedding_row), "total": round(self.total)}


def tensor_bytes(t) -> int:
    """A tensor's bytes, or a PackedWeight's (its values and every scale / zero tensor)."""
    from freetoken.quant.packed import PackedWeight

    if isinstance(t, PackedWeight):
        return sum(x.numel() * x.element_size() for x in t.tensors().values())
    return t.numel() * t.element_size()


def classify(sizes: Iterable[tuple[str, int]], is_expert: Callable[[str], bool], embedding: str, lm_head: str,
             top_k: int, experts: int, vocab: int) -> Traffic:
    """sizes: (name, bytes) of every tensor; an expert tensor holds all E experts of its layer (k / E of it read)."""
    ex = dense = head = row = 0.0
    for name, n in sizes:
        if is_expert(name):
            ex += n * top_k / experts
        elif name == embedding:
            row += n / vocab
        elif name == lm_head:
            head += n
        else:
            dense += n
    return Traffic(ex, dense, head, row)


def engine_traffic(engine) -> Traffic:
    """A loaded ft engine: its expert store's bytes per expert, its checkpoint's dense tensors, the head it computes
    with (the checkpoint's, or one quantized at load: --lm-head int8)."""
    cfg, store = engine.config, engine.store
    dense = [(name, tensor_bytes(t)) for name, t in engine.checkpoint.dense.items()]
    head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    t = classify(dense, lambda name: False, "model.embed_tokens.weight", head, cfg.top_k, cfg.num_experts,
                 cfg.vocab_size)
    head_weights = engine.decoder.lm_head
    row = 0.0 if head_weights is engine.decoder.embed else t.embedding_row  # tied: the one matrix is read whole
    experts = store.expert_bytes * cfg.top_k * store.num_layers
    return Traffic(float(experts), t.dense, float(tensor_bytes(head_weights)), row)


def gguf_sizes(path: Path) -> list[tuple[str, int]]:
    """(name, bytes) of every tensor of a GGUF file (the `gguf` package: PyPI's, or llama.cpp's gguf-py)."""
    from gguf import GGUFReader

    return [(t.name, int(t.n_bytes)) for t in GGUFReader(str(path)).tensors]


def gguf_traffic(path: Path, top_k: int, experts: int, vocab: int) -> Traffic:
    return classify(gguf_sizes(path), lambda name: bool(GGUF_EXPERTS.search(name)), GGUF_EMBEDDING, GGUF_LM_HEAD,
                    top_k, experts, vocab)


class ReadProbe:
    """Sustained host memory read (GB/s) at a thread count: bench bw's streaming reduction over one buffer, kept
    for the whole run (a fresh one per reading would time the allocator's page faults into the first pass)."""

    def __init__(self, buffer_bytes: int, seconds: float):
        import torch

        self.buf = torch.ones(buffer_bytes // 4, dtype=torch.float32)
        self.seconds = seconds

    def __call__(self, threads: int) -> float:
        from freetoken.calibrate.measure import sustain
        from freetoken.engine.runtime import set_host_threads

        set_host_threads(threads)
        return sustain(lambda: self.buf.sum(), self.buf.numel() * 4, self.seconds).gb_s
