"""Peak RSS of `ft generate --cpu-moe` against the checkpoint's bytes on a deeper random Qwen3-MoE than `ft bench cpu`'s
(default 48 layers: 7.6 GB bf16, 2.1 GB GPTQ int4 g128), where the process's own cost (the interpreter, torch,
numba: ~0.35 GB, measured as the same run on the tiny demo model) no longer dominates the ratio. Each side alone in a
child process, as `ft bench cpu` measures it; the checkpoints are built once and cached (a few minutes, 10 GB of disk).

    python benchmarks/peak_rss_large.py [--layers 48] [--threads 1]
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    from freetoken.calibrate import child_rss
    from freetoken.calibrate.checkpoints import RandomMoE, cached, random_checkpoint
    from freetoken.calibrate.cpu_bench import default_work_dir
    from freetoken.calibrate.gptq import write_gptq
    from freetoken.calibrate.sides import FT_MODES, prompt_ids

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    model = random_checkpoint(RandomMoE(layers=args.layers), Path(default_work_dir()))
    gptq = cached(model.parent / "gptq-int4-g128", lambda tmp: write_gptq(model, tmp, log=print))
    prompt, flags = prompt_ids(512, 0), FT_MODES["cpu-moe"].flags
    fixed = child_rss.ft_process_rss(flags, prompt, 32, args.threads)
    print(f"ft generate {' '.join(flags)}, 512-token prompt, 32 tokens; the process's own cost {fixed / 1e9:.2f} GB")
    for path in (model, gptq):
        peak = child_rss.ft_generate_rss(str(path), flags, prompt, 32, args.threads)
        size = child_rss.checkpoint_bytes(str(path))
        print(f"  {path.name}: peak RSS {peak / 1e9:.2f} GB, checkpoint {size / 1e9:.2f} GB: whole process "
              f"{peak / size:.2f}x, net of the process's cost {(peak - fixed) / size:.2f}x")


if __name__ == "__main__":
    main()
