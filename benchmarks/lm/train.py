"""Train a bundled language-model preset on the default Shakespeare split and record the result.

    python -m benchmarks.lm.train baby  [--threads 1] [--precision fp32]
    python -m benchmarks.lm.train small [--threads 1] [--precision auto] [--max-minutes 22]

Runs `attnlab train lm --config PRESET` into runs/bench-lm-PRESET, then measures the best
checkpoint's loss on the validation split, in the run's precision, twice: on the run's 200
evenly spaced evaluation windows (what training monitored) and on every non-overlapping window
of the split (the whole validation text). Writes docs/results/lm_PRESET.{json,md} (or
``--name``) and the loss curve beside them, with the machine, the thread count, the precision,
the wall time and a 500-character sample.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch

from attnlab.data.text_lm import eval_starts, open_tokens
from attnlab.infer.lm import LMRun, generate_text
from attnlab.runs import training
from attnlab.tasks.lm import mean_loss
from attnlab.train.precision import autocast
from benchmarks import common

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}
RESULTS = common.RESULTS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", choices=("baby", "small"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precision", default="fp32", choices=("auto", "fp32", "bf16"))
    parser.add_argument("--max-steps", type=int, default=0, help="0 = the preset's")
    parser.add_argument("--max-minutes", type=float, default=0.0)
    parser.add_argument("--eval-every", type=int, default=0, help="0 = the preset's")
    parser.add_argument("--name", default="", help="results file stem (default lm_PRESET)")
    args = parser.parse_args(argv)
    run_dir = Path(f"runs/bench-lm-{args.preset}")
    if run_dir.exists():
        shutil.rmtree(run_dir)
    info = common.machine(threads=args.threads)
    overrides = {"precision": args.precision, "num_threads": args.threads, "sample_tokens": 0}
    if args.max_steps:
        overrides["max_steps"] = args.max_steps
    if args.max_minutes:
        overrides["max_minutes"] = args.max_minutes
    if args.eval_every:
        overrides["eval_every"] = args.eval_every
    start = time.perf_counter()
    results = training.train("lm", run_dir, overrides, args.preset)
    total_s = time.perf_counter() - start
    torch.set_num_threads(args.threads)
    summary = results["summary"]
    run = LMRun.load(run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    val = open_tokens(run_dir / "data" / "val.bin", run.tokenizer.vocab_size)
    context = run.model.cfg.context
    windows = eval_starts(len(val), context, config["data"]["eval_windows"])
    every = eval_starts(len(val), context, 0)
    with autocast(torch.device("cpu"), PRECISIONS[summary["precision"]]):  # as training did
        loss_windows = mean_loss(run.model, val, windows, 32)
        loss_full = mean_loss(run.model, val, every, 32)
    sample = generate_text(run.model, run.tokenizer, "\n", 500, temperature=0.8, seed=0)
    info["load_average_at_end"] = common.load_average()
    out = {
        "preset": args.preset,
        "machine": info,
        "config": config,
        "steps": summary["steps"],
        "best_step": summary["best_step"],
        "stop_reason": summary["stop_reason"],
        "precision": summary["precision"],
        "precision_reason": summary["precision_reason"],
        "train_wall_s": summary["wall_time_s"],
        "total_wall_s": total_s,
        "val_loss_eval_windows": loss_windows,
        "val_windows": len(windows),
        "val_loss_full_split": loss_full,
        "val_tokens_full_split": len(every) * context,
        "final_train_loss": summary["final_train_loss"],
        "sample": sample.prompt + sample.texts[0],
    }
    name = args.name or f"lm_{args.preset}"
    out["curve"] = f"{name}.png"
    _, md_path = common.write_results(name, out, markdown(out))
    shutil.copyfile(run_dir / "curves.png", RESULTS / f"{name}.png")
    print(md_path.read_text())


def markdown(r: dict) -> list[str]:
    """The results page."""
    model, t = r["config"]["model"], r["config"]["train"]
    return [
        f"# Language model, preset `{r['preset']}`",
        "",
        f"Character-level GPT on the default Shakespeare split (last 10% of each of the 42 "
        f"works is validation). {model['n_layers']} layers, {model['n_heads']} heads, width "
        f"{model['d_model']}, context {model['context']}, batch {t['batch_size']}, lr "
        f"{t['lr']} (cosine to {t['min_lr_ratio']}×, {t['warmup_steps']} warm-up steps), "
        f"dropout {model['dropout']}, activation {model['activation']}, bias {model['bias']}.",
        "",
        common.machine_line(r["machine"]) + " Other jobs share the machine.",
        "",
        f"Precision {r['precision']} ({r['precision_reason']}).",
        "",
        "| | |",
        "|---|---|",
        f"| optimizer steps | {r['steps']} ({r['stop_reason']}); best at {r['best_step']} |",
        f"| training wall time | {r['train_wall_s'] / 60:.1f} min (with data preparation "
        f"{r['total_wall_s'] / 60:.1f} min) |",
        f"| val loss, {r['val_windows']} evaluation windows | {r['val_loss_eval_windows']:.4f} |",
        f"| val loss, whole validation split ({r['val_tokens_full_split']:,} tokens) | "
        f"{r['val_loss_full_split']:.4f} |",
        f"| last train loss (mean of the last log window) | {r['final_train_loss']:.4f} |",
        "",
        f"Loss curve: `{r['curve']}`. Sample (500 characters, temperature 0.8, seed 0):",
        "",
        "```",
        r["sample"].strip("\n"),
        "```",
    ]


if __name__ == "__main__":
    main()
