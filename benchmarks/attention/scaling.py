"""One block's forward + backward time and peak memory from T = 512 to 16384, four attentions.

    python -m benchmarks.attention.scaling [--max-T 16384] [--threads 1] [--time-cap 60]

Explicit full attention (the step-by-step path that materialises the T × T scores), PyTorch's
fused kernel, local attention (window 256) and linear attention (elu+1), each in a causal
pre-norm block (d_model 256, 4 heads of 64, d_ff 1024), batch 1, float32, one thread. Each
point runs in a fresh process; points whose estimated memory or predicted time exceed the
guards are skipped with the reason (method: src/attnlab/bench/scaling.py). Writes
docs/results/scaling.{md,json,png} with the fitted exponents of time and memory (T ≥ 1024).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from attnlab.bench.machine import matmul_peak_gflops
from attnlab.bench.report import render_scaling
from attnlab.bench.scaling import plot_scaling, run_scaling
from benchmarks import common


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-T", type=int, default=16384)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--time-cap", type=float, default=60.0, help="seconds per step, max")
    parser.add_argument("--mem-limit", type=float, default=12.0, help="GiB per point, max")
    parser.add_argument("--out", default="docs/results/scaling")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    lengths = [512 * 2**i for i in range(10) if 512 * 2**i <= args.max_T]
    info = common.machine()
    info["matmul_peak_gflops"] = matmul_peak_gflops()
    result = run_scaling(
        lengths, threads=args.threads, time_cap_s=args.time_cap, mem_limit_gib=args.mem_limit
    )
    info["load_average_at_end"] = common.load_average()
    result["machine"] = info
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    plot_scaling(result, out.with_suffix(".png"))
    flags = f" --max-T {args.max_T} --threads {args.threads} --time-cap {args.time_cap:g}"
    command = f"python -m benchmarks.attention.scaling{flags}"
    text = render_scaling(result, command, out.name + ".png")
    common.write_page(out.with_suffix(".md"), text, command)
    print(text)


if __name__ == "__main__":
    main()
