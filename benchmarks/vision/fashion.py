"""Fashion-MNIST: ViT vs a small ResNet with no / SE / ECA / CBAM / coordinate attention.

Each variant trains `attnlab train vision --arch vit|cnn` from its bundled preset
(``vision_vit.toml`` / ``vision_cnn.toml``) with the epochs and a
wall-time cap given here, on `--threads` intra-op threads (1 by default); the best checkpoint
by validation accuracy (6,000 images held out of the 60k training set) is scored on the 10k
test set. Results are written after every variant, so an interrupted sweep still leaves its
finished rows.

Run: python -m benchmarks.vision.fashion [--epochs N] [--minutes 15] [--only vit,cnn,...]
[--dataset mnist --name vision_mnist] [--threads 2] [--merge]  (--merge reruns some variants
and keeps the other rows)
(writes docs/results/vision_fashion.{md,json})
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from attnlab.data.io import atomic_write_text, write_json
from attnlab.runs import training
from benchmarks import common

VARIANTS = {
    "vit": ("vit", {}),
    "cnn": ("cnn", {"channel_attention": "none"}),
    "cnn+se": ("cnn", {"channel_attention": "se"}),
    "cnn+eca": ("cnn", {"channel_attention": "eca"}),
    "cnn+cbam": ("cnn", {"channel_attention": "cbam"}),
    "cnn+ca": ("cnn", {"channel_attention": "ca"}),
}
OUT = common.RESULTS


def run_variant(
    name: str, epochs: int | None, minutes: float, dataset: str, run_root: Path, threads: int = 1
) -> dict:
    """Train one variant into run_root/name; return its row."""
    arch, overrides = VARIANTS[name]
    overrides = {
        **overrides,
        "arch": arch,
        "dataset": dataset,
        "hflip": dataset != "mnist",  # digits are not mirror-symmetric
        "max_minutes": minutes,
        "schedule_by_time": True,  # the lr decays within the budget, whichever ends first
        "num_threads": threads,
        "tensorboard": False,
    }
    if epochs is not None:
        overrides["epochs"] = epochs
    cpu0 = time.process_time()
    results = training.train("vision", run_root / name, overrides)
    s = results["summary"]
    return {
        "variant": name,
        "test_acc": results["test"]["accuracy"],
        "test_macro_f1": results["test"]["macro_f1"],
        "best_val_acc": s["best_metric"],
        "params": results["n_params"],
        "train_wall_min": s["wall_time_s"] / 60,
        "process_cpu_min": (time.process_time() - cpu0) / 60,
        "steps": s["steps"],
        "epochs_done": s["epochs"],
        "stop_reason": s["stop_reason"],
        "precision": s["precision"],
        "images_per_s": results["images_per_s"],
        "load_avg_end": round(os.getloadavg()[0], 1),
    }


def machine_text(machine: dict | str) -> str:
    """The page's machine words (older result files kept a string)."""
    if isinstance(machine, str):
        return machine
    return f"{machine['cpu']}, {machine['logical_cores']} logical cores (shared)"


def render(meta: dict, rows: list[dict]) -> str:
    """The Markdown page."""
    lines = [
        f"# {meta['dataset']}: ViT vs ResNet + channel/spatial attention",
        "",
        f"Produced on {meta['date']} ({machine_text(meta['machine'])}); "
        f"torch {meta['torch']}. Settings: {meta['epochs'] or 'preset'} epoch(s) at most per "
        f"variant, cap {meta['minutes']} min of training wall time with the lr schedule run "
        "on the clock (`schedule_by_time`), presets `vision_vit.toml` / `vision_cnn.toml`.",
        "",
        "Each row says when it was measured, with how many threads and the load average at "
        "its start and end (above the thread count means other jobs shared the cores, so the "
        "run got fewer epochs into its budget; the process CPU minutes show how much it got).",
        "",
        "| variant | test acc | macro-F1 | params | train wall (min) | process CPU (min) "
        "| epochs | stop | precision | inference images/s | measured | threads | load start/end |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['test_acc']:.4f} | {r['test_macro_f1']:.4f} | "
            f"{r['params']:,} | {r['train_wall_min']:.1f} | {r['process_cpu_min']:.1f} | "
            f"{r['epochs_done']} | {r['stop_reason']} | {r['precision']} | "
            f"{r['images_per_s']:.0f} | {r['meta']['date']} | {r['meta'].get('threads', 1)} | "
            f"{r['meta']['load_start']}/{r.get('load_avg_end', '?')} |"
        )
    notes = dict.fromkeys(r["meta"]["note"] for r in rows if r["meta"].get("note"))
    lines += ["", *notes, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=None, help="default: the preset's")
    p.add_argument("--minutes", type=float, default=15.0, help="training wall-time cap each")
    p.add_argument("--only", default=",".join(VARIANTS), help="comma-separated variants")
    p.add_argument("--name", default="vision_fashion", help="output file stem")
    p.add_argument("--dataset", default="fashion-mnist", choices=("fashion-mnist", "mnist"))
    p.add_argument("--note", default="", help="a sentence for the page (e.g. machine load)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per run")
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the other variants' rows already in the results file (rerun some variants)",
    )
    args = p.parse_args(argv)
    info = common.machine(threads=common.set_threads(args.threads))
    meta = {
        "threads": args.threads,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": info,
        "torch": torch.__version__,
        "load_start": round(os.getloadavg()[0], 1),
        "epochs": args.epochs,
        "minutes": args.minutes,
        "dataset": args.dataset,
        "note": args.note,
    }
    rows: list[dict] = []
    names = args.only.split(",")
    json_path = OUT / f"{args.name}.json"
    if args.merge and json_path.exists():
        old = json.loads(json_path.read_text())
        rows = [r for r in old["rows"] if r["variant"] not in names]
        for r in rows:  # each kept row carries the settings it was measured under
            r.setdefault("meta", old["meta"])
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            meta["load_start"] = round(os.getloadavg()[0], 1)
            row = run_variant(
                name, args.epochs, args.minutes, args.dataset, Path(tmp), args.threads
            )
            rows.append(row | {"meta": dict(meta)})
            rows.sort(key=lambda r: list(VARIANTS).index(r["variant"]))
            write_json(json_path, {"meta": meta, "rows": rows})
            page = common.with_command(render(meta, rows), common.command_line())
            atomic_write_text(OUT / f"{args.name}.md", page)
            print(row, flush=True)


if __name__ == "__main__":
    main()
