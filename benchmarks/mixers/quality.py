"""Dense GPT vs MoE vs Mamba vs hybrid vs RWKV on Shakespeare characters at equal wall clock.

    python -m benchmarks.mixers.quality [--minutes 5] [--seeds 0 1 2] [--eval-windows 200]

Every run is `python3 -m attnlab train lm --config baby ...` (the default Shakespeare corpus and
split, character tokenizer), so each one can be rerun by hand from the command recorded in the
results. All variants get the same data order (the seed), the same budget (--max-minutes, with
the lr schedule advanced by time so each run finishes its warmup and cosine decay), one torch
thread, fp32, and one evaluation at the end on the same evenly spaced validation windows
(eval_windows; 0 = every window of the split). The variants:

- dense:  the baby preset (4 layers, width 128, attention + GELU MLP);
- moe:    the same, each MLP replaced by 8 experts of the same shape, top-2 routing;
- mamba:  every attention replaced by a Mamba block; width 112 (not 128) so the parameter
          count is within a few percent of dense at the same depth;
- hybrid: Mamba in layers 1 and 3, attention in layers 2 and 4 (attn_every 2), width 120
          for the same reason;
- rwkv:   every layer RWKV-4 (time-mix, and channel-mix as its feed-forward), width 120
          (parameters within 5% of dense).

Runs go two at a time (the machine has 2 cores shared with other jobs), grouped (PAIRS) so that
each variant meets different partners over the seeds; with five variants one run per seed goes
alone. Per run it records
os.getloadavg() before and after, the child's CPU time (os.wait4), the engine's train wall time,
steps, training tokens/s, parameters (total and, for MoE, active), the validation loss and the
train loss at the step count every run reached. Writes docs/results/lm_mixers.{json,md} and
the curves of the seed-0 MoE run with its expert-usage panels (lm_mixers_moe-s0_curves.png).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from attnlab.infer.lm import LMRun
from attnlab.models.gpt import GPT
from attnlab.train.curves import plot_curves
from attnlab.train.metrics_log import read_metrics
from benchmarks import common

RESULTS = Path("docs/results")
VARIANTS: dict[str, list[str]] = {
    "dense": [],
    "moe": ["--ffn", "moe", "--experts", "8", "--top-k", "2"],
    "mamba": ["--mixer", "mamba", "--d-model", "112"],
    "hybrid": ["--mixer", "hybrid", "--attn-every", "2", "--d-model", "120"],
    "rwkv": ["--mixer", "rwkv", "--d-model", "120"],
}
# the variants run side by side, per seed (each group starts together): every variant meets
# different partners over the seeds, and runs alone once in three seeds (five variants)
PAIRS: dict[int, list[tuple[str, ...]]] = {
    0: [("dense", "moe"), ("mamba", "hybrid"), ("rwkv",)],
    1: [("dense", "mamba"), ("moe", "rwkv"), ("hybrid",)],
    2: [("dense", "rwkv"), ("moe", "hybrid"), ("mamba",)],
}


def command(variant: str, seed: int, minutes: float, eval_windows: int, out: Path) -> list[str]:
    """The CLI call of one run."""
    return [
        sys.executable, "-m", "attnlab", "train", "lm", "--config", "baby",
        *VARIANTS[variant],
        "--seed", str(seed),
        "--max-minutes", str(minutes),
        "--schedule-by-time", "true",
        "--eval-every", "1000000",  # one evaluation, when the clock stops
        "--checkpoint-every", "0",
        "--eval-windows", str(eval_windows),
        "--num-threads", "1",
        "--precision", "fp32",
        "--sample-tokens", "0",
        "--tensorboard", "false",
        "--out", str(out),
    ]  # fmt: skip


def run_pair(jobs: list[tuple[str, int, list[str], Path]]) -> list[dict]:
    """Start the commands together, wait for both; load average and CPU time of each."""
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    procs = []
    for variant, seed, cmd, out in jobs:
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        log = open(out.parent / f"{out.name}.log", "w")  # noqa: SIM115 - closed below
        procs.append((variant, seed, cmd, out, subprocess.Popen(cmd, stdout=log, stderr=log), log))
    rows = []
    pending = {p.pid: item for item in procs for p in [item[4]]}
    while pending:
        pid, status, usage = os.wait4(-1, 0)
        if pid not in pending:
            continue
        variant, seed, cmd, out, proc, log = pending.pop(pid)
        log.close()
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise RuntimeError(f"{variant} seed {seed} failed; see {out.parent}/{out.name}.log")
        rows.append(
            {
                "variant": variant,
                "seed": seed,
                "command": " ".join(["python3", *cmd[1:]]),
                "process_wall_s": time.perf_counter() - t0,
                "process_cpu_s": usage.ru_utime + usage.ru_stime,
                "load_average_start": load_start,
                "load_average_end": os.getloadavg(),
                "partner": next((j[0] for j in jobs if j[0] != variant or j[1] != seed), "—"),
                "run_dir": str(out),
            }
        )
    return rows


def measure(row: dict) -> dict:
    """Add the run's own numbers (summary, config, metrics) to the row of run_pair."""
    run_dir = Path(row["run_dir"])
    summary = json.loads((run_dir / "summary.json").read_text())
    config = json.loads((run_dir / "config.json").read_text())
    model: GPT = LMRun.load(run_dir).model
    m, t = config["model"], config["train"]
    train_s = summary["wall_time_s"] - summary["eval_time_s"]
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in records if r.get("split") == "train" and "loss" in r]
    usage_keys = sorted(k for k in (train[-1] if train else {}) if k.startswith("moe"))
    row.update(
        {
            "d_model": m["d_model"],
            "n_layers": m["n_layers"],
            "layer_mixers": model.cfg.layer_mixers(),
            "params_total": model.num_params(),
            "params_active": model.active_params(),
            "steps": summary["steps"],
            "stop_reason": summary["stop_reason"],
            "train_wall_s": train_s,
            "eval_wall_s": summary["eval_time_s"],
            "engine_cpu_s": summary["cpu_time_s"],
            "eval_cpu_s": summary["eval_cpu_s"],
            "tokens_per_s": summary["steps"] * t["batch_size"] * m["context"] / train_s,
            "val_loss": summary["best_metric"],
            "eval_windows": config["data"]["eval_windows"],
            # the language-model part of the train loss (a MoE run's "loss" adds aux_loss)
            "train_curve": [(r["step"], r.get("lm_loss", r["loss"])) for r in train],
            "expert_usage_last": {k: train[-1][k] for k in usage_keys},
            "expert_usage_logged": bool(usage_keys),
        }
    )
    return row


