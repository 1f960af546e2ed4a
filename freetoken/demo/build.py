"""The shipped demo checkpoint: a tiny random-weight Qwen3-MoE and a byte-level BPE tokenizer, built offline.

Deterministic (fixed seeds, one shipped corpus) and small (< 1 MB), so the built copy lives in the repository
and `ft generate` runs with no download. Rebuild with `ft demo build [--out DIR]`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus.txt"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 384
CHAT_TEMPLATE = (  # ChatML
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MODEL_SHAPE = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                   norm_topk_prob=True, max_position_embeddings=2048, initializer_range=0.1)
SEED = 0
DEMO_FILES = frozenset({"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                        "tokenizer_config.json"})  # what a build writes: all a rebuild may replace


def build_tokenizer(out: Path, context: int = MODEL_SHAPE["max_position_embeddings"]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(CORPUS)], trainer)
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "bos_token": None, "model_max_length": context,
              "chat_template": CHAT_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return tok


def build_model(out: Path, vocab_size: int, eos_id: int, pad_id: int,
                context: int = MODEL_SHAPE["max_position_embeddings"]) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("qwen3_moe", vocab_size=vocab_size, eos_token_id=eos_id, pad_token_id=pad_id,
                               bos_token_id=None, tie_word_embeddings=False,
                               **{**MODEL_SHAPE, "max_position_embeddings": context})
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(out)


def check_out(out: Path) -> None:
    """`out` is replaced whole: refuse a file, or a folder holding anything a demo build did not write."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: is a file; give a folder for the demo checkpoint")
    others = sorted(p.name for p in out.iterdir() if p.name not in DEMO_FILES) if out.is_dir() else []
    if others:
        more = f" and {len(others) - 1} more" if len(others) > 1 else ""
        raise ValueError(f"{out}: holds {others[0]}{more}, not only a demo checkpoint; give a new or empty folder "
                         f"(a build replaces the whole folder)")


def build_demo(out: str | os.PathLike, context: int = MODEL_SHAPE["max_position_embeddings"]) -> Path:
    """Write the demo checkpoint into `out`, replacing it only once the new copy is complete. context: its
    max_position_embeddings (the weights do not depend on it: RoPE without scaling), e.g. 32768 to serve coding
    agents, whose first request is several thousand tokens."""
    if not isinstance(context, int) or context < 16:
        raise ValueError(f"--context must be a whole number of tokens >= 16, got {context}")
    from freetoken.io import cannot_write

    out = Path(out)
    check_out(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as e:
        raise cannot_write(out, e) from None
    try:
        tok = build_tokenizer(tmp, context)
        build_model(tmp, tok.get_vocab_size(), tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>"),
                    context)
        os.chmod(tmp, 0o755)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
