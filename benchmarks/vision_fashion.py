"""Fashion-MNIST: ViT vs a small ResNet with no / SE / ECA / CBAM / coordinate attention.

Each variant trains from its bundled preset (``vit.toml`` / ``cnn.toml``) with the epochs and a
wall-time cap given here, on one intra-op thread; the best checkpoint by validation accuracy
(5,400 images held out of the 60k training set) is scored on the 10k test set. Results are
written after every variant, so an interrupted sweep still leaves its finished rows.

Run: python benchmarks/vision_fashion.py [--epochs N] [--minutes 15] [--only vit,cnn,...]
[--dataset mnist --name vision_mnist]
(writes docs/results/vision_fashion.{md,json})
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from attnlab.data.io import atomic_write_text, write_json
from attnlab.tasks import vision

VARIANTS = {
    "vit": ("vit", {}),
    "cnn": ("cnn", {"attention": "none"}),
    "cnn+se": ("cnn", {"attention": "se"}),
    "cnn+eca": ("cnn", {"attention": "eca"}),
    "cnn+cbam": ("cnn", {"attention": "cbam"}),
    "cnn+ca": ("cnn", {"attention": "ca"}),
}
OUT = Path(__file__).resolve().parent.parent / "docs" / "results"


def run_variant(
    name: str, epochs: int | None, minutes: float, dataset: str, run_root: Path
) -> dict:
    """Train one variant into run_root/name; return its row."""
    arch, overrides = VARIANTS[name]
    overrides = {
        **overrides,
        "dataset": dataset,
        "hflip": dataset != "mnist",  # digits are not mirror-symmetric
        "max_minutes": minutes,
        "schedule_by_time": True,  # the lr decays within the budget, whichever ends first
        "num_threads": 1,
        "tensorboard": False,
    }
    if epochs is not None:
        overrides["epochs"] = epochs
    cpu0 = time.process_time()
    results = vision.train(arch, run_root / name, overrides)
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


def render(meta: dict, rows: list[dict]) -> str:
    """The Markdown page."""
    lines = [
        f"# {meta['dataset']}: ViT vs ResNet + channel/spatial attention",
        "",
        f"Produced by `benchmarks/vision_fashion.py` on {meta['date']} ({meta['machine']}); "
        f"torch {meta['torch']}, one intra-op thread, load average at start "
        f"{meta['load_start']}. Settings: {meta['epochs'] or 'preset'} epoch(s) at most per "
        f"variant, cap {meta['minutes']} min of training wall time with the lr schedule run "
        "on the clock (`schedule_by_time`), presets `vit.toml` / `cnn.toml`.",
        "",
        "| variant | test acc | macro-F1 | params | train wall (min) | epochs | stop "
        "| precision | inference images/s | load avg at end |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['test_acc']:.4f} | {r['test_macro_f1']:.4f} | "
            f"{r['params']:,} | {r['train_wall_min']:.1f} | {r['epochs_done']} | "
            f"{r['stop_reason']} | {r['precision']} | {r['images_per_s']:.0f} | "
            f"{r.get('load_avg_end', '')} |"
        )
    lines += ["", meta["note"], ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=None, help="default: the preset's")
    p.add_argument("--minutes", type=float, default=15.0, help="training wall-time cap each")
    p.add_argument("--only", default=",".join(VARIANTS), help="comma-separated variants")
    p.add_argument("--name", default="vision_fashion", help="output file stem")
    p.add_argument("--dataset", default="fashion-mnist", choices=("fashion-mnist", "mnist"))
    p.add_argument("--note", default="", help="a sentence for the page (e.g. machine load)")
    args = p.parse_args()
    torch.set_num_threads(1)
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)",
        "torch": torch.__version__,
        "load_start": round(os.getloadavg()[0], 1),
        "epochs": args.epochs,
        "minutes": args.minutes,
        "dataset": args.dataset,
        "note": args.note,
    }
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            rows.append(run_variant(name, args.epochs, args.minutes, args.dataset, Path(tmp)))
            write_json(OUT / f"{args.name}.json", {"meta": meta, "rows": rows})
            atomic_write_text(OUT / f"{args.name}.md", render(meta, rows))
            print(rows[-1], flush=True)


if __name__ == "__main__":
    main()
