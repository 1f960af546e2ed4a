"""Random-weight checkpoints for the CPU benchmarks: a Qwen3-MoE or a hybrid Qwen3.5-MoE (Gated DeltaNet layers) of
a given shape, written by HF transformers itself (so HF, the engine and llama.cpp's converter all read the files
they expect), with the project's demo tokenizer (a byte-level BPE pre-tokenized like qwen2's).

Builds are cached: a folder named after the shape, written beside its final name and renamed into place when
complete, so an interrupted build is never taken for a finished one.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Callable

from freetoken.paths import DEMO_MODEL

FAMILIES = ("qwen3_moe", "qwen3_5_moe")
DTYPES = ("bfloat16", "float32")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True, slots=True)
class RandomMoE:
    """The shape of a random MoE checkpoint. Default: the shape of issue 29's llama.cpp comparison (2.0 GB bf16)."""

    family: str = "qwen3_moe"
    hidden: int = 1024
    layers: int = 12
    experts: int = 64
    top_k: int = 8
    moe_intermediate: int = 384
    heads: int = 16
    kv_heads: int = 4
    head_dim: int = 64
    vocab: int = 32000
    max_positions: int = 4096
    dtype: str = "bfloat16"
    seed: int = 0
    # qwen3_5_moe only: Gated DeltaNet heads, one full-attention layer in `full_attention_interval`, a shared expert
    linear_key_heads: int = 4
    linear_value_heads: int = 8
    linear_head_dim: int = 64
    full_attention_interval: int = 4
    shared_intermediate: int = 256

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family {self.family!r} is not one of {', '.join(FAMILIES)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and f.name != "seed" and (isinstance(value, bool) or value <= 0):
                raise ValueError(f"shape {f.name} must be a positive integer, got {value!r}")
        if self.top_k > self.experts:
            raise ValueError(f"shape top_k {self.top_k} exceeds experts {self.experts}")
        if self.heads % self.kv_heads:
            raise ValueError(f"shape heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        if self.vocab < 400:  # prompt ids are drawn from the demo tokenizer's 384 tokens
            raise ValueError(f"shape vocab must be at least 400 (the demo tokenizer's ids fit), got {self.vocab}")

    @classmethod
    def hf_default(cls, family: str) -> RandomMoE:
        """A smaller model for the HF comparison: expert FFNs still dominate, HF's 2048-token prefill stays short."""
        return cls(family=family, hidden=512, layers=4, experts=32, top_k=4, moe_intermediate=256, heads=8,
                   kv_heads=4, head_dim=64, vocab=2048)

    def with_overrides(self, text: str, flag: str = "--shape") -> RandomMoE:
        """`hidden=64,layers=2`: fields replaced; an unknown field or a non-integer value is an error naming flag."""
        names = {f.name: f.type for f in fields(self)}
        values: dict = {}
        for item in filter(None, (s.strip() for s in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep or key not in names or key in ("family", "dtype"):
                settable = ", ".join(n for n in names if n not in ("family", "dtype"))
                raise ValueError(f"{flag} {item!r}: expected KEY=INT with KEY one of {settable}")
            try:
                values[key] = int(value)
            except ValueError:
                raise ValueError(f"{flag} {item!r}: {value!r} is not an integer") from None
        try:
            return replace(self, **values)
        except ValueError as e:
            raise ValueError(f"{flag}: {e}") from None

    @property
    def slug(self) -> str:
        """A folder name that changes whenever any field does."""
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]
        return f"{self.family}-h{self.hidden}-l{self.layers}-e{self.experts}k{self.top_k}-{self.dtype}-{digest}"

    def hf_config(self):
        from transformers import AutoConfig

        common = dict(hidden_size=self.hidden, num_hidden_layers=self.layers, num_experts=self.experts,
                      num_experts_per_tok=self.top_k, moe_intermediate_size=self.moe_intermediate,
                      num_attention_heads=self.heads, num_key_value_heads=self.kv_heads, head_dim=self.head_dim,
                      vocab_size=self.vocab, max_position_embeddings=self.max_positions, norm_topk_prob=True,
                      tie_word_embeddings=False, eos_token_id=2, bos_token_id=None, pad_token_id=0,
                      dtype=self.dtype)
        if self.family == "qwen3_moe":
            return AutoConfig.for_model("qwen3_moe", intermediate_size=3 * self.hidden, **common)
        return AutoConfig.for_model(
            "qwen3_5_moe_text", linear_num_key_heads=self.linear_key_heads,
            linear_num_value_heads=self.linear_value_heads, linear_key_head_dim=self.linear_head_dim,
            linear_value_head_dim=self.linear_head_dim, linear_conv_kernel_dim=4,
            full_attention_interval=self.full_attention_interval,
            shared_expert_intermediate_size=self.shared_intermediate, **common)


def build_random(shape: RandomMoE, out: Path) -> Path:
    """Writes a random checkpoint of `shape` (HF's own initialisation, seeded) and the demo tokenizer to `out`."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    torch.manual_seed(shape.seed)
    model = AutoModelForCausalLM.from_config(shape.hf_config(), dtype=getattr(torch, shape.dtype))
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(DEMO_MODEL / name, out / name)
    return out


def cached(final: Path, make: Callable[[Path], object]) -> Path:
    """`final` if it exists; else make(tmp) fills a folder beside it, which is then renamed to `final`."""
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(final.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
    try:
        make(tmp)
        tmp.rename(final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
    return final


def random_checkpoint(shape: RandomMoE, work_dir: Path) -> Path:
    """The cached random checkpoint of `shape` under work_dir (built on first use)."""
    return cached(work_dir / shape.slug / "model", lambda tmp: build_random(shape, tmp))


def checkpoint_family(model: Path) -> str:
    """The benchmark family of a checkpoint directory (config.json's model_type), or a one-line error."""
    from freetoken.models.checkpoint import read_config, resolve_dir

    family = read_config(resolve_dir(model))[0].name
    name = {"qwen3_5_moe_multimodal": "qwen3_5_moe"}.get(family, family)
    if name not in FAMILIES:
        raise ValueError(f"--model {model}: a {family} checkpoint; the CPU benchmark runs {', '.join(FAMILIES)}")
    return name
