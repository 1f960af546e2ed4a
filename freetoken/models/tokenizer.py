"""The checkpoint's tokenizer (tokenizer.json + tokenizer_config.json with its chat template), read offline."""

from __future__ import annotations

from pathlib import Path

from freetoken.models.config import CheckpointError


def load_tokenizer(path: str | Path):
    """A transformers fast tokenizer, or None when the directory has no tokenizer.json."""
    path = Path(path)
    if not (path / "tokenizer.json").is_file():
        return None
    from transformers import PreTrainedTokenizerFast

    try:
        return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # transformers raises many types for a bad tokenizer file
        raise CheckpointError(f"{path / 'tokenizer.json'}: cannot be loaded as a tokenizer ({e})") from None


def chat_prompt(tokenizer, text: str, system: str | None = None) -> list[int]:
    """The token ids of one user turn rendered with the model's chat template, ready for the assistant reply."""
    if tokenizer is None:
        raise ValueError("--chat needs a tokenizer: the model directory has no tokenizer.json")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("--chat needs a chat template: tokenizer_config.json has no 'chat_template'")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(rendered, add_special_tokens=False))