def loss_near(curve: list[tuple[int, float]], step: int) -> float | None:
    """The logged train loss at the last log point at or before ``step`` (None: none logged)."""
    losses = [loss for s, loss in curve if s <= step]
    return losses[-1] if losses else None


def _mean_or_none(values: list[float | None]) -> float | None:
    return None if None in values else statistics.fmean(values)  # type: ignore[arg-type]


def summarise(rows: list[dict]) -> dict:
    """Per variant: mean and seed spread of val loss and speed; differences to dense."""
    common_step = min(r["steps"] for r in rows)
    for r in rows:
        r["train_loss_at_common_step"] = loss_near(r["train_curve"], common_step)
    out: dict = {"common_step": common_step, "variants": {}}
    for variant in VARIANTS:
        mine = [r for r in rows if r["variant"] == variant]
        vals = [r["val_loss"] for r in mine]
        out["variants"][variant] = {
            "val_loss_mean": statistics.fmean(vals),
            "val_loss_seed_spread": max(vals) - min(vals),
            "tokens_per_s_mean": statistics.fmean(r["tokens_per_s"] for r in mine),
            "tokens_per_cpu_s_mean": statistics.fmean(tokens_per_cpu_s(r) for r in mine),
            "steps_mean": statistics.fmean(r["steps"] for r in mine),
            "train_loss_at_common_step_mean": _mean_or_none(
                [r["train_loss_at_common_step"] for r in mine]
            ),
        }
    dense = out["variants"]["dense"]["val_loss_mean"]
    dense_by_seed = {r["seed"]: r["val_loss"] for r in rows if r["variant"] == "dense"}
    for name, v in out["variants"].items():
        v["val_loss_minus_dense"] = v["val_loss_mean"] - dense
        v["val_loss_minus_dense_per_seed"] = {
            r["seed"]: r["val_loss"] - dense_by_seed[r["seed"]]
            for r in rows
            if r["variant"] == name and r["seed"] in dense_by_seed
        }
    out["winner"] = min(out["variants"], key=lambda k: out["variants"][k]["val_loss_mean"])
    return out


