"""Train the default classifier preset and report its quality next to the classical baselines.

    python -m benchmarks.classify.quality [--out runs/quality] [KEY=VALUE ...]

Trains `attnlab train classify` (the default preset, bundled reviews, split seed 0 — the split
`benchmarks/classify/baselines.py` scores the baselines on), then writes
docs/results/classify_quality.md and .json: test accuracy and macro-F1, the wall time, the
baselines from docs/results/classify_baselines.json, and the tutorial's three examples.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

from attnlab.configs import parse_key_values
from attnlab.data.sentiment import TUTORIAL_EXAMPLES
from attnlab.infer.classifier import ClassifierRun
from attnlab.runs import training
from benchmarks import common

ROOT = common.ROOT
RESULTS = ROOT / "docs" / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="runs/quality", help="run directory")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument(
        "--render",
        action="store_true",
        help="only rewrite the markdown page from the committed JSON",
    )
    parser.add_argument(
        "--name", default="classify_quality", help="results file stem in docs/results/"
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    json_path, md_path = RESULTS / f"{args.name}.json", RESULTS / f"{args.name}.md"
    baselines_path = RESULTS / "classify_baselines.json"
    baselines = json.loads(baselines_path.read_text()) if baselines_path.exists() else {}
    if args.render:
        record = json.loads(json_path.read_text(encoding="utf-8"))
        common.write_page(
            md_path, render(record, baselines), common.recorded_command(record, md_path)
        )
        return 0
    overrides = {"arch": "char", **parse_key_values(args.overrides)}  # the character model
    started = time.perf_counter()
    results = training.train("classify", Path(args.out), overrides, resume=args.resume)
    wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_seconds = usage.ru_utime + usage.ru_stime
    run = ClassifierRun.load(args.out)
    examples = [
        {"text": text, "expected": want, "predicted": p["label"], "prob": p["probs"][p["label"]]}
        for (text, want), p in zip(
            TUTORIAL_EXAMPLES, run.predict([t for t, _ in TUTORIAL_EXAMPLES])
        )
    ]
    record = {
        "command": common.command_line(),
        "overrides": overrides,
        "config": json.loads((Path(args.out) / "config.json").read_text()),
        "test": {k: results["test"][k] for k in ("accuracy", "macro_f1", "n")},
        "val": {k: results["val"][k] for k in ("accuracy", "macro_f1", "n")},
        "n_params": results["n_params"],
        "train_wall_time_s": results["summary"]["wall_time_s"],
        "total_wall_time_s": wall,
        "process_cpu_time_s": cpu_seconds,
        "load_average_at_end": os.getloadavg(),
        "steps": results["summary"]["steps"],
        "stop_reason": results["summary"]["stop_reason"],
        "precision": results["summary"]["precision"],
        "examples": examples,
        "machine": common.machine(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(record, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    common.write_page(md_path, render(record, baselines), record["command"])
    print(render(record, baselines))
    return 0


def render(record: dict, baselines: dict) -> str:
    """The markdown results page."""
    m = record["config"]["model"]
    lines = [
        "# Chinese review sentiment: the default Transformer preset vs classical baselines",
        "",
        "Produced by `python -m benchmarks.classify.quality` (overrides: "
        f"`{record['overrides'] or 'none'}`). Same corpus and split as the baselines "
        "(`load_chinese_reviews()`, stratified 80/10/10, seed 0); the best checkpoint is "
        "chosen on validation accuracy, test is scored once.",
        "",
        "| model | test accuracy | test macro-F1 | training wall time |",
        "|---|---:|---:|---:|",
        f"| attnlab TextClassifier ({m['n_layers']} layers, d_model {m['d_model']}, "
        f"{m['n_heads']} heads, {m['pos']} positions, {m['pooling']} pooling"
        + (f", {m['bigram_buckets']} bigram buckets" if m.get("bigram_buckets") else "")
        + (
            f", bag of hashed 1-{m.get('ngram_max', 3)}-grams in {m['ngram_buckets']} buckets"
            if m.get("ngram_buckets")
            else ""
        )
        + (f"; an ensemble of {m['members']} such models" if m.get("members", 1) > 1 else "")
        + f"; {record['n_params'] / 1e6:.2f}M params) | {record['test']['accuracy']:.4f} | "
        f"{record['test']['macro_f1']:.4f} | {record['train_wall_time_s'] / 60:.1f} min |",
    ]
    for name, entry in baselines.get("methods", {}).items():
        lines.append(
            f"| baseline: {name} | {entry['test']['accuracy']:.4f} | "
            f"{entry['test']['macro_f1']:.4f} | {entry['seconds']:.0f} s |"
        )
    lines += [
        "",
        f"Validation accuracy {record['val']['accuracy']:.4f}; {record['steps']} optimizer "
        f"steps ({record['stop_reason']}), precision {record['precision']}.",
        "",
        "Tutorial examples:",
        "",
        "| text | expected | predicted | probability |",
        "|---|---|---|---:|",
    ]
    for ex in record["examples"]:
        lines.append(f"| {ex['text']} | {ex['expected']} | {ex['predicted']} | {ex['prob']:.3f} |")
    info = record["machine"]
    # records before benchmarks/common.py named the torch thread count "logical_cpus"
    threads = info["torch_threads"] if "torch_threads" in info else info["logical_cpus"]
    lines += [
        "",
        f"Machine: {info['cpu']}, {threads} threads, Python {info['python']}, "
        f"torch {info['torch']}. Total script wall time {record['total_wall_time_s'] / 60:.1f} "
        f"min; the process used {record['process_cpu_time_s'] / 60:.1f} CPU-minutes; 5-minute "
        f"load average at the end {record['load_average_at_end'][1]:.1f} on 2 cores (above 2 "
        "means other jobs shared the machine and stretched the wall time).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
