"""Full vs local vs linear attention on the Shakespeare character LM at an equal budget.

    python -m benchmarks.lm.attention_quality [--steps 1000] [--context 128] [--window 32]

Trains the nanoGPT "baby" preset (4 layers × 4 heads × 128, batch 12, AdamW, cosine schedule)
with a context of ``--context`` characters three times, changing only ``attention``: full,
local (sliding window of ``--window`` characters) and linear (elu+1). Same data and split,
same seed, same number of optimizer steps, fp32, one thread. Reports the best validation loss
(on the run's 200 evenly spaced validation windows, evaluated every 250 steps), the wall time
and a sample; writes docs/results/lm_attention_quality.{json,md} (``--name``). Runs land in
runs/bench-lm-attention-KIND (replaced on each invocation).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path

from attnlab.runs import training
from benchmarks import common


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--kinds", default="full,local,linear")
    parser.add_argument("--name", default="lm_attention_quality", help="results file stem")
    args = parser.parse_args(argv)
    info = common.machine(threads=common.set_threads(1))
    rows = []
    for kind in args.kinds.split(","):
        run_dir = Path(f"runs/bench-lm-attention-{kind}")
        shutil.rmtree(run_dir, ignore_errors=True)
        overrides = {
            "context": args.context,
            "attention": kind,
            "max_steps": args.steps,
            "num_threads": 1,
            "precision": "fp32",
            "tensorboard": False,
            "seed": 0,
            "sample_tokens": 200,
        }
        if kind == "local":
            overrides["window"] = args.window
        start = time.perf_counter()
        res = training.train("lm", run_dir, overrides, "baby")
        wall = time.perf_counter() - start
        row = {
            "attention": kind,
            "window": args.window if kind == "local" else None,
            "best_val_loss": res["val_loss"],
            "perplexity": math.exp(res["val_loss"]),
            "best_step": res["summary"]["best_step"],
            "steps": res["summary"]["steps"],
            "train_minutes": res["summary"]["wall_time_s"] / 60,
            "wall_minutes": wall / 60,
            "precision": res["summary"]["precision"],
            "sample": res.get("sample", ""),
        }
        print(json.dumps({k: v for k, v in row.items() if k != "sample"}), flush=True)
        rows.append(row)
    info["load_average_at_end"] = common.load_average()
    data = {"machine": info, "settings": vars(args), "runs": rows}
    lines = [
        "# Full vs local vs linear attention at an equal budget (Shakespeare, characters)",
        "",
        "The baby GPT "
        f"preset (4 layers × 4 heads × 128) with context {args.context}, {args.steps} AdamW steps "
        "of batch 12, seed 0, fp32, one thread; only `attention` changes. Validation loss: the "
        "best of the evaluations every 250 steps, on 200 evenly spaced windows of the "
        "validation split (the last 10% of the text).",
        "",
        common.machine_line(info) + " Other jobs share the machine.",
        "",
        "| attention | val loss | perplexity | best step | train minutes |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        name = r["attention"] + (f" (window {r['window']})" if r["window"] else "")
        lines.append(
            f"| {name} | {r['best_val_loss']:.3f} | {r['perplexity']:.2f} | {r['best_step']} | "
            f"{r['train_minutes']:.1f} |"
        )
    lines += ["", "Samples (200 characters after a newline, temperature 0.8):", ""]
    for r in rows:
        lines += [f"**{r['attention']}**", "", "```", r["sample"].strip(), "```", ""]
    _, md_path = common.write_results(args.name, data, lines)
    print(md_path.read_text())


if __name__ == "__main__":
    main()
