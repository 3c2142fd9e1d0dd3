"""AdamW step time: torch's fused CPU kernel (what `build_optimizer` picks) against torch's
default on the CPU, a Python loop over the tensors, on the parameters of the mixer benchmark's
models (benchmarks/mixers/speed.py: the MoE LM and its dense2x baseline).

    python -m benchmarks.engine.adamw_fused [--steps 30]

One torch thread; random gradients; the two optimizers take turns step by step, each step timed
in CPU seconds of this process (time.process_time), median reported. Writes
docs/results/adamw_fused.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from attnlab.train.optim import param_groups
from benchmarks import common
from benchmarks.mixers.speed import build  # the same models, built the same way

OUT = Path("docs/results/adamw_fused")


def time_steps(name: str, steps: int) -> dict:
    model, fused = build(name, 64)
    assert all(g["fused"] for g in fused.param_groups)
    loop = torch.optim.AdamW(
        param_groups(model, 0.01), lr=1e-4, betas=(0.9, 0.98), foreach=False, fused=False
    )
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p)
    times: dict[str, list[float]] = {"fused": [], "loop": []}
    for i in range(steps + 3):
        for label, opt in (("fused", fused), ("loop", loop)):
            t0 = time.process_time()
            opt.step()
            if i >= 3:  # the first steps allocate the moments
                times[label].append(time.process_time() - t0)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {"model": name, "params": sum(p.numel() for p in params), **ms}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args(argv)
    info = common.machine(threads=common.set_threads(1))
    rows = [time_steps(name, args.steps) for name in ("moe", "dense2x")]
    load = [round(x, 1) for x in common.load_average()]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.with_suffix(".json").write_text(
        json.dumps({"machine": info, "rows": rows, "load": load}, indent=1) + "\n"
    )
    lines = [
        "# AdamW step: torch's fused CPU kernel against its default loop",
        "",
        "One thread, CPU time per "
        f"step, median of {args.steps} interleaved steps; load average {load} at the end.",
        "",
        "| model (benchmarks/mixers/speed.py) | parameters | loop ms | fused ms | loop ÷ fused |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['params']:,} | {r['loop']:.1f} | {r['fused']:.1f} | "
            f"{r['loop'] / r['fused']:.2f} |"
        )
    common.write_page(OUT.with_suffix(".md"), lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
