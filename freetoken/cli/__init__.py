"""`ft`: one command, subcommands found in this package.

A module `cmd_<name>.py` defines register(subparsers) and adds the `ft <name>` parser with a `run` default;
a module `bench_<name>.py` does the same under `ft bench`. User errors (ValueError, OSError) and running out of memory
print one line.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

import freetoken


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ft", description="freetoken: MoE expert offloading, simulated and live",
                                     allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"freetoken {freetoken.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    bench = sub.add_parser("bench", help="benchmarks: measured ratios printed in one run")
    bench_sub = bench.add_subparsers(dest="bench", metavar="BENCH")
    bench_sub.required = True
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("cmd_"):
            importlib.import_module(f"{__name__}.{info.name}").register(sub)
        elif info.name.startswith("bench_"):
            importlib.import_module(f"{__name__}.{info.name}").register(bench_sub)
    no_abbreviations(parser)
    return parser


def no_abbreviations(parser: argparse.ArgumentParser) -> None:
    """Every (sub)command takes flags only as spelled: `--profile` must not pass for `--profile-trace`."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                no_abbreviations(child)


def command_name(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The command as typed, down to its last sub-command ("bench sim", "trace import"), as argparse names it in its
    own errors: read from the parser's sub-command levels, so a new one needs nothing here."""
    words = []
    while True:
        level = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        chosen = getattr(args, level.dest, None) if level is not None else None
        if chosen is None:
            return " ".join(words)
        words.append(chosen)
        parser = level.choices[chosen]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except BrokenPipeError:  # output piped into `head` and the like
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as e:
        if os.environ.get("FT_DEBUG"):
            raise
        from freetoken.cli.common import CLI_NAMES
        from freetoken.placement.config import ConfigError

        message = e.render(CLI_NAMES) if isinstance(e, ConfigError) else e  # a cache field, spelled as its flag
        if isinstance(e, OSError) and e.strerror and e.filename is not None:  # not "[Errno 20] ...: 'x'"
            message = f"{e.filename}{f' -> {e.filename2}' if e.filename2 else ''}: {e.strerror}"
        print(f"ft {command_name(parser, args)}: error: {message}", file=sys.stderr)
        return 2
    except MemoryError as e:  # numpy's names the array it could not allocate: too many tokens, steps, ...
        if os.environ.get("FT_DEBUG"):
            raise
        print(f"ft {command_name(parser, args)}: error: out of memory{f': {e}' if str(e) else ''}; ask for less",
              file=sys.stderr)
        return 2
