"""ViT on Fashion-MNIST: convolutional stem vs patch embedding at an equal wall-time budget.

Both arms use the bundled `vit.toml` preset, differing only in `stem`; each trains for the same
minutes (lr schedule on the clock) on one thread, and the best checkpoint by validation accuracy
is scored on the test set. Run: python -m benchmarks.vision.vit_stem [--minutes 4]
(writes docs/results/vit_stem.{md,json})
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import tempfile
from pathlib import Path

import torch

from attnlab.data.io import atomic_write_text, write_json
from attnlab.tasks import runner
from benchmarks import common

OUT = common.RESULTS


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=4.0)
    args = p.parse_args(argv)
    info = common.machine(threads=common.set_threads(1))
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": info,
        "torch": torch.__version__,
        "minutes": args.minutes,
    }
    rows = []
    for stem in ("conv", "patch"):
        load = round(os.getloadavg()[0], 1)
        with tempfile.TemporaryDirectory() as tmp:
            over = {"stem": stem, "max_minutes": args.minutes, "schedule_by_time": True}
            over |= {"num_threads": 1, "tensorboard": False}
            r = runner.train("vit", Path(tmp) / stem, over)
        s = r["summary"]
        rows.append(
            {
                "stem": stem,
                "test_acc": r["test"]["accuracy"],
                "best_val_acc": s["best_metric"],
                "params": r["n_params"],
                "steps": s["steps"],
                "load_start": load,
                "load_end": round(os.getloadavg()[0], 1),
            }
        )
        print(rows[-1], flush=True)
    write_json(OUT / "vit_stem.json", {"meta": meta, "rows": rows})
    lines = [
        "# ViT stem: convolutions vs patch projection at an equal budget (Fashion-MNIST)",
        "",
        f"Produced on {meta['date']} "
        f"({info['cpu']}, {info['logical_cores']} logical cores (shared), torch {meta['torch']}, "
        "one thread): the `vit.toml` preset with "
        f"`stem` = conv or patch, {args.minutes} minutes of training each (lr schedule on the "
        "clock), best validation checkpoint scored on the 10k test images.",
        "",
        "| stem | test acc | best val acc | params | optimizer steps | load start/end |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['stem']} | {r['test_acc']:.4f} | {r['best_val_acc']:.4f} | {r['params']:,} "
            f"| {r['steps']} | {r['load_start']}/{r['load_end']} |"
        )
    atomic_write_text(OUT / "vit_stem.md", common.with_command(lines, common.command_line()))


if __name__ == "__main__":
    main()
