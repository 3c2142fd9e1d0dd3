"""Positional extrapolation: one small GPT per position method, trained at context L, evaluated
at 1x, 2x, 4x, 8x and 16x L.

    python -m benchmarks.lm.extrapolation [--steps 600] [--seeds 0] [--windows 24] [--context 64]
        [--jobs 1]

Trains the pinned nanoGPT "baby" preset (4 layers x 4 heads x 128, context L = 64 or
``--context``, batch 12, AdamW, cosine schedule) on the Shakespeare characters once per
``pos``: none (NoPE), sinusoidal, learned, rope, alibi, t5. Only ``pos`` changes; same data,
split, seed and number of steps; fp32, one thread. Then loads each run's weights into the same
GPT built with context n·L (no retraining) and measures the validation loss of every position of
``--windows`` disjoint windows of n·L characters taken from the start of the validation split
(the same characters for every n). Extra rows, inference-time changes of the RoPE run only:
position interpolation (factor n), NTK-aware scaling (factor n) and sliding-window attention
over the last L keys (each query sees exactly the span it was trained on). The learned table has
no vector past L: those cells are refused (recorded as such, not estimated). Writes
docs/results/extrapolation.{json,md,png} (``--out`` for another name). ``--jobs N`` trains and
evaluates N runs at a time, each in its own process on one thread (the same runs as one after
another; only the wall time changes).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from attnlab.data.text_lm import open_tokens
from attnlab.infer.lm import LMRun
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.runs.training import train
from benchmarks import common

RESULTS = Path("docs/results")
METHODS = ("none", "sinusoidal", "learned", "rope", "alibi", "t5")
MULTIPLES = (1, 2, 4, 8, 16)
# Inference-time variants of the RoPE run: (row name, config changes for evaluation length n·L)
ROPE_VARIANTS = {
    "rope + PI": lambda n, L: dict(rope_scaling="linear", rope_factor=float(n)),
    "rope + NTK": lambda n, L: dict(rope_scaling="ntk", rope_factor=float(n)),
    "rope + sliding window L": lambda n, L: dict(attention="local", window=L),
}


def train_method(pos: str, seed: int, steps: int, root: Path, L: int) -> Path:
    run_dir = root / f"{pos}-seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = {
        "pos": pos,
        "context": L,
        "max_steps": steps,
        "eval_every": steps,
        "num_threads": 1,
        "precision": "fp32",
        "tensorboard": False,
        "seed": seed,
        "sample_tokens": 0,
    }
    train("lm", run_dir, overrides, "baby")
    return run_dir


@torch.no_grad()
def position_losses(model: GPT, tokens: np.ndarray, length: int, n_tokens: int) -> torch.Tensor:
    """Mean next-token loss at each position 0..length-1 over the disjoint windows of
    ``length`` tokens in the first ``n_tokens`` + 1 tokens."""
    data = torch.from_numpy(np.asarray(tokens[: n_tokens + 1]).astype(np.int64))
    n_windows = n_tokens // length
    x = data[: n_windows * length].view(n_windows, length)  # (W, n)
    y = data[1 : n_windows * length + 1].view(n_windows, length)
    total = torch.zeros(length, dtype=torch.float64)
    batch = max(1, 4096 // length)
    for i in range(0, n_windows, batch):
        logits = model(x[i : i + batch])  # (b, n, V)
        loss = F.cross_entropy(logits.transpose(1, 2), y[i : i + batch], reduction="none")
        total += loss.double().sum(dim=0)  # (n,)
    return total / n_windows


def evaluate(run_dir: Path, n_tokens: int, L: int) -> dict[str, dict]:
    """Rows for this run's method (and its RoPE variants): loss by evaluation length."""
    run = LMRun.load(run_dir)
    cfg: GPTConfig = run.model.cfg
    state = run.model.state_dict()
    val = open_tokens(run_dir / "data" / "val.bin", cfg.vocab_size)
    variants = {cfg.pos: lambda n, L: {}}
    if cfg.pos == "rope":
        variants.update(ROPE_VARIANTS)
    rows = {}
    for name, changes in variants.items():
        row = {"loss": {}, "refused": {}, "by_position": None}
        for n in MULTIPLES:
            length = n * L
            model = GPT(replace(cfg, context=length, **changes(n, L))).eval()
            try:
                model.load_state_dict(state)
            except RuntimeError as exc:  # the learned table: no rows past L
                row["loss"][n] = None
                row["refused"][n] = str(exc).splitlines()[-1].strip()
                continue
            per_pos = position_losses(model, val, length, n_tokens)
            row["loss"][n] = per_pos.mean().item()
            if n == MULTIPLES[-1]:
                row["by_position"] = [round(v, 4) for v in per_pos.tolist()]
        rows[name] = row
    return rows