def tokens_per_cpu_s(r: dict) -> float:
    """Training tokens per CPU second of the training loop (the engine's CPU time less its
    evaluation's): the speed with the machine's load taken out, where tokens per wall-clock
    second measure the load too."""
    return r["tokens_per_s"] * r["train_wall_s"] / (r["engine_cpu_s"] - r["eval_cpu_s"])


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def write_markdown(res: dict, path: Path) -> None:
    m, s = common.upgrade_machine(res["machine"]), res["summary"]
    lines = [
        "# Mixers at equal wall clock, Shakespeare characters (`benchmarks/mixers/quality.py`)",
        "",
        f"Each run: `attnlab train lm --config baby` plus the variant's flags, "
        f"{res['minutes']} minutes of training (lr schedule advanced by time), one thread, fp32, "
        f"the default Shakespeare split, seeds {res['seeds']}. Validation loss (nats/char) of "
        f"the model at the end, on the same {res['eval_windows']} evenly spaced validation "
        f"windows of 64 characters for every run. Two runs at a time on {m['cpu']} "
        f"({m['logical_cores']} logical cores, shared with other agents' jobs); load average "
        f"(1 min) per run below.",
        "",
        "| variant | seed | layers | width | params total | params active | steps | "
        "train tok/s | tok per CPU s | val loss | train loss @ step "
        f"{s['common_step']} | CPU s | load start→end | ran beside |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(res["runs"], key=lambda r: (list(VARIANTS).index(r["variant"]), r["seed"])):
        letter = {"attention": "A", "mamba": "M", "rwkv": "R"}
        mixers = "".join(letter[k] for k in r["layer_mixers"])
        lines.append(
            f"| {r['variant']} | {r['seed']} | {mixers} | {r['d_model']} | "
            f"{r['params_total']:,} | {r['params_active']:,} | {r['steps']} | "
            f"{r['tokens_per_s']:.0f} | {tokens_per_cpu_s(r):.0f} | {r['val_loss']:.4f} | "
            f"{_fmt(r['train_loss_at_common_step'])} | {r['process_cpu_s']:.0f} | "
            f"{r['load_average_start'][0]:.1f}→{r['load_average_end'][0]:.1f} | "
            f"{r['partner']} |"
        )
    lines += [
        "",
        "Layers: A = attention, M = Mamba, R = RWKV, each followed by its feed-forward (MLP, "
        "MoE, or RWKV's channel-mix). "
        "CPU s: the whole process (start-up, data preparation, training, evaluation).",
        "",
        "| variant | mean val loss | seed spread (max − min) | − dense (mean) | − dense "
        "(per seed) | mean tok/s | mean tok per CPU s | mean steps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, v in s["variants"].items():
        per_seed = ", ".join(
            f"s{seed}: {d:+.4f}" for seed, d in v["val_loss_minus_dense_per_seed"].items()
        )
        lines.append(
            f"| {name} | {v['val_loss_mean']:.4f} | {v['val_loss_seed_spread']:.4f} | "
            f"{v['val_loss_minus_dense']:+.4f} | {per_seed} | {v['tokens_per_s_mean']:.0f} | "
            f"{v['tokens_per_cpu_s_mean']:.0f} | {v['steps_mean']:.0f} |"
        )
    lines += [
        "",
        f"Lowest mean validation loss: **{s['winner']}**. The seed spread holds the seed and "
        "the machine's load together: a run of a busier moment takes fewer steps in the same "
        "minutes.",
        "",
        "Expert usage of the MoE runs (from their metrics.jsonl, the last train log: each "
        "expert's share of the top-k assignments, 1/8 = 0.125 when balanced):",
        "",
    ]
    for r in res["runs"]:
        if r["expert_usage_logged"]:
            u = r["expert_usage_last"]
            layers = sorted({int(k[3:].split("_")[0]) for k in u})
            spans = "; ".join(
                f"layer {i}: {min(x):.3f}–{max(x):.3f}"
                for i in layers
                for x in [[v for k, v in u.items() if k.startswith(f"moe{i}_e")]]
            )
            lines.append(f"- {r['variant']} seed {r['seed']}: {spans}")
    lines.append("")
    common.write_page(path, lines, common.recorded_command(res, path))


def plot_moe_usage(runs: Path, name: str) -> Path:
    """The curves of the first MoE run, with its expert-usage panels, beside the results."""
    moe = sorted(runs.glob("moe-s*/metrics.jsonl"))[0]
    return plot_curves(moe, RESULTS / f"{name}_{moe.parent.name}_curves.png")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], choices=sorted(PAIRS))
    parser.add_argument("--eval-windows", type=int, default=200)
    parser.add_argument("--runs", type=Path, default=Path("runs/lm-mixers"))
    parser.add_argument("--name", default="lm_mixers", help="results file stem")
    parser.add_argument(
        "--reuse", action="store_true", help="keep the finished pairs recorded in --runs/rows.json"
    )
    parser.add_argument(
        "--render", action="store_true", help="only rewrite the .md and plot from the .json"
    )
    args = parser.parse_args(argv)
    if args.render:
        res = json.loads((RESULTS / f"{args.name}.json").read_text())
        for r in res["runs"]:  # rows written before eval_cpu_s was recorded
            if "eval_cpu_s" not in r:
                summary = json.loads((Path(r["run_dir"]) / "summary.json").read_text())
                r["eval_cpu_s"] = summary["eval_cpu_s"]
        res["summary"] = summarise(res["runs"])
        (RESULTS / f"{args.name}.json").write_text(json.dumps(res, indent=2) + "\n")
        write_markdown(res, RESULTS / f"{args.name}.md")
        plot_moe_usage(args.runs, args.name)
        print((RESULTS / f"{args.name}.md").read_text())
        return
    info = common.machine(threads=1, runs_at_once=2)
    rows_path = args.runs / "rows.json"
    rows = json.loads(rows_path.read_text()) if args.reuse and rows_path.exists() else []
    done = {(r["variant"], r["seed"]) for r in rows}
    for seed in args.seeds:
        for group in PAIRS[seed]:
            if {(v, seed) for v in group} <= done:
                continue
            jobs = [
                (v, seed, command(v, seed, args.minutes, args.eval_windows, out), out)
                for v in group
                for out in [args.runs / f"{v}-s{seed}"]
            ]
            print(f"seed {seed}: {' beside '.join(group)} ...", flush=True)
            rows += [measure(r) for r in run_pair(jobs)]
            rows_path.write_text(json.dumps(rows, indent=1) + "\n")  # survives a later failure
    res = {
        "command": common.command_line(),
        "machine": info,
        "minutes": args.minutes,
        "seeds": args.seeds,
        "eval_windows": args.eval_windows,
        "pairs": {str(k): v for k, v in PAIRS.items() if k in args.seeds},
        "runs": rows,
    }
    res["summary"] = summarise(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(res, indent=2) + "\n")
    write_markdown(res, RESULTS / f"{args.name}.md")
    plot_moe_usage(args.runs, args.name)
    print((RESULTS / f"{args.name}.md").read_text())


if __name__ == "__main__":
    main()
