"""Constrained decoding with xgrammar (what vLLM and SGLang use): a JSON schema, a regex, a choice of strings or an
EBNF grammar compiled once per tokenizer into a token-level grammar; per request a matcher masks the tokens that
cannot continue valid output, and a TokenGuard the ones that would make the text invalid UTF-8 (or, under a JSON
schema, hold a raw control character), which xgrammar 0.2.8 admits. After the output is complete only a stop
token is allowed. Every complete reply is validated again, independently, before it is returned (validate)."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

import torch

from freetoken.serve.utf8guard import GuardState, TokenGuard

KINDS = ("json", "regex", "choice", "grammar")
_XGR_PREFIX = re.compile(r"^\[[^]]*\] \S+: ")


@dataclass(frozen=True)
class Constraint:
    kind: str  # "json" | "regex" | "choice" | "grammar"
    spec: object  # a schema (dict), a pattern, a list of strings, EBNF text
    param: str  # the request field it came from: errors and metrics name it

    def key(self) -> str:
        return json.dumps([self.kind, self.spec], sort_keys=True)


def check(c: Constraint) -> None:
    """Before compiling: the request's own mistakes, a ValueError naming the field (and the schema path)."""
    if c.kind == "json":
        from freetoken.serve.schema_check import check_schema

        check_schema(c.spec, c.param)
    elif c.kind == "regex":
        if not isinstance(c.spec, str) or not c.spec:
            raise ValueError(f"{c.param}: a regular expression string is required")
        try:
            re.compile(c.spec)
        except re.error as e:
            raise ValueError(f"{c.param}: not a valid regular expression: {e}") from None
    elif c.kind == "choice":
        if not isinstance(c.spec, list) or not c.spec or not all(isinstance(s, str) and s for s in c.spec):
            raise ValueError(f"{c.param}: a non-empty list of non-empty strings is required")
    elif c.kind == "grammar":
        if not isinstance(c.spec, str) or not c.spec.strip():
            raise ValueError(f"{c.param}: an EBNF grammar (GBNF syntax, a `root` rule) is required")
    else:
        raise ValueError(f"{c.param}: expected one of {', '.join(KINDS)}, got {c.kind!r}")


def _literal(s: str) -> str:
    """An EBNF string literal (xgrammar's escapes are JSON's)."""
    return json.dumps(s, ensure_ascii=False)


class Grammars:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: set[int]):
        self.tokenizer, self.vocab_size, self.stop_token_ids = tokenizer, vocab_size, sorted(stop_token_ids)

    @functools.cached_property
    def info(self):
        import xgrammar as xgr

        return xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                  stop_token_ids=self.stop_token_ids)

    @functools.cached_property
    def compiler(self):
        import xgrammar as xgr

        return xgr.GrammarCompiler(self.info)

    @functools.cached_property
    def guard(self) -> TokenGuard:
        return TokenGuard(self.info.decoded_vocab, self.vocab_size)

    def compile(self, c: Constraint):
        """ValueError naming the field for a constraint that is wrong or that the grammar cannot enforce."""
        check(c)
        return self._compile(c.key(), c.kind, c.param)

    @functools.lru_cache(maxsize=64)
    def _compile(self, key: str, kind: str, param: str):
        spec = json.loads(key)[1]
        try:
            if kind == "json":  # separators as json.dumps writes them: what models are trained on, no runaway space
                return self.compiler.compile_json_schema(json.dumps(spec), any_whitespace=False,
                                                         separators=(", ", ": "))
            if kind == "regex":
                return self.compiler.compile_regex(spec)
            if kind == "choice":
                return self.compiler.compile_grammar("root ::= " + " | ".join(_literal(s) for s in spec))
            return self.compiler.compile_grammar(spec)
        except Exception as e:  # xgrammar raises RuntimeError / its own types; its first line says what
            text = str(e).splitlines()[0] if str(e) else type(e).__name__
            text = _XGR_PREFIX.sub("", text)  # "[04:18:19] /project/cpp/grammar_parser.cc:820: " means nothing here
            raise ValueError(f"{param}: cannot be compiled: {text}") from None

    def mask(self, c: Constraint) -> "GrammarMask":
        return GrammarMask(self.compile(c), self.vocab_size,
                           GuardState(self.guard, c.kind == "json", self.stop_token_ids))


def unpack_bitmask(words: torch.Tensor, V: int) -> torch.Tensor:
    """words [ceil(V / 32)] int32 (xgrammar's layout: token i is bit i % 32 of word i // 32) -> allowed [V] bool."""
    bit = torch.arange(32, dtype=torch.int32, device=words.device)
    return ((words[:, None] >> bit) & 1).bool().reshape(-1)[:V]


class GrammarMask:
    """One request's grammar state: mask(logits) before sampling, accept(token) after."""

    def __init__(self, compiled, vocab_size: int, guard: GuardState):
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)  # [1, ceil(V / 32)] int32
        self._apply = xgr.apply_token_bitmask_inplace
        self.guard = guard

    def mask(self, logits: torch.Tensor) -> None:
        """logits [V] float (any device), in place: disallowed tokens -> -inf. The matcher fills its bitmask on
        the host; on another device the bitmask travels (no read back) and is unpacked there."""
        self.matcher.fill_next_token_bitmask(self.bitmask)
        if logits.device.type == "cpu":
            self._apply(logits[None], self.bitmask)
        else:
            logits.masked_fill_(~unpack_bitmask(self.bitmask[0].to(logits.device), logits.numel()), float("-inf"))
        self.guard.mask(logits)

    def accept(self, token: int) -> None:
        if not self.matcher.is_terminated() and not self.matcher.accept_token(token):
            raise RuntimeError(f"token {token} was sampled outside the grammar")
        self.guard.accept(token)


def validate(c: Constraint, text: str, grammars: Grammars) -> str | None:
    """Why a complete reply breaks its constraint (None: it keeps it), checked on the returned text by other means
    than the grammar that made it: json.loads and jsonschema, Python's re, set membership."""
    if c.kind == "json":
        from jsonschema import Draft202012Validator

        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            return f"not valid JSON: {e}"
        err = next(iter(Draft202012Validator(c.spec).iter_errors(obj)), None)
        return None if err is None else f"{err.json_path}: {err.message}"
    if c.kind == "regex":
        return None if re.fullmatch(c.spec, text) else f"does not match {c.spec!r}"
    if c.kind == "choice":
        return None if text in c.spec else "is not one of the choices"
    import xgrammar as xgr  # an EBNF grammar: the whole text through a fresh matcher

    matcher = xgr.GrammarMatcher(grammars.compile(c))
    return None if matcher.accept_string(text) and matcher.is_completed() else "is not a sentence of the grammar"
