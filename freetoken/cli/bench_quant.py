"""ft bench quant: bytes of one routed expert in bf16 and every packed format, and a slot pool of each allocated
for real: the memory it took (device allocator on CUDA, process RSS on CPU) over what the cost model says."""

from __future__ import annotations

import argparse
import csv
import io

from freetoken.cli.common import check_output, print_json

QWEN3_30B_A3B = (2048, 768)  # expert hidden, intermediate
CSV_FIELDS = ("name", "description", "bytes_per_expert", "vs_bf16", "slots", "expected_bytes", "measured_bytes",
              "measured_over_expected", "device", "method")


def register(sub) -> None:
    p = sub.add_parser("quant", help="bytes per expert of every quantized format; slot pools allocated and "
                                     "measured against the cost model")
    p.add_argument("--model", help="model card name, .yaml, or checkpoint directory (default: the Qwen3-30B-A3B "
                                   "expert, D 2048, I 768); a checkpoint's own format is added to the table")
    p.add_argument("--slots", type=int, default=64, help="experts per slot pool")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--out", help="write the table as CSV here")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(run=run)


def shape_of(model: str | None):
    """(hidden, intermediate, the card's own format or None, label)."""
    if model is None:
        return *QWEN3_30B_A3B, None, "Qwen3-30B-A3B expert"
    from freetoken.sim.model_card import load_model_card

    card = load_model_card(model)
    return card.hidden_size, card.expert_intermediate_size, card.expert_format, card.name


def rows_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def run(args: argparse.Namespace) -> int:
    import torch

    from freetoken.io import write_atomic
    from freetoken.quant.measure import measure_all

    if args.slots <= 0:
        raise ValueError(f"--slots must be positive, got {args.slots}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device here")
    if args.out:
        check_output(args.out, "--out")
    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    hidden, intermediate, extra, label = shape_of(args.model)
    if not args.json:
        print(f"{label}: D {hidden}, I {intermediate}; {args.slots}-slot pools on {device}")
        print(f"{'format':14s} {'layout':26s} {'bytes/expert':>13s} {'vs bf16':>8s} {'expected':>12s} "
              f"{'measured':>12s} {'meas/exp':>9s}")

    def show(r) -> None:
        if not args.json:
            print(f"{r.name:14s} {r.description:26s} {r.bytes_per_expert:13,d} {r.bytes_per_expert / bf16:8.3f} "
                  f"{r.expected_bytes:12,d} {r.measured_bytes:12,d} {r.ratio:9.3f}", flush=True)

    bf16 = 3 * hidden * intermediate * 2
    measures = measure_all(hidden, intermediate, args.slots, device, extra, on_row=show)
    rows = [m.to_dict() | {"vs_bf16": m.bytes_per_expert / bf16} for m in measures]
    if not args.json:
        print(f"measured by {measures[0].method}; expected = slots x cost.expert_bytes (gate, up, down)")
    if args.out:
        write_atomic(args.out, rows_csv(rows))
        if not args.json:
            print(f"wrote {args.out}")
    if args.json:
        print_json(rows)
    return 0
