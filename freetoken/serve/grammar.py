"""Grammar-constrained decoding with xgrammar (what vLLM and SGLang use): a JSON schema compiled once per
tokenizer into a token-level grammar; per request a matcher masks the tokens that cannot continue valid output.
After the JSON is complete only a stop token is allowed."""

from __future__ import annotations

import functools
import json

import torch


class Grammars:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: set[int]):
        self.tokenizer, self.vocab_size, self.stop_token_ids = tokenizer, vocab_size, sorted(stop_token_ids)

    @functools.cached_property
    def compiler(self):
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                  stop_token_ids=self.stop_token_ids)
        return xgr.GrammarCompiler(info)

    def compile(self, schema: dict):
        """ValueError naming the problem for a schema xgrammar cannot compile."""
        return self._compile(json.dumps(schema, sort_keys=True))

    @functools.lru_cache(maxsize=64)
    def _compile(self, schema_text: str):
        try:  # separators as json.dumps writes them: the spacing models are trained on, and no runaway whitespace
            return self.compiler.compile_json_schema(schema_text, any_whitespace=False, separators=(", ", ": "))
        except Exception as e:  # xgrammar raises RuntimeError / its own types for unsupported schemas
            raise ValueError(f"the JSON schema cannot be used: {str(e).splitlines()[0] if str(e) else e}") from None


class GrammarMask:
    """One request's grammar state: mask(logits) before sampling, accept(token) after."""

    def __init__(self, compiled, vocab_size: int):
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)  # [1, ceil(V / 32)] int32
        self._apply = xgr.apply_token_bitmask_inplace

    def mask(self, logits: torch.Tensor) -> None:
        """logits [V] float on the CPU, in place: disallowed tokens -> -inf."""
        self.matcher.fill_next_token_bitmask(self.bitmask)
        self._apply(logits[None], self.bitmask)

    def accept(self, token: int) -> None:
        if not self.matcher.is_terminated() and not self.matcher.accept_token(token):
            raise RuntimeError(f"token {token} was sampled outside the grammar")
