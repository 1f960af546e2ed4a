"""The CPU benchmarks' results as a printed table, and as CSV or JSON (`--out`): one row per side, thread count and
prompt length, plus the ratios the issue's targets are stated in."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    header: str
    fmt: Callable[[object], str] = str


def _num(spec: str) -> Callable[[object], str]:
    return lambda v: "-" if v is None else format(v, spec)


def _mb(v) -> str:
    return "-" if v is None else f"{v / 1e6:.1f}"


def _gb(v) -> str:
    return "-" if v is None else f"{v / 1e9:.2f}"


def _pct(v) -> str:
    return "-" if v is None else f"{v:.0%}"


def _text(v) -> str:
    return "-" if v is None or v == "" else str(v)


LLAMA_COLUMNS = [
    Column("engine", "engine", _text), Column("weights", "weights", _text), Column("mode", "mode", _text),
    Column("threads", "thr", _text), Column("prompt_tokens", "prompt", _text),
    Column("decode_tok_s", "decode tok/s", _num(".1f")), Column("prefill_tok_s", "prefill tok/s", _num(".1f")),
    Column("bytes_per_token", "MB/token", _mb), Column("read_pct", "% read BW", _pct),
    Column("peak_rss_bytes", "peak RSS GB", _gb), Column("rss_vs_checkpoint", "RSS/ckpt", _num(".2f")),
    Column("net_rss_vs_checkpoint", "net RSS/ckpt", _num(".2f")),
    Column("tokens_vs_llama_bf16", "tokens = llama bf16", _text),
]
HF_COLUMNS = [
    Column("family", "family", _text), Column("dtype", "dtype", _text), Column("threads", "thr", _text),
    Column("prompt_tokens", "prompt", _text),
    Column("ft_prefill_tok_s", "ft prefill", _num(".1f")), Column("hf_prefill_tok_s", "HF prefill", _num(".1f")),
    Column("prefill_vs_hf", "x", _num(".2f")),
    Column("ft_decode_tok_s", "ft decode", _num(".1f")), Column("hf_decode_tok_s", "HF decode", _num(".1f")),
    Column("decode_vs_hf", "x", _num(".2f")),
    Column("ft_peak_rss_bytes", "ft RSS GB", _gb), Column("hf_peak_rss_bytes", "HF RSS GB", _gb),
    Column("same_tokens", "tokens equal", _text),
]
RATIO_COLUMNS = [
    Column("threads", "thr", _text), Column("prompt_tokens", "prompt", _text), Column("ft", "ft", _text),
    Column("against", "llama.cpp", _text), Column("decode_ratio", "decode ft/llama", _num(".2f")),
    Column("prefill_ratio", "prefill ft/llama", _num(".2f")),
]


def format_table(columns: list[Column], rows: list[dict]) -> str:
    """Columns right-aligned to their widest cell (text columns left-aligned)."""
    cells = [[c.header for c in columns]] + [[c.fmt(row.get(c.key)) for c in columns] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    left = {i for i, c in enumerate(columns) if c.fmt is _text and c.key not in ("threads", "prompt_tokens")}
    lines = []
    for r in cells:
        lines.append("  ".join(v.ljust(w) if i in left else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))))
    return "\n".join(line.rstrip() for line in lines)


def csv_text(rows: list[dict]) -> str:
    """Every key any row has, in first-seen order; nested values (lists, dicts) as JSON."""
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    out = io.StringIO()
    writer = csv.DictWriter(out, keys, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v) if isinstance(v, (list, dict, tuple)) else v for k, v in row.items()})
    return out.getvalue()


OUT_SUFFIXES = (".csv", ".json")


def check_out(path: str | None) -> None:
    """--out's mistakes before a long run: its suffix names the format."""
    if path is None:
        return
    from freetoken.io import output_problem

    if Path(path).suffix.lower() not in OUT_SUFFIXES:
        raise ValueError(f"--out {path}: give a .csv or .json file name (the suffix picks the format)")
    problem = output_problem(Path(path))
    if problem:
        raise ValueError(f"--out {path}: cannot write ({problem})")


def write_out(path: str, result: dict) -> Path:
    """.json: the whole result; .csv: its rows, then its ratio rows (a `table` column tells them apart)."""
    from freetoken.io import write_atomic

    if Path(path).suffix.lower() == ".json":
        return write_atomic(path, json.dumps(result, indent=1) + "\n")
    rows = [{"table": "rows", **r} for r in result["rows"]] + [{"table": "ratios", **r} for r in result.get("ratios", [])]
    return write_atomic(path, csv_text(rows))
