"""Accuracy, size and speed of classifiers with 0, 1, 2, ... attention heads removed.

Head importance (Michel et al. 2019) is measured once on each run's validation split; heads are
then removed in order of importance (at least one per layer stays) and each pruned model is
scored on the validation and test splits, its parameters counted and its forward pass timed on
the same 256 test texts, one thread, all models side by side in this one process.

    python -m benchmarks.compress.prune_heads --run RUN [--run RUN2 ...] [--name NAME]
        -> docs/results/prune_heads[_NAME].{json,md}
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch

from attnlab.commands.prune import (
    accuracy,
    batches,
    count_parameters,
    loss_fn,
    prunable_model,
    validation_data,
)
from attnlab.compress.heads import head_importance, heads_to_remove, prune_heads
from attnlab.runs.load import load_run
from benchmarks import common


def test_batches(run) -> list[dict[str, torch.Tensor]]:
    """The run's test split, batched as for evaluation."""
    texts, labels, _ = run.split_texts("test")
    return batches(run.dataset(texts, labels))


def timing_batch(test: list[dict[str, torch.Tensor]], size: int = 256) -> dict[str, torch.Tensor]:
    """The first ``size`` test examples as one right-padded batch."""
    ids, lengths, n = [], [], 0
    for b in test:
        ids += list(b["input_ids"])
        lengths += list(b["lengths"])
        n += len(b["lengths"])
        if n >= size:
            break
    width = max(len(x) for x in ids)
    padded = [torch.nn.functional.pad(x, (0, width - len(x))) for x in ids[:size]]
    return {"input_ids": torch.stack(padded), "lengths": torch.stack(lengths[:size])}


@torch.no_grad()
def latency_ms(model: torch.nn.Module, batch: dict[str, torch.Tensor], rounds: int) -> float:
    """Median wall time of one forward pass over ``batch`` (ms)."""
    model(batch["input_ids"], batch["lengths"])  # warm-up
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        model(batch["input_ids"], batch["lengths"])
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def sweep(run_dir: str, rounds: int, every: int) -> dict:
    run = load_run(run_dir)
    model = prunable_model(run).float().eval()
    val, test = batches(validation_data(run)), test_batches(run)
    timing = timing_batch(test)
    importance = head_importance(model, val, loss_fn)
    total = int(torch.isfinite(importance).sum())
    layers = importance.shape[0]
    rows = []
    most = total - layers
    for n in sorted({*range(0, most + 1, every), most}):
        pruned = copy.deepcopy(model)
        kept = prune_heads(pruned, heads_to_remove(importance, n))
        rows.append(
            {
                "heads_removed": n,
                "heads_per_layer": kept,
                "val": accuracy(pruned, val),
                "test": accuracy(pruned, test),
                "parameters": count_parameters(pruned),
                "latency_ms": latency_ms(pruned, timing, rounds),
            }
        )
        print(run.task, n, rows[-1]["test"], f"{rows[-1]['latency_ms']:.1f} ms", flush=True)
    base = rows[0]["latency_ms"]
    for row in rows:
        row["speed_vs_unpruned"] = base / row["latency_ms"]
    return {
        "run": run_dir,
        "task": run.task,
        "importance": [[float(v) for v in r if torch.isfinite(v)] for r in importance],
        "timing_batch": list(timing["input_ids"].shape),
        "rows": rows,
    }


def markdown(results: list[dict], meta: dict, command: str) -> str:
    lines = [
        "# Attention heads removed: accuracy, size, speed (`benchmarks/compress/prune_heads.py`)",
        "",
        f"`{command}`",
        "",
        f"One thread, torch {meta['torch']}, {meta['logical_cores']} logical cores shared with "
        f"other jobs (load average {meta['load_average_at_start'][0]:.1f} at start, "
        f"{meta['load_average_at_end'][0]:.1f} at end): "
        "latencies are noisy, compare them within a table. Importance: Michel et al. 2019 "
        "(|∂L/∂ξ_h| summed over the validation split, normalised per layer); heads removed "
        "least important first, one head always left per layer; weights cut out (smaller "
        "projections), nothing retrained. Latency: median of one forward pass over "
        "the same test batch.",
    ]
    for r in results:
        lines += [
            "",
            f"## {r['task']}: `{r['run']}` (timing batch {r['timing_batch']})",
            "",
            "| heads removed | kept per layer | val acc | test acc | attention params | "
            "all params | latency ms | speed |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in r["rows"]:
            lines.append(
                f"| {row['heads_removed']} | {row['heads_per_layer']} | "
                f"{row['val']['accuracy']:.4f} | {row['test']['accuracy']:.4f} | "
                f"{row['parameters']['attention']:,} | {row['parameters']['total']:,} | "
                f"{row['latency_ms']:.1f} | {row['speed_vs_unpruned']:.2f}x |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, help="classifier run folder")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--name", default="", help="suffix of the result files")
    parser.add_argument("--every", type=int, default=1, help="remove 0, k, 2k, ... heads")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    info = common.machine(threads=1)
    results = [sweep(run, args.rounds, args.every) for run in args.run]
    meta = {
        **info,
        "load_average_at_end": common.load_average(),
    }
    command = (
        "python -m benchmarks.compress.prune_heads "
        + " ".join(f"--run {r}" for r in args.run)
        + (f" --name {args.name}" if args.name else "")
    )
    stem = Path("docs/results") / ("prune_heads" + (f"_{args.name}" if args.name else ""))
    stem.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "command": command, "results": results}, indent=2) + "\n"
    )
    common.write_page(stem.with_suffix(".md"), markdown(results, meta, command), command)
    print(f"written {stem}.json and .md")


if __name__ == "__main__":
    main()
