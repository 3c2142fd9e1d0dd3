"""A short masked-LM pretraining run of a small BERT on the Chinese review corpus.

`attnlab train mlm` with a WordPiece vocabulary trained on the training split (on Chinese text it
is essentially one piece per character), pretraining on the train split only (the val split gives
the validation MLM loss; the test split is never read), for a fixed number of optimizer steps.
Records the training and validation MLM loss curves. The run directory is then the checkpoint for
``benchmarks/bert/finetune.py --name chinese_mlm --init <out> --data chinese_reviews``.

    python -m benchmarks.bert.mlm_pretrain --out runs/bench-mlm

Writes docs/results/bert_mlm_pretrain.json and .md.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from attnlab.runs import training
from benchmarks import common

ROOT = common.ROOT


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/bench-mlm")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--eval-every", type=int, default=100)
    args = parser.parse_args(argv)
    info = common.machine(threads=1)
    overrides = {
        "data": "chinese_reviews",
        "vocab_size": 8000,
        "max_len": 128,
        "d_model": 128,
        "n_layers": 4,
        "n_heads": 4,
        "d_ff": 512,
        "max_steps": args.steps,
        "eval_every": args.eval_every,
        "batch_size": 64,
        "lr": 1e-3,
        "warmup_ratio": 0.06,
        "tensorboard": False,
        "precision": "fp32",
        "num_threads": 1,  # on 2 busy shared cores, 2 threads ran ~5x slower than 1
        "seed": 0,
    }
    results = training.train("mlm", args.out, overrides)
    records = [json.loads(x) for x in (Path(args.out) / "metrics.jsonl").read_text().splitlines()]
    report = json.loads((Path(args.out) / "data_report.json").read_text())
    train = [(r["step"], r["loss"]) for r in records if r["split"] == "train"]
    val = [(r["step"], r["val_loss"], r["val_acc"]) for r in records if r["split"] == "val"]
    out = {
        "setup": {**overrides, "data_report": report, "n_params": results["n_params"]},
        "train_loss": train,
        "val": val,
        "uniform_loss": math.log(report["vocab_size"]),
        "summary": results["summary"],
        "machine": {**info, "load_average_at_end": common.load_average()},
    }
    write(out)


def write(results: dict) -> None:
    """docs/results/bert_mlm_pretrain.json and a Markdown summary."""
    docs = ROOT / "docs" / "results"
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "bert_mlm_pretrain.json").write_text(json.dumps(results, indent=2) + "\n")
    s, report = results["setup"], results["setup"]["data_report"]
    lines = [
        "# BERT masked-LM pretraining on the Chinese reviews (short run)",
        "",
        "Produced by `benchmarks/bert/mlm_pretrain.py`; raw numbers in `bert_mlm_pretrain.json`.",
        "",
        "- data: the Chinese reviews (`load_chinese_reviews()`): train split "
        f"{report['texts']['train']} texts "
        f"({report['tokens']['train']} tokens), val {report['texts']['val']}; the "
        f"{report['test_texts_excluded']} test texts are never read",
        f"- WordPiece trained on the train split: {report['vocab_size']} pieces "
        f"(uniform guessing = loss {results['uniform_loss']:.2f})",
        f"- BERT {s['n_layers']} layers, d_model {s['d_model']}, {s['n_heads']} heads, d_ff "
        f"{s['d_ff']}, max_len {s['max_len']}: {s['n_params'] / 1e6:.2f}M parameters",
        f"- {s['max_steps']} steps of batch {s['batch_size']}, AdamW lr {s['lr']}, 15% masking "
        f"(80/10/10), fp32, 1 thread; {results['summary']['wall_time_s'] / 60:.1f} min on "
        f"{results['machine']['logical_cores']} shared CPU cores",
        f"- first logged train loss (step {results['train_loss'][0][0]}): "
        f"{results['train_loss'][0][1]:.3f}",
        "",
        "| step | train MLM loss (window mean) | val MLM loss | val accuracy (masked tokens) |",
        "|---|---|---|---|",
    ]
    train = dict(results["train_loss"])
    for step, loss, acc in results["val"]:
        lines.append(f"| {step} | {train.get(step, float('nan')):.3f} | {loss:.3f} | {acc:.3f} |")
    lines.append("")
    common.write_page((docs / "bert_mlm_pretrain.md"), lines)


if __name__ == "__main__":
    main()