def train_and_evaluate(
    pos: str, seed: int, steps: int, root: Path, n_tokens: int, L: int
) -> tuple[float, dict[str, dict]]:
    """One run: (training minutes, its rows by name). Runs in a worker process with --jobs."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    run_dir = train_method(pos, seed, steps, root, L)
    minutes = (time.perf_counter() - start) / 60
    rows = evaluate(run_dir, n_tokens, L)
    for name, row in rows.items():
        print(name, seed, json.dumps(row["loss"]), flush=True)
    return minutes, rows


def mean_or_none(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else sum(values) / len(values)


def plot(result: dict, path: Path, L: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (name, row) in enumerate(result["rows"].items()):
        color = f"C{i}"  # the same colour in both panels
        xs = [n * L for n in MULTIPLES if row["mean"][str(n)] is not None]
        ys = [row["mean"][str(n)] for n in MULTIPLES if row["mean"][str(n)] is not None]
        style = "--" if name.startswith("rope +") else "-"
        ax.plot(xs, ys, style, marker="o", label=name, color=color)
        if row["by_position"]:
            pos = np.asarray(row["by_position"])
            k = 32
            smooth = pos[: len(pos) // k * k].reshape(-1, k).mean(axis=1)
            bx.plot(np.arange(len(smooth)) * k + k / 2, smooth, style, label=name, color=color)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluation length (characters)")
    ax.set_ylabel("validation loss (nats / character, mean over positions)")
    ax.axvline(L, color="grey", lw=0.8)
    ax.set_title(f"trained at L = {L}")
    ax.set_ylim(top=min(ax.get_ylim()[1], 5.0))
    bx.set_xlabel(f"position in a window of {MULTIPLES[-1] * L} (mean of 32)")
    bx.set_ylabel("validation loss at that position")
    bx.axvline(L, color="grey", lw=0.8)
    bx.set_ylim(top=min(bx.get_ylim()[1], 5.0))
    bx.set_title(f"loss by position at {MULTIPLES[-1]}x L (seed {result['settings']['seeds'][0]})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_markdown(result: dict, path: Path, command: str) -> None:
    s, info = result["settings"], common.upgrade_machine(result["machine"])
    L = s["context"]
    head = "| method | " + " | ".join(f"{n}x ({n * L})" for n in MULTIPLES) + " |"
    lines = [
        f"# Positional extrapolation (Shakespeare characters, trained at L = {L})",
        "",
        f"Generated by `{command}`. The baby GPT (4 layers x 4 heads x 128, bias off, tied "
        f"embeddings) trained at context {L} for {s['steps']} AdamW steps of batch 12, seeds "
        f"{s['seeds']}, fp32, one thread, once per position method; evaluated with the same "
        f"weights at n x L on {s['eval_tokens']} validation characters (the same characters at "
        "every length, cut into disjoint windows). Cell: mean next-character loss in nats over "
        "every position of the window (mean over seeds; spread in the json). `refused`: the "
        "learned table has no vector past L, so the weights cannot be evaluated there.",
        "",
        f"Machine: {info['cpu']}, torch {info['torch']}, 1 thread per run, "
        f"{s.get('jobs', 1)} run(s) at a time; load average "
        f"{info['load_average_at_start'][0]:.1f} at start, {info['load_average_at_end'][0]:.1f} at "
        f"end (shared with other jobs). Training minutes per run: "
        + ", ".join(f"{k} {v:.1f}" for k, v in result["train_minutes"].items())
        + ".",
        "",
    ]
    if info.get("reruns"):
        lines += [
            "Rows rerun after the first pass, merged into these files (`--methods M --merge`, "
            "same settings): " + "; ".join(info["reruns"]) + ". The machine line above is the "
            "rerun's.",
            "",
        ]
    lines += [head, "|---|" + "---:|" * len(MULTIPLES)]
    for name, row in result["rows"].items():
        cells = []
        for n in MULTIPLES:
            v = row["mean"][str(n)]
            cells.append("refused" if v is None else f"{v:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    n = MULTIPLES[-1] * L
    lines += [
        "",
        f"By position inside a {n}-character window (mean loss over the positions named):",
        "",
        f"| method | 0..{L - 1} | {L}..{2 * L - 1} | {n - L}..{n - 1} |",
        "|---|---:|---:|---:|",
    ]
    for name, row in result["rows"].items():
        pos = row["by_position"]
        if pos:
            parts = [pos[:L], pos[L : 2 * L], pos[-L:]]
            lines.append(f"| {name} | " + " | ".join(f"{sum(p) / L:.3f}" for p in parts) + " |")
    png = path.with_suffix(".png").name
    lines += ["", f"Plot: `{png}` (left: by length; right: by position at 16x L)."]
    common.write_page(path, lines, command)


def command_line(settings: dict, jobs: int) -> str:
    """The command that reproduces a result with these settings."""
    L = settings["context"]
    command = (
        f"python -m benchmarks.lm.extrapolation --steps {settings['steps']} --seeds "
        f"{','.join(map(str, settings['seeds']))} --windows {settings['eval_tokens'] // (16 * L)}"
    )
    if L != 64:
        command += f" --context {L}"
    if jobs > 1:
        command += f" --jobs {jobs}"
    return command


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--windows", type=int, default=24, help="windows of 16·L to evaluate")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--context", type=int, default=64, help="the training context L")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time, one thread each")
    parser.add_argument("--out", default=str(RESULTS / "extrapolation"))
    parser.add_argument("--runs", default="runs/bench-extrapolation")
    parser.add_argument(
        "--replot", action="store_true", help="redraw the png and md from the existing json only"
    )
    parser.add_argument(
        "--merge", action="store_true", help="keep the other methods' rows of the existing json"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.replot:
        out = Path(args.out)
        result = json.loads(out.with_suffix(".json").read_text())
        s = result["settings"]
        command = command_line(s, s.get("jobs", 1))
        write_markdown(result, out.with_suffix(".md"), command)
        plot(result, out.with_suffix(".png"), s["context"])
        return
    info = common.machine()
    L = args.context
    n_tokens = args.windows * MULTIPLES[-1] * L
    seeds = [int(s) for s in args.seeds.split(",")]
    jobs = [(pos, seed) for pos in args.methods.split(",") for seed in seeds]
    work = (args.steps, Path(args.runs), n_tokens, L)
    if args.jobs > 1:  # worker processes, results gathered in the serial order
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
            futures = [pool.submit(train_and_evaluate, pos, seed, *work) for pos, seed in jobs]
            results = [f.result() for f in futures]
    else:
        results = [train_and_evaluate(pos, seed, *work) for pos, seed in jobs]
    per_seed: dict[str, list[dict]] = {}
    train_minutes: dict[str, float] = {}
    for (pos, seed), (minutes, run_rows) in zip(jobs, results):
        train_minutes[f"{pos} s{seed}"] = minutes
        for name, row in run_rows.items():
            per_seed.setdefault(name, []).append(row)
    rows = {}
    for name, runs in per_seed.items():
        mean = {str(n): mean_or_none([r["loss"][n] for r in runs]) for n in MULTIPLES}
        spread = {
            str(n): None
            if mean[str(n)] is None
            else max(r["loss"][n] for r in runs) - min(r["loss"][n] for r in runs)
            for n in MULTIPLES
        }
        rows[name] = {
            "mean": mean,
            "max_minus_min_over_seeds": spread,
            "per_seed": [{str(n): r["loss"][n] for n in MULTIPLES} for r in runs],
            "refused": runs[0]["refused"],
            "by_position": runs[0]["by_position"],
            "perplexity_1x": math.exp(mean["1"]) if mean["1"] is not None else None,
        }
    info["load_average_at_end"] = common.load_average()
    settings = {"steps": args.steps, "seeds": seeds, "context": L, "eval_tokens": n_tokens}
    if args.jobs > 1:  # recorded only when used, so the L = 64 json (one job) still merges
        settings["jobs"] = args.jobs
    out = Path(args.out)
    if args.merge and out.with_suffix(".json").exists():  # rerun methods replace their rows
        old = json.loads(out.with_suffix(".json").read_text())
        if old["settings"] != settings:
            raise SystemExit(f"--merge: settings differ from {out}.json: {old['settings']}")
        rows = {**{k: v for k, v in old["rows"].items() if k not in rows}, **rows}
        rows = {k: rows[k] for k in [*old["rows"], *[k for k in rows if k not in old["rows"]]]}
        train_minutes = {**old["train_minutes"], **train_minutes}
        info["reruns"] = [*old["machine"].get("reruns", []), args.methods]
    result = {"machine": info, "settings": settings, "train_minutes": train_minutes, "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    command = command_line(settings, args.jobs)
    write_markdown(result, out.with_suffix(".md"), command)
    plot(result, out.with_suffix(".png"), L)
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
