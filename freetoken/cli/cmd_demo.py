"""ft demo build: (re)build the shipped tiny demo checkpoint, deterministically, offline, in seconds."""

from __future__ import annotations

import argparse
import sys

from freetoken.paths import DEMO_MODEL


def register(sub) -> None:
    p = sub.add_parser("demo", help="the shipped tiny demo model")
    demo = p.add_subparsers(dest="demo", metavar="ACTION")
    demo.required = True
    b = demo.add_parser("build", help="build the tiny random Qwen3-MoE checkpoint and its tokenizer")
    b.add_argument("--out", default=str(DEMO_MODEL), help=f"output directory (default: {DEMO_MODEL})")
    b.add_argument("--context", type=int, default=2048,
                   help="max_position_embeddings (default 2048, the shipped copy's; coding agents need 32768)")
    b.set_defaults(run=run_build)


def run_build(args: argparse.Namespace) -> int:
    from freetoken.demo.build import build_demo

    out = build_demo(args.out, args.context)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"demo model written to {out} ({size / 1e6:.2f} MB)", file=sys.stderr)
    return 0
