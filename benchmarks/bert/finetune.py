"""Pretrained vs from-scratch BERT on one classification split, measured in one script.

Both arms use the same checkpoint architecture and WordPiece tokenizer, the same corpus, split
(stratified 80/10/10, seed 0), truncation length, hyper-parameters, number of optimizer steps and
seed; they differ only in the encoder's initial weights: the checkpoint's (``pretrained``) or
BERT's random initialisation (``scratch``). Each arm keeps its best validation-accuracy weights;
the test split is scored once, at the end.

    python -m benchmarks.bert.finetune --name pang_lee                       # all-MiniLM-L6-v2
    python -m benchmarks.bert.finetune --name chinese_mlm --init runs/bench-mlm \
        --data chinese_reviews

Writes docs/results/bert_finetune_<name>.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from attnlab.runs import training
from benchmarks import common

ROOT = common.ROOT
ARMS = ("pretrained", "scratch")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="results file suffix")
    parser.add_argument("--init", default="minilm", help="checkpoint of the pretrained arm")
    parser.add_argument("--data", default="pang_lee")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--max-len", type=int, default=64, help="truncation cap (tokens)")
    parser.add_argument("--max-examples", type=int, default=0, help="balanced subsample; 0 = all")
    parser.add_argument("--out", default="runs/bench-bert-finetune")
    args = parser.parse_args(argv)
    info = common.machine(threads=1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    shared = {
        "arch": args.init,
        "data": args.data,
        "max_examples": args.max_examples,
        "max_truncate_len": args.max_len,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "tensorboard": False,
        "precision": "fp32",
        "num_threads": 1,  # on 2 busy shared cores, 2 threads ran ~5x slower than 1
        "seed": 0,
    }
    results: dict = {"setup": {**shared, "arms": {}}, "arms": {}}
    for arm in ARMS:
        out = Path(args.out) / f"{args.name}-{arm}"
        start = time.perf_counter()
        r = training.train("classify", out, {**shared, "pretrained": arm != "scratch",
                                             "extra_train": ""})  # fmt: skip
        report = json.loads((out / "data_report.json").read_text())
        results["arms"][arm] = {
            "test_accuracy": r["test"]["accuracy"],
            "test_macro_f1": r["test"]["macro_f1"],
            "best_val_accuracy": r["summary"]["best_metric"],
            "best_step": r["summary"]["best_step"],
            "steps": r["summary"]["steps"],
            "train_wall_s": r["summary"]["wall_time_s"],
            "total_wall_s": time.perf_counter() - start,
            "n_test": r["test"]["n"],
        }
        results["setup"]["arms"][arm] = "pretrained" if arm != "scratch" else "random"
        results["setup"] |= {
            "source": report["source"],
            "split_sizes": report["split_sizes"],
            "max_len": report["max_len"],
            "truncation": report["truncation"],
            "checkpoint": report["encoder"]["name"],
        }
    results["machine"] = {**info, "load_average_at_end": common.load_average()}
    write(args.name, results)


def write(name: str, results: dict) -> None:
    """docs/results/bert_finetune_<name>.json and a Markdown table of the two arms."""
    out = ROOT / "docs" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"bert_finetune_{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    s = results["setup"]
    lines = [
        f"# BERT fine-tuning: pretrained vs from scratch ({name})",
        "",
        f"Produced by `python -m benchmarks.bert.finetune --name {name} --init {s['init']} "
        f"--data {s['data']} --epochs {s['epochs']} --batch-size {s['batch_size']} --lr {s['lr']} "
        f"--max-len {s['max_truncate_len']} --max-examples {s['max_examples']}`; raw numbers in "
        f"`bert_finetune_{name}.json`. One run per arm (one seed).",
        "",
        f"- data: {s['source']}; split {s['split_sizes']} (stratified, seed 0)",
        f"- architecture and tokenizer of `--init {s['init']}`; max_len {s['max_len']} "
        f"({s['truncation']})",
        f"- both arms: {s['epochs']} epochs, batch {s['batch_size']}, AdamW lr {s['lr']}, "
        "linear decay after 10% warm-up, fp32, 1 thread, seed 0; best validation accuracy kept",
        f"- machine: {results['machine']['logical_cores']} shared CPU cores (1-min load "
        f"{results['machine']['load_average_at_end'][0]:.1f} at the end), torch "
        f"{results['machine']['torch']}",
        "",
        "| arm | init | test accuracy | test macro-F1 | best val accuracy | steps | train time |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, r in results["arms"].items():
        lines.append(
            f"| {arm} | {s['arms'][arm]} | {r['test_accuracy']:.4f} | {r['test_macro_f1']:.4f} "
            f"| {r['best_val_accuracy']:.4f} | {r['steps']} | {r['train_wall_s'] / 60:.1f} min |"
        )
    lines.append("")
    common.write_page((out / f"bert_finetune_{name}.md"), lines)


if __name__ == "__main__":
    main()
