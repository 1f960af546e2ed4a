"""ft launch: write a coding agent's provider config so it talks to `ft serve`."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from freetoken.cli.common import LazyChoices


def register(sub) -> None:
    p = sub.add_parser("launch", help="point a coding agent (claude, codex, opencode) at the local server")
    p.add_argument("agent", metavar="AGENT", choices=LazyChoices("freetoken.launch", "AGENTS", sort=True),
                   help="%(choices)s")
    p.add_argument("--dry-run", action="store_true", help="print the diff of every file, write nothing")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=1919)
    p.add_argument("--model", help="model id the agent should ask for (default: the one the server lists, "
                                   "else the demo model's)")
    p.add_argument("--config-dir", type=Path, help="the agent's config directory (default: its usual place)")
    p.add_argument("--home", type=Path, help="home directory to find the agent's config under (default: $HOME)")
    p.add_argument("--api-key", help="the key the server was started with (default: $FT_API_KEY); written where the "
                                     "agent reads it (claude: ANTHROPIC_AUTH_TOKEN, codex: env_key FT_API_KEY, "
                                     "opencode: options.apiKey)")
    p.add_argument("--exec", dest="exec_agent", action="store_true", help="start the agent after writing")
    p.set_defaults(run=run)


def server_info(args, key: str | None):
    """-> (model id to configure, ServerInfo). A keyed server without the right key is an error: the agent would
    get nothing but 401s."""
    from freetoken.launch.agents import origin
    from freetoken.launch.probe import probe

    url = origin(args.host, args.port)
    info = probe(url, key)
    if info.keyed:
        if info.key_sent:
            raise ValueError(f"the server at {url} refused the API key given (--api-key / FT_API_KEY)")
        raise ValueError(f"the server at {url} needs an API key (it answered 401): pass --api-key KEY or set "
                         f"FT_API_KEY to the key it was started with")
    model = args.model or info.model
    if model is None:
        from freetoken.serve.config import DEMO_MODEL_ID

        model = DEMO_MODEL_ID
        print(f"no server answered at {url}; using the demo model id {model!r} (see --model)", file=sys.stderr)
    return model, info


def context_note(args, key: str | None, model: str, info) -> str | None:
    """A warning when the agent's first request (its own, recorded) does not fit the served context."""
    from freetoken.launch.agents import origin
    from freetoken.launch.probe import first_request_tokens

    if not info.answering or info.max_context is None:
        return None
    need = first_request_tokens(origin(args.host, args.port), key, args.agent, model)
    if need is None or need < info.max_context:
        return None
    own = info.model_context or info.max_context
    raise_it = (f"restart ft serve with --max-context {min(own, max(32768, 2 * need))}" if own > need
                else f"the model's own context is {own} tokens: serve a model with a longer one (for the demo: "
                     f"ft demo build --context 32768 --out DIR, then ft serve --model DIR)")
    return (f"warning: {args.agent}'s first request is {need} tokens on this server, its context is "
            f"{info.max_context}: every request will be refused; {raise_it}")


def run(args: argparse.Namespace) -> int:
    from freetoken.launch import Target, plan

    key = args.api_key or os.environ.get("FT_API_KEY") or None
    model, info = server_info(args, key)
    target = Target(args.host, args.port, model, args.config_dir, args.home, key)
    p = plan(args.agent, target)
    for edit in p.edits:
        if not edit.changed:
            print(f"{edit.path}: already configured")
        elif args.dry_run:
            sys.stdout.write(edit.diff())
        else:
            backup = edit.apply()
            print(f"{edit.path}: written" + (f" (previous version saved as {backup.name})" if backup else ""))
    note = context_note(args, key, model, info)
    if note:
        print(note, file=sys.stderr)
    env = "".join(f" with {name} set in its environment" for name in p.env)
    if args.dry_run:
        print(f"dry run: nothing written; then start the agent with: {p.command}{env}")
        return 0
    keyed = " with the API key" if key else ""
    print(f"{args.agent} now talks to {target.origin} as model {model!r}{keyed}; start it with: {p.command}{env}")
    if args.exec_agent:
        exe = p.command.split()[0]
        if shutil.which(exe) is None:
            raise ValueError(f"--exec: {exe!r} is not on PATH")
        os.execvpe(exe, p.command.split(), {**os.environ, **p.env})
    return 0
