"""What Claude Code sends beyond the plain Messages API, each carried out or refused by name: the values of its
`anthropic-beta` header, `thinking` (enabled / adaptive / disabled), and `context_management` edits
(clear_thinking_20251015: earlier thinking blocks are dropped before the prompt is rendered)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from freetoken.serve.errors import APIError

log = logging.getLogger("freetoken.serve")

# anthropic-beta values this server honours: what each means here
ACCEPTED_BETAS = {
    "claude-code-20250219": "names the client; nothing to change",
    "interleaved-thinking-2025-05-14": "reasoning may follow tool results: the family's parser reads it anywhere",
    "thinking-token-count-2026-05-13": "usage counts reasoning tokens within output_tokens",
    "context-management-2025-06-27": "context_management: clear_thinking_20251015 is carried out",
    "prompt-caching-2024-07-31": "cache_control is accepted; the prefix cache reuses every shared prefix anyway",
    "prompt-caching-scope-2026-01-05": "cache_control scopes are accepted; prefix reuse is automatic",
    "mid-conversation-system-2026-04-07": "system messages inside messages are rendered where the template allows",
    "effort-2025-11-24": "output_config.effort is passed to the chat template as reasoning_effort",
    "structured-outputs-2025-11-13": "output_config.format decodes under the schema's grammar",
    "token-counting-2024-11-01": "/v1/messages/count_tokens",
    "fine-grained-tool-streaming-2025-05-14": "tool input is streamed as JSON deltas",
    "token-efficient-tools-2025-02-19": "no effect on how tools are rendered here",
    "output-128k-2025-02-19": "max_tokens is bounded by the served context only",
    "context-1m-2025-08-07": "the context is the served model's",
}
# refused by prefix: features that need Anthropic's own servers
REFUSED_BETAS = {
    "computer-use-": "no computer-use tool runs here",
    "code-execution-": "no code-execution container",
    "mcp-client-": "no MCP connector",
    "files-api-": "no file storage",
    "compact-": "no server-side compaction (it needs a summarizing model call)",
    "skills-": "no server-side skills",
    "web-fetch-": "no server-side web fetch",
    "web-search-": "no server-side web search",
    "managed-agents-": "no managed agents",
    "message-batches-": "no batch API",
}


def check_betas(header: str | None) -> list[str]:
    """The accepted values of an anthropic-beta header; a 400 naming the first refused one. Unknown values are
    logged and ignored, as unknown body fields are."""
    names = [v.strip() for v in (header or "").split(",") if v.strip()]
    for name in names:
        if name in ACCEPTED_BETAS:
            continue
        refused = next((why for prefix, why in REFUSED_BETAS.items() if name.startswith(prefix)), None)
        if refused:
            raise APIError(400, f"anthropic-beta: {name} is not supported by this server ({refused})",
                           "anthropic-beta")
        log.warning("ignoring unknown anthropic-beta value %r", name)
    return names


@dataclass(frozen=True, slots=True)
class Thinking:
    enabled: bool
    budget: int | None = None  # reasoning tokens before the reasoning is closed (type enabled)
    shown: bool = True  # display "omitted": thinking blocks come back empty


def thinking_config(spec: dict | None, max_tokens: int) -> Thinking:
    """`thinking`: enabled (with budget_tokens), adaptive (the model decides; no budget), disabled."""
    spec = spec or {"type": "disabled"}
    kind = spec.get("type")
    if kind == "disabled":
        return Thinking(False)
    if kind not in ("enabled", "adaptive"):
        raise APIError(400, f"thinking.type: expected enabled, adaptive or disabled, got {kind!r}", "thinking.type")
    display = spec.get("display") or "summarized"
    if display not in ("summarized", "omitted"):
        raise APIError(400, f"thinking.display: expected summarized or omitted, got {display!r}", "thinking.display")
    if kind == "adaptive":
        return Thinking(True, None, display != "omitted")
    budget = spec.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or not 1 <= budget < max_tokens:
        raise APIError(400, f"thinking.budget_tokens: a token count below max_tokens ({max_tokens}), got {budget!r}",
                       "thinking.budget_tokens")
    return Thinking(True, budget, display != "omitted")


def _kept_turns(edit: dict, where: str) -> int | None:
    """clear_thinking's keep: the number of latest thinking turns kept; None: all of them."""
    keep = edit.get("keep", {"type": "thinking_turns", "value": 1})
    if keep == "all" or (isinstance(keep, dict) and keep.get("type") == "all"):
        return None
    if isinstance(keep, dict) and keep.get("type") == "thinking_turns":
        value = keep.get("value")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    raise APIError(400, f"{where}.keep: expected \"all\" or {{\"type\": \"thinking_turns\", \"value\": N >= 0}}, "
                        f"got {keep!r}", f"{where}.keep")


def context_edits(spec: dict | None) -> list[int | None]:
    """The clear_thinking edits of `context_management` (their kept-turn counts); any other edit type is a 400
    naming it."""
    if spec is None:
        return []
    if not isinstance(spec, dict) or not isinstance(spec.get("edits", []), list):
        raise APIError(400, "context_management: expected {\"edits\": [...]}", "context_management")
    extra = sorted(set(spec) - {"edits"})
    if extra:
        raise APIError(400, f"context_management.{extra[0]}: not supported by this server", "context_management")
    kept = []
    for i, edit in enumerate(spec.get("edits", [])):
        where = f"context_management.edits[{i}]"
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind != "clear_thinking_20251015":
            raise APIError(400, f"{where}.type: {kind!r} is not an edit this server can carry out (it clears "
                                f"thinking blocks: clear_thinking_20251015)", f"{where}.type")
        kept.append(_kept_turns(edit, where))
    return kept


def clear_thinking(messages: list[dict], keep: int | None) -> tuple[list[dict], int]:
    """Anthropic-form messages with the thinking blocks of all but the last `keep` assistant turns that hold any
    removed; -> (messages, turns cleared)."""
    if keep is None:
        return messages, 0
    thinking = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and isinstance(m.get("content"), list)
                and any(isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking")
                        for b in m["content"])]
    cleared = thinking[:max(0, len(thinking) - keep)]
    out = list(messages)
    for i in cleared:
        out[i] = {**out[i], "content": [b for b in out[i]["content"]
                                        if not (isinstance(b, dict) and b.get("type") in ("thinking",
                                                                                          "redacted_thinking"))]}
    return out, len(cleared)
