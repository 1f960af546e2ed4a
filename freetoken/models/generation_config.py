"""generation_config.json: the stop ids and default sampling a checkpoint ships, read as transformers'
GenerationConfig reads them (HF generate stops at its eos ids; vLLM and HF take its sampling defaults: temperature,
top_p, top_k, min_p, repetition_penalty)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from freetoken.models.config import CheckpointError

FILE = "generation_config.json"


@dataclass(frozen=True, slots=True)
class GenerationDefaults:
    eos_token_ids: tuple[int, ...] = ()
    temperature: float | None = None  # None: not set (the caller's own default applies)
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None

    @classmethod
    def load(cls, model_dir: str | Path) -> "GenerationDefaults":
        """The directory's generation_config.json; all unset when it has none. A do_sample of false (HF: greedy)
        is temperature 0."""
        path = Path(model_dir) / FILE
        if not path.is_file():
            return cls()
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path}: not readable JSON ({e})") from None
        if not isinstance(raw, dict):
            raise CheckpointError(f"{path}: expected a JSON object")
        eos = raw.get("eos_token_id")
        eos = [] if eos is None else (eos if isinstance(eos, list) else [eos])
        if not all(isinstance(e, int) and e >= 0 for e in eos):
            raise CheckpointError(f"{path}: eos_token_id must be token ids, got {raw.get('eos_token_id')!r}")
        temperature = _number(raw, "temperature", path)
        if raw.get("do_sample") is False:
            temperature = 0.0
        top_k = _number(raw, "top_k", path)
        if top_k is not None and not top_k.is_integer():  # int() would cut 2.5 to 2, and fail on Infinity
            raise CheckpointError(f"{path}: top_k must be a whole number, got {raw['top_k']!r}")
        return cls(tuple(eos), temperature, _number(raw, "top_p", path), None if top_k is None else int(top_k),
                   _number(raw, "min_p", path), _number(raw, "repetition_penalty", path))


def _number(raw: dict, name: str, path: Path) -> float | None:
    value = raw.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
        raise CheckpointError(f"{path}: {name} must be a non-negative number, got {value!r}")
    return None if value is None else float(value)
