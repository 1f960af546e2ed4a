"""The miss-split mode: what a profile recommends, and what `--split auto` resolves to.

Hybrid is recommended only when it is both predicted (balanced split at the rates measured with both lanes busy)
and measured end to end (a decode probe) to beat offload by HYBRID_MARGIN. A profile without a probe keeps offload:
a benchmark that overstates sustained CPU bandwidth is exactly how hybrid ends up slower than offload.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from freetoken.calibrate.profile import find_profile, profile_path
from freetoken.placement.split import Split, balanced_fetch_count

HYBRID_MARGIN = 1.10
SPLIT_MODES = ("auto", "offload", "hybrid", "cpu")


def recommend(dma_alone: float | None, cpu_overlap: float | None, dma_overlap: float | None,
              misses_per_call: int, probe: dict | None) -> dict:
    """Rates in GB/s of expert weights; probe: {"offload_tok_s", "hybrid_tok_s"} from a real decode, or None."""
    if dma_alone is None:
        return {"mode": "cpu", "bp_gb_s": None, "bh_gb_s": None, "predicted_speedup": None,
                "reason": "no CUDA device: PCIe absent, every expert runs on the CPU lane"}
    m = misses_per_call
    q = balanced_fetch_count(m, dma_overlap, cpu_overlap)
    t_offload = m / dma_alone
    t_hybrid = max(q / dma_overlap, (m - q) / cpu_overlap)
    predicted = t_offload / t_hybrid
    out = {"mode": "offload", "bp_gb_s": dma_overlap, "bh_gb_s": cpu_overlap,
           "predicted_speedup": round(predicted, 3), "misses_per_call": m, "fetched_per_call": q}
    if q == m:
        out["reason"] = (f"the balanced split fetches all {m} misses: the CPU lane ({cpu_overlap:.1f} GB/s with DMA "
                         f"running) adds nothing beside PCIe ({dma_overlap:.1f} GB/s)")
    elif predicted < HYBRID_MARGIN:
        out["reason"] = f"hybrid predicted only {predicted:.2f}x offload per layer call (needs {HYBRID_MARGIN}x)"
    elif probe is None:
        out["reason"] = (f"hybrid predicted {predicted:.2f}x offload per layer call but not checked end to end "
                         f"(no decode probe): offload kept")
    else:
        measured = probe["hybrid_tok_s"] / probe["offload_tok_s"]
        out["measured_speedup"] = round(measured, 3)
        if measured >= HYBRID_MARGIN:
            out["mode"] = "hybrid"
            out["reason"] = f"hybrid decoded {measured:.2f}x faster than offload (predicted {predicted:.2f}x)"
        else:
            out["reason"] = (f"hybrid predicted {predicted:.2f}x but decoded at {measured:.2f}x offload "
                             f"end to end: offload kept")
    return out


@dataclass(frozen=True, slots=True)
class ResolvedSplit:
    split: Split
    reason: str


def resolve_split(mode: str, gpu: str | None, expert_format: str, directory: Path | None = None) -> ResolvedSplit:
    """auto: offload, upgraded to hybrid only when this machine's cached profile recommends it.
    hybrid: forced, with the profile's measured rates (a profile must exist)."""
    if mode not in SPLIT_MODES:
        raise ValueError(f"split mode {mode!r} is not one of {', '.join(SPLIT_MODES)}")
    if mode in ("offload", "cpu"):
        return ResolvedSplit(Split(mode), f"{mode} (asked for)")
    profile = find_profile(gpu, expert_format, directory)
    where = profile_path(gpu, expert_format, directory)
    if profile is None:
        if mode == "hybrid":
            raise ValueError(f"split hybrid needs measured bandwidths: no profile at {where}; run `ft bench bw` "
                             f"with --model DIR (the checkpoint served) on this machine")
        return ResolvedSplit(Split("offload"), f"offload (auto: no bandwidth profile at {where}; "
                                                      f"`ft bench bw --model DIR` writes it)")
    rec = profile["recommendation"]
    if mode == "auto" and rec["mode"] != "hybrid":
        return ResolvedSplit(Split("offload"), f"offload (auto: profile says {rec['mode']}: {rec['reason']})")
    if not (rec.get("bp_gb_s") and rec.get("bh_gb_s")):
        raise ValueError(f"split hybrid needs PCIe and CPU-lane rates; {where} has none (measured without a GPU)")
    split = Split("hybrid", "balanced", float(rec["bp_gb_s"]), float(rec["bh_gb_s"]))
    return ResolvedSplit(split, f"hybrid ({'auto' if mode == 'auto' else 'asked for'}: {rec['reason']})")
