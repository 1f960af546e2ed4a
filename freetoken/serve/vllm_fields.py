"""The request fields a vLLM user sends beside OpenAI's, shared by /v1/chat/completions and /v1/completions: each
one implemented (into Params) or refused with a 400 naming it, and the structured-output constraint from whichever
field asked for one (OpenAI's response_format, vLLM's structured_outputs or its older guided_* names; two at once
is a 400)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from freetoken.serve.chat import Params
from freetoken.serve.errors import APIError
from freetoken.serve.grammar import Constraint
from freetoken.serve.stopmatch import check_stops

MAX_TOKEN_LISTS = 4096  # ids in stop_token_ids / allowed_token_ids, words in bad_words
GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
STRUCTURED_KINDS = {"json": "json", "regex": "regex", "choice": "choice", "grammar": "grammar"}
REFUSED_EXTRAS = {"use_beam_search": "no beam search; use n or best_of",
                  "logits_processors": "no server-side logits processors",
                  "guided_decoding_backend": "the backend is xgrammar", "guided_whitespace_pattern": "compact JSON only"}


class VLLMFields(BaseModel):
    """vLLM's sampling extensions (the OpenAI request models inherit them)."""

    top_k: int | None = Field(None, ge=-1)  # -1 or 0: no cut (vLLM's spelling of none)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0, le=10)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = Field(None, max_length=MAX_TOKEN_LISTS)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    allowed_token_ids: list[int] | None = Field(None, min_length=1, max_length=MAX_TOKEN_LISTS)
    bad_words: list[str] | None = Field(None, max_length=MAX_TOKEN_LISTS)
    truncate_prompt_tokens: int | None = Field(None, ge=1)
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    return_tokens_as_token_ids: bool = False
    structured_outputs: dict[str, Any] | None = None  # {"json" | "regex" | "choice" | "grammar" | "json_object"}
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


def check_stop(stop, param: str = "stop") -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    try:
        check_stops(stops, param)
    except ValueError as e:
        raise APIError(400, str(e), param) from None
    return stops


def apply_extras(req: VLLMFields, params: Params) -> Params:
    """The vLLM fields into Params (refused ones are a 400 naming them)."""
    for name, why in REFUSED_EXTRAS.items():
        value = (req.model_extra or {}).get(name)
        if value not in (None, False, []):
            raise APIError(400, f"{name}: not supported by this server ({why})", name)
    if req.min_tokens and params.max_tokens is not None and req.min_tokens > params.max_tokens:
        raise APIError(400, f"min_tokens: {req.min_tokens} is more than max_tokens ({params.max_tokens})",
                       "min_tokens")
    if req.ignore_eos and params.constraint is not None:
        raise APIError(400, "ignore_eos: a constrained output ends where its grammar ends", "ignore_eos")
    params.top_k = None if req.top_k is None else max(0, req.top_k)
    params.min_p, params.repetition_penalty = req.min_p, req.repetition_penalty  # None: the model's defaults
    params.min_tokens, params.ignore_eos = req.min_tokens, req.ignore_eos
    params.stop_token_ids = list(req.stop_token_ids or [])
    params.include_stop_str_in_output = req.include_stop_str_in_output
    params.skip_special_tokens = req.skip_special_tokens
    params.allowed_token_ids = req.allowed_token_ids
    params.bad_words = [w for w in req.bad_words or [] if w]
    params.truncate_prompt_tokens = req.truncate_prompt_tokens
    if req.prompt_logprobs is not None:
        params.prompt_logprobs = req.prompt_logprobs
    return params


def constraint_of(req: VLLMFields, schema: dict | None, schema_param: str) -> Constraint | None:
    """The one structured-output constraint a request asks for: response_format's schema (given), vLLM's
    structured_outputs, or a guided_* field."""
    asked = [Constraint("json", schema, f"{schema_param}")] if schema is not None else []
    spec = req.structured_outputs or {}
    if not isinstance(spec, dict):
        raise APIError(400, "structured_outputs: expected an object", "structured_outputs")
    for key, value in spec.items():
        if key in STRUCTURED_KINDS and value is not None:
            asked.append(Constraint(STRUCTURED_KINDS[key], value, f"structured_outputs.{key}"))
        elif key == "json_object" and value:
            asked.append(Constraint("json", {"type": "object"}, "structured_outputs.json_object"))
        elif key not in ("disable_fallback", "disable_any_whitespace", "disable_additional_properties",
                         "whitespace_pattern", "structural_tag") and value is not None:
            raise APIError(400, f"structured_outputs.{key}: not supported by this server", "structured_outputs")
    for name, kind in GUIDED.items():
        value = getattr(req, name)
        if value is not None:
            if kind == "json" and isinstance(value, str):
                import json

                try:
                    value = json.loads(value)
                except ValueError as e:
                    raise APIError(400, f"{name}: not valid JSON: {e}", name) from None
            asked.append(Constraint(kind, value, name))
    if len(asked) > 1:
        raise APIError(400, f"{asked[1].param}: only one structured-output constraint per request (also "
                            f"{asked[0].param})", asked[1].param)
    return asked[0] if asked else None
