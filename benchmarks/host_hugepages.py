"""The host expert lane from DRAM with the expert store on huge pages (as loaded) and on 4 KB pages (a plain copy of
the same tensors), interleaved in one process, best of N: one 8-expert MoE layer at batch 1, a random layer and
random experts per call, so every call streams its weights from DRAM; the same layer repeated (L3-resident) shows
the compute bound. Also the bytes of each store that the kernel backed with huge pages, and the share of the host
read bandwidth (a streaming reduction at the same thread count, measured in the same run) each lane reaches.

    python benchmarks/host_hugepages.py [--model CKPT] [--threads 1] [--calls 500] [--rounds 7]

Default model: `ft bench cpu`'s random Qwen3-MoE (h1024 l12 e64 top-8, built once and cached), bf16, plus its GPTQ
int4 g128 copy where one was built (`ft bench cpu --against llama.cpp` builds it).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch


def plain_copy(store):
    """The same store with every expert tensor copied to memory allocated without the huge-page advice."""
    import copy

    out = copy.copy(store)
    out._host = {}
    fresh = lambda t: torch.empty_like(t).copy_(t)  # noqa: E731  (torch.empty_like: no advice)
    if store.packed:
        out.gate, out.up, out.down = ([replace(w, **{k: fresh(t) for k, t in w.tensors().items()}) for w in ws]
                                      for ws in (store.gate, store.up, store.down))
    else:
        out.gate_up, out.down = [fresh(t) for t in store.gate_up], [fresh(t) for t in store.down]
    return out


def tensors(store):
    return ([t for ws in (store.gate, store.up, store.down) for w in ws for t in w.tensors().values()]
            if store.packed else [*store.gate_up, *store.down])


def race(path: Path, threads: int, calls: int, rounds: int) -> None:
    from freetoken.calibrate.traffic import ReadProbe
    from freetoken.engine.slots import ExpertStore
    from freetoken.host import kernels as hk
    from freetoken.hugepages import huge_bytes
    from freetoken.models.checkpoint import load_checkpoint

    hk.set_threads(threads)
    torch.set_num_threads(threads)
    huge = ExpertStore.from_checkpoint(load_checkpoint(path))
    small = plain_copy(huge)
    stores = {"huge pages": huge, "4 KB pages": small}
    total = sum(t.numel() * t.element_size() for t in tensors(huge))
    rng = np.random.default_rng(0)
    E, L, K = huge.num_experts, huge.num_layers, 8
    x, w = torch.randn(1, huge.hidden).to(huge.dtype), torch.rand(1, K)
    picks = [(int(rng.integers(L)), rng.choice(E, K, replace=False)[None].astype(np.int32)) for _ in range(calls)]
    runs = {(name, where): (store, picks if where == "DRAM" else [picks[0]] * calls)
            for name, store in stores.items() for where in ("DRAM", "L3")}
    for store, seq in runs.values():
        for layer, ids in seq[:20]:
            store.host_moe(layer, x, ids, w, None, cast=True)
    best = dict.fromkeys(runs, float("inf"))
    probe, read = ReadProbe(1 << 30, 0.3), 0.0
    for _ in range(rounds):
        for key, (store, seq) in runs.items():
            t0 = time.perf_counter()
            for layer, ids in seq:
                store.host_moe(layer, x, ids, w, None, cast=True)
            best[key] = min(best[key], (time.perf_counter() - t0) / calls)
        read = max(read, probe(threads))
    layer_bytes = K * huge.expert_bytes
    print(f"{huge.format} experts ({path}), {threads} thread(s), {layer_bytes / 1e6:.2f} MB per layer call; "
          f"host read bandwidth {read:.1f} GB/s (best of {rounds}, between the rounds)")
    for name, store in stores.items():
        backed = sum(huge_bytes(t) > 0 for t in tensors(store))
        print(f"  {name:11s} ({backed} of {len(tensors(store))} tensors in a huge-page mapping, "
              f"{total / 1e9:.2f} GB): "
              + ", ".join(f"{where} {best[(name, where)] * 1e3:.3f} ms = {layer_bytes / best[(name, where)] / 1e9:.1f} GB/s"
                          for where in ("DRAM", "L3"))
              + f" (DRAM: {layer_bytes / best[(name, 'DRAM')] / 1e9 / read:.0%} of the read bandwidth)")
    print(f"  DRAM speed-up from huge pages: {best[('4 KB pages', 'DRAM')] / best[('huge pages', 'DRAM')]:.2f}x")


def main() -> None:
    from freetoken.calibrate.checkpoints import RandomMoE, random_checkpoint
    from freetoken.calibrate.cpu_bench import default_work_dir

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, help="a checkpoint folder (default: the random benchmark model)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    if args.model is not None:
        models = [args.model]
    else:
        model = random_checkpoint(RandomMoE(), Path(default_work_dir()))
        models = [model] + [m for m in (model.parent / "gptq-int4-g128",) if m.exists()]
    for m in models:
        race(m, args.threads, args.calls, args.rounds)


if __name__ == "__main__":
    main()
