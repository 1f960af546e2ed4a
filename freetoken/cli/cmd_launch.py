"""ft launch: write a coding agent's provider config so it talks to `ft serve`."""

from __future__ import annotations

import argparse
import json
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
    p.add_argument("--exec", dest="exec_agent", action="store_true", help="start the agent after writing")
    p.set_defaults(run=run)


def served_model(origin: str) -> str | None:
    """The first model id a running server lists, or None if none answers within a second."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{origin}/v1/models", timeout=1.0) as r:
            return json.load(r)["data"][0]["id"]
    except (OSError, ValueError, KeyError, IndexError):
        return None


def run(args: argparse.Namespace) -> int:
    from freetoken.launch import Target, plan
    from freetoken.launch.agents import origin

    model = args.model or served_model(origin(args.host, args.port))
    if model is None:
        from freetoken.serve.config import DEMO_MODEL_ID

        model = DEMO_MODEL_ID
        print(f"no server answered at {origin(args.host, args.port)}; using the demo model id {model!r} "
              f"(see --model)", file=sys.stderr)
    target = Target(args.host, args.port, model, args.config_dir, args.home)
    p = plan(args.agent, target)
    for edit in p.edits:
        if not edit.changed:
            print(f"{edit.path}: already configured")
        elif args.dry_run:
            sys.stdout.write(edit.diff())
        else:
            backup = edit.apply()
            print(f"{edit.path}: written" + (f" (previous version saved as {backup.name})" if backup else ""))
    if args.dry_run:
        print(f"dry run: nothing written; then start the agent with: {p.command}")
        return 0
    print(f"{args.agent} now talks to {target.origin} as model {model!r}; start it with: {p.command}")
    if args.exec_agent:
        exe = p.command.split()[0]
        if shutil.which(exe) is None:
            raise ValueError(f"--exec: {exe!r} is not on PATH")
        os.execvp(exe, p.command.split())
    return 0
