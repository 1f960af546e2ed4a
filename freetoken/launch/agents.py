"""Coding agents pointed at a running `ft serve`: each plans edits of its own config files, merging, never replacing.

claude   ~/.claude/settings.json             env block: Anthropic base URL, token (the key) and model names
codex    ~/.codex/config.toml                [model_providers.freetoken] (OpenAI Responses API; env_key FT_API_KEY)
         ~/.codex/freetoken.config.toml      profile: model + provider, web search off (no search runs here);
                                             run `codex --profile freetoken`
opencode ~/.config/opencode/opencode.json    provider.freetoken (OpenAI-compatible chat completions, options.apiKey)
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from freetoken.launch.files import FileEdit, read_text

PROVIDER = "freetoken"
KEY_ENV = "FT_API_KEY"  # codex reads the key from the environment variable its provider names (env_key)


def origin(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass(frozen=True, slots=True)
class Target:
    """Where the agent should send requests, and where its config lives (config_dir None: the agent's default)."""

    host: str = "127.0.0.1"
    port: int = 1919
    model: str = "freetoken-demo"
    config_dir: Path | None = None
    home: Path | None = None
    api_key: str | None = None  # the server's --api-key; None: it takes none

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"--port must lie in 1..65535, got {self.port}")
        if not self.model or any(c.isspace() for c in self.model):
            raise ValueError(f"--model must be a non-empty id without spaces, got {self.model!r}")
        if self.api_key is not None and (not self.api_key.strip() or any(c.isspace() for c in self.api_key)):
            raise ValueError("--api-key must be a non-empty key without spaces")

    @property
    def origin(self) -> str:
        return origin(self.host, self.port)

    def dir_for(self, env_var: str, default: tuple[str, ...], under_env: tuple[str, ...] = ()) -> Path:
        """--config-dir, else $env_var/under_env (unless --home is given), else HOME/default."""
        if self.config_dir is not None:
            return self.config_dir
        if self.home is None and os.environ.get(env_var):
            return Path(os.environ[env_var]).joinpath(*under_env)
        return (self.home or Path.home()).joinpath(*default)


@dataclass(frozen=True, slots=True)
class Plan:
    edits: list[FileEdit]
    command: str  # how to start the agent afterwards
    env: dict[str, str] = field(default_factory=dict)  # what its environment must hold (codex: the key)


# json helpers
def _load_json_object(path: Path, text: str | None) -> dict:
    if text is None or not text.strip():
        return {}
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON (line {e.lineno}: {e.msg}); fix or move it, nothing was written")
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object at the top level, found {type(obj).__name__}")
    return obj


def _merge(base: dict, update: dict, where: Path, at: str = "") -> dict:
    """Recursive merge keeping every key of base that update does not name."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict):
            current = out.get(key, {})
            if not isinstance(current, dict):
                raise ValueError(f"{where}: {at}{key} is a {type(current).__name__}, expected an object")
            out[key] = _merge(current, value, where, f"{at}{key}.")
        else:
            out[key] = value
    return out


def _json_edit(path: Path, update: dict) -> FileEdit:
    old = read_text(path)
    current = _load_json_object(path, old)
    merged = _merge(current, update, path)
    if old is not None and current == merged:
        return FileEdit(path, old, old)  # already configured: keep the user's formatting
    return FileEdit(path, old, json.dumps(merged, indent=2, ensure_ascii=False) + "\n")


# agents
def claude(t: Target) -> Plan:
    path = t.dir_for("CLAUDE_CONFIG_DIR", (".claude",)) / "settings.json"
    env = {
        "ANTHROPIC_BASE_URL": t.origin,
        # sent as Authorization: Bearer; without a key any non-empty token does (the server checks none)
        "ANTHROPIC_AUTH_TOKEN": t.api_key or PROVIDER,
        "ANTHROPIC_MODEL": t.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": t.model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": t.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": t.model,
        "ANTHROPIC_SMALL_FAST_MODEL": t.model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    return Plan([_json_edit(path, {"env": env})], "claude")


def opencode(t: Target) -> Plan:
    path = t.dir_for("XDG_CONFIG_HOME", (".config", "opencode"), ("opencode",)) / "opencode.json"
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "freetoken (local)",
        "options": {"baseURL": f"{t.origin}/v1", **({"apiKey": t.api_key} if t.api_key else {})},
        "models": {t.model: {"name": t.model}},
    }
    update = {"provider": {PROVIDER: provider}, "model": f"{PROVIDER}/{t.model}"}
    if read_text(path) is None:
        update = {"$schema": "https://opencode.ai/config.json", **update}
    return Plan([_json_edit(path, update)], "opencode")


_TABLE_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")


def _drop_table(text: str, name: str) -> str:
    """Removes the table `[name]` (header to the next header) from TOML text, leaving everything else verbatim."""
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        m = _TABLE_HEADER.match(line)
        if m:
            skipping = m.group(1).replace('"', "").replace(" ", "") == name
        if not skipping:
            out.append(line)
    return "".join(out)


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string literal is a valid TOML basic string


def codex(t: Target) -> Plan:
    base = t.dir_for("CODEX_HOME", (".codex",))
    config, profile = base / "config.toml", base / f"{PROVIDER}.config.toml"
    old = read_text(config)
    if old is not None:
        try:
            tomllib.loads(old)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{config}: not valid TOML ({e}); fix or move it, nothing was written")
    table = (f"[model_providers.{PROVIDER}]\n"
             f"name = {_toml_str('freetoken (local)')}\n"
             f"base_url = {_toml_str(t.origin + '/v1')}\n"
             f'wire_api = "responses"\n'
             + (f"env_key = {_toml_str(KEY_ENV)}\n" if t.api_key else ""))
    kept = _drop_table(old or "", f"model_providers.{PROVIDER}").rstrip("\n")
    new = (kept + "\n\n" if kept else "") + table
    parsed = tomllib.loads(new)  # a user table written as dotted keys elsewhere would clash here
    if parsed.get("model_providers", {}).get(PROVIDER, {}).get("base_url") != t.origin + "/v1":
        raise ValueError(f"{config}: model_providers.{PROVIDER} is defined in a form this merge cannot edit; "
                         f"remove it by hand")
    if old is not None and tomllib.loads(old) == parsed:
        new = old
    profile_text = (f"model = {_toml_str(t.model)}\nmodel_provider = {_toml_str(PROVIDER)}\n"
                    f"# built-in web search runs on OpenAI's servers only; this server refuses the tool\n"
                    f'web_search = "disabled"\n')
    return Plan([FileEdit(config, old, new), FileEdit(profile, read_text(profile), profile_text)],
                f"codex --profile {PROVIDER}", {KEY_ENV: t.api_key} if t.api_key else {})


AGENTS: dict[str, Callable[[Target], Plan]] = {"claude": claude, "codex": codex, "opencode": opencode}


def plan(agent: str, target: Target) -> Plan:
    if agent not in AGENTS:
        raise ValueError(f"unknown agent {agent!r}; valid: {', '.join(sorted(AGENTS))}")
    return AGENTS[agent](target)
