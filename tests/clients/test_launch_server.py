"""`ft launch` against running servers: a keyed one is reported as keyed (not down) without the key or with a wrong
one, configured with the right one; an agent whose recorded first request does not fit the served context gets a
warning that says how to raise it."""

from __future__ import annotations

from urllib.parse import urlsplit

from agent_server import KEY, agent_server, demo_32k, running  # noqa: F401  (fixtures)

from freetoken.cli import main


def launch(url: str, home, agent: str, *extra) -> int:
    return main(["launch", agent, "--home", str(home), "--port", str(urlsplit(url).port), *extra])


def test_a_keyed_server_is_keyed_not_down(agent_server, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FT_API_KEY", raising=False)
    assert launch(agent_server.url, tmp_path, "claude") != 0
    assert capsys.readouterr().err.strip().endswith("needs an API key (it answered 401): pass --api-key KEY or set "
                                                    "FT_API_KEY to the key it was started with")
    assert launch(agent_server.url, tmp_path, "claude", "--api-key", "wrong") != 0
    assert "refused the API key given" in capsys.readouterr().err
    assert not (tmp_path / ".claude").exists()  # nothing written for a server the agent could not use
    assert launch(agent_server.url, tmp_path, "claude", "--api-key", KEY) == 0
    out = capsys.readouterr()
    assert "as model 'freetoken-demo' with the API key" in out.out and "warning" not in out.err  # 32K: it fits


def test_a_context_below_the_agents_first_request_is_said_with_the_fix(demo_32k, tmp_path, capsys):
    with running(None) as demo:  # the shipped demo: 2048 tokens
        assert launch(demo.url, tmp_path, "claude") == 0
        err = capsys.readouterr().err
        assert "warning: claude's first request is " in err and "its context is 2048" in err
        assert "ft demo build --context 32768 --out DIR, then ft serve --model DIR" in err
    with running(demo_32k, max_context=4096) as shorter:  # the model allows more than is served
        assert launch(shorter.url, tmp_path, "opencode") == 0
        err = capsys.readouterr().err
        assert "its context is 4096" in err and "restart ft serve with --max-context 32768" in err
