"""Forward-pass CPU time of the pruned models of `benchmarks/compress/prune_heads.py` and
`benchmarks/compress/prune_minilm.py`.

On a machine shared with other jobs, wall-clock latency measures the neighbours more than the
model. This script re-creates each pruned model from the importance those runs saved (the same
heads removed), and measures the **CPU time of this thread** per forward pass over the same
batch, the models taking turns round after round so that they see the same load; the median
per model, and its ratio to the unpruned model.

    python -m benchmarks.compress.prune_speed --run RUN [--minilm] [--rounds 5]
        -> docs/results/prune_speed.{json,md}
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch

from attnlab.compress.heads import heads_to_remove, prune_heads
from benchmarks import common
from benchmarks.compress.prune_heads import test_batches, timing_batch


def pad_importance(rows: list[list[float]]) -> torch.Tensor:
    H = max(len(r) for r in rows)
    return torch.tensor([r + [float("inf")] * (H - len(r)) for r in rows])


def models_of(base: torch.nn.Module, importance: torch.Tensor, counts: list[int]) -> dict:
    out = {}
    for n in counts:
        model = copy.deepcopy(base)
        prune_heads(model, heads_to_remove(importance, n))
        out[n] = model.eval()
    return out


@torch.no_grad()
def cpu_ms(models: dict, batch: dict[str, torch.Tensor], rounds: int) -> dict[int, dict]:
    """Per model: median thread-CPU and wall ms of one forward pass, models taking turns."""
    cpu: dict[int, list[float]] = {n: [] for n in models}
    wall: dict[int, list[float]] = {n: [] for n in models}
    for model in models.values():
        model(batch["input_ids"], batch["lengths"])  # warm-up
    for _ in range(rounds):
        for n, model in models.items():
            c, w = time.thread_time(), time.perf_counter()
            model(batch["input_ids"], batch["lengths"])
            cpu[n].append(1000 * (time.thread_time() - c))
            wall[n].append(1000 * (time.perf_counter() - w))
    return {n: {"cpu_ms": statistics.median(cpu[n]), "wall_ms": statistics.median(wall[n])}
            for n in models}  # fmt: skip


def classifier_rows(run_dir: str, rounds: int) -> dict:
    from attnlab.runs.load import load_run

    saved = json.loads(Path("docs/results/prune_heads.json").read_text())
    result = next(r for r in saved["results"] if r["run"] == run_dir)
    run = load_run(run_dir)
    counts = [row["heads_removed"] for row in result["rows"]]
    models = models_of(run.model.float().eval(), pad_importance(result["importance"]), counts)
    return {"model": f"classify {run_dir}",
            "timing": cpu_ms(models, timing_batch(test_batches(run)), rounds)}  # fmt: skip


def minilm_rows(rounds: int) -> dict:
    from prune_minilm import batches

    from attnlab.data.english_sentiment import balanced_subsample, load_pang_lee
    from attnlab.models.bert import BertClassifier
    from attnlab.models.bert_folder import read_folder

    saved = json.loads(Path("docs/results/prune_heads_minilm.json").read_text())
    encoder, _, tokenizer, _ = read_folder("minilm")
    model = BertClassifier(encoder.cfg, 2, "mean").eval()
    model.bert.load_state_dict(encoder.state_dict())
    corpus = balanced_subsample(load_pang_lee(), 100, 1)
    batch = batches(corpus.texts, [0] * len(corpus.texts), tokenizer, size=100)[0]
    counts = [row["heads_removed"] for row in saved["rows"]]
    models = models_of(model, torch.tensor(saved["importance"]), counts)
    return {"model": "all-MiniLM-L6-v2", "timing": cpu_ms(models, batch, rounds)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default=None, help="the classify run of prune_heads.json")
    parser.add_argument("--minilm", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    info = common.machine(threads=1)
    load_start = info["load_average_at_start"][0]
    results = []
    if args.run:
        results.append(classifier_rows(args.run, args.rounds))
    if args.minilm:
        results.append(minilm_rows(args.rounds))
    meta = {**info, "rounds": args.rounds, "load_average_at_end": common.load_average()}
    command = "python -m benchmarks.compress.prune_speed"
    command += f" --run {args.run}" if args.run else ""
    command += (" --minilm" if args.minilm else "") + f" --rounds {args.rounds}"
    out = Path("docs/results/prune_speed")
    out.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "command": command, "results": results}, indent=2) + "\n"
    )
    lines = [
        "# Pruned models: CPU time per forward pass (`benchmarks/compress/prune_speed.py`)",
        "",
        f"`{command}`",
        "",
        f"Thread CPU time (and wall time) of one forward pass, median of {args.rounds} rounds in "
        f"which the models take turns; one thread, {meta['logical_cores']} logical cores shared "
        f"with other jobs (load average {load_start:.1f} at start, "
        f"{meta['load_average_at_end'][0]:.1f} at end). The "
        "classifier's batch is prune_heads.md's (256 test texts); MiniLM's is 100 Pang & Lee "
        "sentences of 48 tokens (importance and heads removed: prune_heads_minilm.json).",
    ]
    for r in results:
        base = r["timing"][min(r["timing"])]["cpu_ms"]
        lines += ["", f"## {r['model']}", "", "| heads removed | CPU ms | wall ms | CPU speed-up |",
                  "|---|---|---|---|"]  # fmt: skip
        for n, t in r["timing"].items():
            lines.append(
                f"| {n} | {t['cpu_ms']:.1f} | {t['wall_ms']:.1f} | {base / t['cpu_ms']:.2f}x |"
            )
    common.write_page(out.with_suffix(".md"), lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
