"""ft launch: merges agent configs under a temp HOME, never dropping the user's own settings."""

from __future__ import annotations

import json
import tomllib

import pytest

from freetoken.cli import main

USER_CLAUDE = {"theme": "dark", "env": {"MY_VAR": "keep", "ANTHROPIC_MODEL": "old"},
               "permissions": {"allow": ["Bash(ls:*)"]}}
USER_CODEX = """# my codex settings
model = "gpt-5"  # my default stays

[model_providers.other]
name = "other"
base_url = "https://example.invalid/v1"

[model_providers.freetoken]
name = "stale"
base_url = "http://127.0.0.1:9999/v1"

[mcp_servers.docs]
command = "docs-server"
"""


def launch(home, agent, *extra):
    return main(["launch", agent, "--home", str(home), "--model", "m1", "--port", "2020", *extra])


def backups(path):
    return sorted(path.parent.glob(path.name + ".*.bak"))


def test_claude_merges_env_and_keeps_everything_else(tmp_path, capsys):
    path = tmp_path / ".claude" / "settings.json"
    path.parent.mkdir()
    path.write_text(json.dumps(USER_CLAUDE))
    assert launch(tmp_path, "claude") == 0
    got = json.loads(path.read_text())
    assert got["theme"] == "dark" and got["permissions"] == USER_CLAUDE["permissions"]
    assert got["env"]["MY_VAR"] == "keep"
    assert got["env"]["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:2020"
    assert got["env"]["ANTHROPIC_MODEL"] == "m1" and got["env"]["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "m1"
    (backup,) = backups(path)
    assert json.loads(backup.read_text()) == USER_CLAUDE
    # a second run finds nothing to do and makes no second backup
    capsys.readouterr()
    assert launch(tmp_path, "claude") == 0
    assert "already configured" in capsys.readouterr().out
    assert len(backups(path)) == 1


def test_dry_run_prints_the_diff_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / ".claude" / "settings.json"
    path.parent.mkdir()
    path.write_text(json.dumps(USER_CLAUDE))
    before = path.read_text()
    assert launch(tmp_path, "claude", "--dry-run") == 0
    out = capsys.readouterr().out
    assert '+    "ANTHROPIC_BASE_URL": "http://127.0.0.1:2020",' in out
    assert '+    "ANTHROPIC_MODEL": "m1",' in out and f"-{json.dumps(USER_CLAUDE)}" in out
    assert path.read_text() == before and backups(path) == []
    assert not (tmp_path / ".codex").exists()


def test_codex_replaces_only_its_provider_table(tmp_path):
    config = tmp_path / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text(USER_CODEX)
    assert launch(tmp_path, "codex") == 0
    text = config.read_text()
    parsed = tomllib.loads(text)
    assert "# my codex settings" in text and parsed["model"] == "gpt-5"  # top level untouched
    assert parsed["model_providers"]["other"]["base_url"] == "https://example.invalid/v1"
    assert parsed["mcp_servers"]["docs"]["command"] == "docs-server"
    ours = parsed["model_providers"]["freetoken"]
    assert ours == {"name": "freetoken (local)", "base_url": "http://127.0.0.1:2020/v1", "wire_api": "responses"}
    assert text.count("[model_providers.freetoken]") == 1
    profile = tomllib.loads((tmp_path / ".codex" / "freetoken.config.toml").read_text())
    assert profile == {"model": "m1", "model_provider": "freetoken", "web_search": "disabled"}
    assert backups(config)[0].read_text() == USER_CODEX


def test_opencode_new_file_then_merge(tmp_path):
    path = tmp_path / "cfg" / "opencode.json"
    assert main(["launch", "opencode", "--config-dir", str(path.parent), "--model", "m1"]) == 0
    got = json.loads(path.read_text())
    assert got["$schema"] == "https://opencode.ai/config.json"
    assert got["model"] == "freetoken/m1"
    assert got["provider"]["freetoken"]["options"]["baseURL"] == "http://127.0.0.1:1919/v1"
    got["provider"]["mine"] = {"npm": "x"}
    got["share"] = "disabled"
    path.write_text(json.dumps(got))
    assert main(["launch", "opencode", "--config-dir", str(path.parent), "--model", "m2"]) == 0
    again = json.loads(path.read_text())
    assert again["provider"]["mine"] == {"npm": "x"} and again["share"] == "disabled"
    assert set(again["provider"]["freetoken"]["models"]) == {"m1", "m2"}
    assert again["model"] == "freetoken/m2"


def test_default_locations_follow_env_overrides(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "codexhome"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert main(["launch", "opencode", "--model", "m1"]) == 0
    assert main(["launch", "codex", "--model", "m1"]) == 0
    assert (tmp_path / "xdg" / "opencode" / "opencode.json").is_file()
    assert (tmp_path / "codexhome" / "config.toml").is_file()


@pytest.mark.parametrize("agent,rel,bad", [
    ("claude", ".claude/settings.json", "{not json"),
    ("claude", ".claude/settings.json", "[1, 2]"),
    ("codex", ".codex/config.toml", "model = = 1"),
])
def test_unreadable_config_is_an_error_and_stays_untouched(tmp_path, capsys, agent, rel, bad):
    path = tmp_path / rel
    path.parent.mkdir(parents=True)
    path.write_text(bad)
    assert launch(tmp_path, agent) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "Traceback" not in err
    assert path.read_text() == bad and backups(path) == []


def test_env_value_that_is_not_an_object_is_refused(tmp_path, capsys):
    path = tmp_path / ".claude" / "settings.json"
    path.parent.mkdir()
    path.write_text('{"env": "oops"}')
    assert launch(tmp_path, "claude") == 2
    assert "env is a str" in capsys.readouterr().err


def test_a_home_that_is_a_file_is_one_line_naming_the_path(tmp_path, capsys):
    home = tmp_path / "home"
    home.write_text("not a folder\n")
    assert launch(home, "claude") == 2
    err = capsys.readouterr().err.splitlines()[-1]  # was "[Errno 20] Not a directory: '.../settings.json'"
    assert err == f"ft launch: error: {home / '.claude' / 'settings.json'}: Not a directory"
    assert home.read_text() == "not a folder\n"


def test_api_key_goes_where_each_agent_reads_it(tmp_path, capsys, monkeypatch):
    claude = tmp_path / ".claude" / "settings.json"
    assert launch(tmp_path, "claude", "--api-key", "k-123") == 0
    assert json.loads(claude.read_text())["env"]["ANTHROPIC_AUTH_TOKEN"] == "k-123"  # sent as Bearer
    assert launch(tmp_path, "codex", "--api-key", "k-123") == 0
    provider = tomllib.loads((tmp_path / ".codex" / "config.toml").read_text())["model_providers"]["freetoken"]
    assert provider["env_key"] == "FT_API_KEY"
    assert "start it with: codex --profile freetoken with FT_API_KEY set in its environment" in capsys.readouterr().out
    monkeypatch.setenv("FT_API_KEY", "from-env")  # the server's own variable is the default
    assert launch(tmp_path, "opencode") == 0
    opencode = json.loads((tmp_path / ".config" / "opencode" / "opencode.json").read_text())
    assert opencode["provider"]["freetoken"]["options"]["apiKey"] == "from-env"


def test_without_a_key_no_key_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("FT_API_KEY", raising=False)
    assert launch(tmp_path, "codex") == 0 and launch(tmp_path, "opencode") == 0
    provider = tomllib.loads((tmp_path / ".codex" / "config.toml").read_text())["model_providers"]["freetoken"]
    assert "env_key" not in provider
    opencode = json.loads((tmp_path / ".config" / "opencode" / "opencode.json").read_text())
    assert "apiKey" not in opencode["provider"]["freetoken"]["options"]
