"""The ViT against one of its successors, side by side at the same training budget: DeiT
(distillation token), Swin (shifted windows), MAE (pretraining, then fine-tuning) or DyT
(Dynamic Tanh for LayerNorm), on Fashion-MNIST or MNIST.

    python -m benchmarks.vision.pairs teacher [--minutes 30]     # DeiT's CNN+SE teacher, first
    python -m benchmarks.vision.pairs pair PAIR [--dataset mnist] [--minutes 15] [--seed 0]
    python -m benchmarks.vision.pairs report PAIR [--dataset mnist] [--seed 0]

PAIR is deit, swin, mae, dyt or dyt-alpha5. `pair` starts two processes at once, one thread
each, so both runs get the same wall-clock budget under the same load (each run's lr schedule
runs on the clock, `schedule_by_time`), both pinned to fp32 (precision auto's probe, swayed by
the load, could pick differently for the two):

- deit: the plain ViT (presets/vision_vit.toml) | the DeiT student (presets/vision_deit.toml: the
  same ViT
  plus a distillation token, DeiT's hard-label objective, Touvron et al. 2021 eq. 3, on the
  argmax of the teacher that `teacher` trained); the student pays for the teacher's forward pass
  in every step, inside its budget;
- swin: the plain ViT | Swin (presets/vision_swin.toml);
- dyt: the plain ViT | the same ViT with `norm = "dyt"` (Zhu et al. 2025, α0 = 0.5);
- dyt-alpha5: the plain ViT | DyT with every α starting at 5.0 instead of 0.5 (the conv stem's
  tokens enter the first block at std 0.11, so tanh(0.5 x) hands it inputs of std 0.055 where
  LayerNorm hands it 1.0; α0 = 5 won a 150-step sweep of 0.5 / 2.5 / 5 on validation accuracy,
  docs/results/norm_dyt_vit_alpha*.md);
- mae: a ViT of the MAE encoder's shape (plain 4x4 patch stem, fixed 2-D sin-cos positions,
  class token) trained from scratch for the whole budget | MAE pretraining (presets/mae.toml,
  He et al. 2022, labels unused) for `--pretrain-share` of the budget, then `train vision --init`
  fine-tuning it for the rest: the same total training time.

Each classifier's best checkpoint by validation accuracy (6,000 training images held out) is
scored on the 10k test images. Every run's row (test accuracy, steps, epochs, CPU minutes,
load before/after) lands in runs/vision_pairs/PAIR-DATASET[-sSEED]/NAME.json; `report` writes
docs/results/vision_PAIR[_mnist][_sSEED].{md,json} (seed 0 without the suffix). One seed per
call (both runs of a pair get it): the 10k test images alone give a sampling error of about
0.3 points of accuracy.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from attnlab.runs import training
from benchmarks import common

ROOT = Path("runs/vision_pairs")
RESULTS = Path("docs/results")
TEACHER = ROOT / "teacher"
FP32 = {"precision": "fp32"}
MAE_SHAPE_VIT = {"stem": "patch", "pos": "sincos2d", "pooling": "cls", **FP32}
VIT = {"arch": "vit", **FP32}
# pair -> {run name: [(task, overrides, share of the budget), ...]}; the first run is the baseline
PAIRS: dict[str, dict[str, list[tuple[str, dict, float]]]] = {
    "deit": {
        "vit": [("vision", VIT, 1.0)],
        "deit": [("vision", {"arch": "deit", "teacher": str(TEACHER), **FP32}, 1.0)],
    },
    "swin": {"vit": [("vision", VIT, 1.0)], "swin": [("vision", {"arch": "swin", **FP32}, 1.0)]},
    "dyt": {"vit": [("vision", VIT, 1.0)], "vit-dyt": [("vision", {"norm": "dyt", **VIT}, 1.0)]},
    "dyt-alpha5": {
        "vit": [("vision", VIT, 1.0)],
        "vit-dyt-a5": [("vision", {"norm": "dyt", "dyt_alpha0": 5.0, **VIT}, 1.0)],
    },
    "mae": {
        "vit-scratch": [("vision", {**MAE_SHAPE_VIT, **VIT}, 1.0)],
        "mae+finetune": [("mae", FP32, 0.5), ("vision", {"init": "{prev}", **VIT}, 0.5)],
    },
}
LABELS = {
    "vit": "ViT (presets/vision_vit.toml: conv stem, learned positions)",
    "deit": "DeiT student: ViT + distillation token, hard labels from the CNN+SE teacher",
    "swin": "Swin (presets/vision_swin.toml: 2x2 patches, 7x7 windows, shifted, patch merging)",
    "vit-dyt": "ViT with DyT in place of every LayerNorm",
    "vit-dyt-a5": "ViT with DyT in place of every LayerNorm, α0 = 5",
    "vit-scratch": "ViT of the MAE encoder's shape, from scratch",
    "mae+finetune": "MAE pretraining, then fine-tuned as that ViT",
}


def _folder(pair: str, dataset: str, seed: int) -> Path:
    return ROOT / (f"{pair}-{dataset}" + (f"-s{seed}" if seed else ""))


def train_stage(
    task: str, out: Path, overrides: dict, minutes: float, dataset: str, seed: int = 0
) -> dict:
    """One `training.train` call on one thread with a wall-time cap; its results and costs."""
    load_start = round(os.getloadavg()[0], 1)
    cpu0 = time.process_time()
    data = {"dataset": dataset, "hflip": dataset != "mnist"}  # digits are not mirror-symmetric
    results = training.train(
        task,
        out,
        {
            **data,
            **overrides,
            "max_minutes": minutes,
            "seed": seed,
            "schedule_by_time": True,
            "num_threads": 1,
            "tensorboard": False,
        },
    )
    s = results["summary"]
    return {
        "task": task,
        "out": str(out),
        "results": results,
        "steps": s["steps"],
        "epochs": s["epochs"],
        "train_wall_min": s["wall_time_s"] / 60,
        "process_cpu_min": (time.process_time() - cpu0) / 60,
        "stop_reason": s["stop_reason"],
        "precision": s["precision"],
        "load_start": load_start,
        "load_end": round(os.getloadavg()[0], 1),
    }


def train_run(pair: str, name: str, minutes: float, dataset: str, seed: int) -> None:
    """Train run `name` of `pair` (its stages in turn, one thread) and write its row."""
    info = common.machine(threads=common.set_threads(1))
    folder = _folder(pair, dataset, seed)
    stages, prev = [], ""
    for i, (task, overrides, share) in enumerate(PAIRS[pair][name]):
        out = folder / (name if i == len(PAIRS[pair][name]) - 1 else f"{name}-{task}")
        overrides = {
            k: v.format(prev=prev) if isinstance(v, str) else v for k, v in overrides.items()
        }
        stages.append(train_stage(task, out, overrides, minutes * share, dataset, seed))
        prev = str(out)
    last = stages[-1]["results"]
    row = {
        "run": name,
        "pair": pair,
        "dataset": dataset,
        "seed": seed,
        "budget_min": minutes,
        "stages": [
            {k: v for k, v in st.items() if k != "results"}
            | ({"test_loss": st["results"]["test_loss"]} if "test_loss" in st["results"] else {})
            for st in stages
        ],
        "test_acc": last["test"]["accuracy"],
        "test_macro_f1": last["test"]["macro_f1"],
        "best_val_acc": last["summary"]["best_metric"],
        "params": last["n_params"],
        "steps": sum(st["steps"] for st in stages),
        "train_wall_min": sum(st["train_wall_min"] for st in stages),
        "process_cpu_min": sum(st["process_cpu_min"] for st in stages),
        "precision": "/".join(sorted({st["precision"] for st in stages})),
        "load_start": stages[0]["load_start"],
        "load_end": stages[-1]["load_end"],
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": info,
    }
    (folder / f"{name}.json").write_text(json.dumps(row, indent=1) + "\n")
    print(row, flush=True)


def run_pair(pair: str, minutes: float, dataset: str, seed: int) -> None:
    if pair == "deit" and not (ROOT / "teacher.json").exists():
        raise SystemExit("train the teacher first: python -m benchmarks.vision.pairs teacher")
    _folder(pair, dataset, seed).mkdir(parents=True, exist_ok=True)
    args = ["--dataset", dataset, "--minutes", str(minutes), "--seed", str(seed)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.vision.pairs", "one", pair, "--run", name, *args]
        )
        for name in PAIRS[pair]
    ]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a run of the {pair} pair failed: exit codes {codes}")


def train_teacher(minutes: float, dataset: str) -> None:
    torch.set_num_threads(1)
    cnn_se = {"arch": "cnn", "channel_attention": "se"}
    stage = train_stage("vision", TEACHER, cnn_se, minutes, dataset)
    row = {k: v for k, v in stage.items() if k != "results"}
    row["test_acc"] = stage["results"]["test"]["accuracy"]
    (ROOT / "teacher.json").write_text(json.dumps(row, indent=1) + "\n")


def report(pair: str, dataset: str, seed: int) -> None:
    folder = _folder(pair, dataset, seed)
    rows = {n: json.loads((folder / f"{n}.json").read_text()) for n in PAIRS[pair]}
    minutes = rows[next(iter(PAIRS[pair]))]["budget_min"]
    suffix = ("_mnist" if dataset == "mnist" else "") + (f"_s{seed}" if seed else "")
    stem = RESULTS / f"vision_{pair}{suffix}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    flag = (" --dataset mnist" if dataset == "mnist" else "") + (f" --seed {seed}" if seed else "")
    command = (
        f"python -m benchmarks.vision.pairs pair {pair}{flag} --minutes {minutes:g}; "
        f"python -m benchmarks.vision.pairs report {pair}{flag}"
    )
    lines = [
        f"# {pair}: the ViT and its successor side by side, {dataset}",
        "",
        f"Produced by `python -m benchmarks.vision.pairs pair {pair}{flag} --minutes {minutes:g}; "
        f"python -m benchmarks.vision.pairs report {pair}{flag}` (see its docstring): both runs "
        f"started together, one thread each, fp32, {minutes:g} minutes of training each (all "
        "stages together) with the lr schedule on the clock. Test accuracy of each classifier's "
        f"best checkpoint by validation accuracy, seed {seed}.",
        "",
        "| run | test acc | macro-F1 | best val acc | parameters | steps | train wall min | "
        "process CPU min | load start/end | measured |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {LABELS[name]} | {r['test_acc']:.4f} | {r['test_macro_f1']:.4f} | "
            f"{r['best_val_acc']:.4f} | {r['params']:,} | {r['steps']} | "
            f"{r['train_wall_min']:.1f} | {r['process_cpu_min']:.1f} | "
            f"{r['load_start']}/{r['load_end']} | {r['date']} |"
        )
    lines += ["", "Stages:", ""]
    for name, r in rows.items():
        for st in r["stages"]:
            extra = f", test reconstruction loss {st['test_loss']:.4f}" if "test_loss" in st else ""
            lines.append(
                f"- {name}: `{st['task']}` into {st['out']}, {st['steps']} steps, "
                f"{st['epochs']} epochs, {st['train_wall_min']:.1f} min, stopped by "
                f"{st['stop_reason']}{extra}"
            )
    base, other = rows.values()
    gap = other["test_acc"] - base["test_acc"]
    lines += [
        "",
        f"{LABELS[other['run']]} minus {LABELS[base['run']]}: {gap * 100:+.2f} points of test "
        "accuracy (one seed; about 0.3 points of sampling error per accuracy).",
        "",
    ]
    common.write_page(stem.with_suffix(".md"), lines, command)
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=("teacher", "pair", "one", "report"))
    p.add_argument("pair", nargs="?", choices=sorted(PAIRS))
    p.add_argument("--dataset", default="fashion-mnist", choices=("fashion-mnist", "mnist"))
    p.add_argument("--minutes", type=float, default=15.0, help="training wall time per run")
    p.add_argument("--run", help="for `one`: which run of the pair")
    p.add_argument("--seed", type=int, default=0, help="the training seed of both runs")
    args = p.parse_args(argv)
    if args.stage != "teacher" and args.pair is None:
        p.error(f"{args.stage} needs a pair: one of {', '.join(sorted(PAIRS))}")
    ROOT.mkdir(parents=True, exist_ok=True)
    if args.stage == "teacher":
        train_teacher(args.minutes, args.dataset)
    elif args.stage == "one":
        train_run(args.pair, args.run, args.minutes, args.dataset, args.seed)
    elif args.stage == "pair":
        run_pair(args.pair, args.minutes, args.dataset, args.seed)
    else:
        report(args.pair, args.dataset, args.seed)


if __name__ == "__main__":
    main()
