"""ELECTRA vs masked-LM pretraining at equal compute, then the same fine-tuning (Clark et al.
2020's compute-efficiency claim, tested small).

The same small BERT (and the same WordPiece vocabulary size, texts, split and masking) is
pretrained for the same wall-clock minutes with `attnlab train mlm` and with
`attnlab train electra` (the discriminator is the encoder that is kept; the generator's
forward and backward are part of ELECTRA's budget), one thread each, both at the same time so
that they share the machine's load alike (their CPU seconds are recorded).
Each encoder is then fine-tuned with `attnlab train classify --init RUN` for the same minutes,
beside the same architecture fine-tuned from random weights (``--from-scratch``); test accuracy
on the split the pretraining never read.

    python -m benchmarks.bert.electra_vs_mlm [--pretrain-minutes 3] [--finetune-minutes 2]
        -> docs/results/electra_vs_mlm.{json,md}
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common

ROOT = Path("/tmp/attnlab_electra_vs_mlm")
COMMON = ["--tensorboard", "false", "--precision", "fp32", "--num-threads", "1",
          "--schedule-by-time", "true"]  # fmt: skip
MODEL = ["--d-model", "128", "--n-layers", "2", "--n-heads", "4", "--d-ff", "512",
         "--vocab-size", "4000", "--max-len", "64", "--batch-size", "64",
         "--lr", "5e-4"]  # fmt: skip


def side_by_side(commands: list[list[str]]) -> list[float]:
    """Run attnlab commands at the same time (one thread each, so that they share the machine's
    load alike); -> wall seconds of each."""
    start = time.perf_counter()
    procs = [
        subprocess.Popen([sys.executable, "-m", "attnlab", *c], stdout=subprocess.DEVNULL)
        for c in commands
    ]
    walls = []
    for proc in procs:
        if proc.wait() != 0:
            raise SystemExit(f"failed: {proc.args}")
        walls.append(time.perf_counter() - start)
    return walls


def summary(run: Path) -> dict:
    path = run / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def last_eval(run: Path) -> dict:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if any(k.startswith("val_") for k in r)]
    return evals[-1] if evals else {}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrain-minutes", type=float, default=3.0)
    parser.add_argument("--finetune-minutes", type=float, default=2.0)
    parser.add_argument("--data", default="chinese_reviews")
    args = parser.parse_args(argv)
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    info = common.machine(threads=1)
    load_start = info["load_average_at_start"][0]
    budget = ["--max-minutes", str(args.pretrain_minutes)]
    objectives = ("mlm", "electra")
    walls = side_by_side(
        [["train", o, "--data", args.data, "--out", str(ROOT / o), *MODEL, *budget, *COMMON]
         for o in objectives]
    )  # fmt: skip
    rows = [
        {
            "pretraining": o,
            "pretrain_wall_s": wall,
            "pretrain_summary": summary(ROOT / o),
            "pretrain_last_eval": last_eval(ROOT / o),
        }
        for o, wall in zip(objectives, walls)
    ]
    rows.append({"pretraining": "none (from scratch)"})
    ft = ["--data", args.data, "--max-minutes", str(args.finetune_minutes), "--lr", "2e-4",
          "--batch-size", "32", "--truncate-len", "64", "--epochs", "3", *COMMON]  # fmt: skip
    commands = []
    for row, init in zip(rows, ("mlm", "electra", "mlm")):
        out = ROOT / f"ft_{row['pretraining'].split()[0]}"
        extra = ["--from-scratch", "true"] if row["pretraining"].startswith("none") else []
        commands.append(["train", "classify", "--init", str(ROOT / init), "--out", str(out),
                         *ft, *extra])  # fmt: skip
    walls = side_by_side(commands)
    for row, wall in zip(rows, walls):
        out = ROOT / f"ft_{row['pretraining'].split()[0]}"
        row["finetune_wall_s"] = wall
        results = json.loads((out / "results.json").read_text())
        row["test_accuracy"] = results["test"]["accuracy"]
        row["val_accuracy"] = results["val"]["accuracy"]
        row["finetune_summary"] = summary(out)
    meta = {
        **info,
        "load_average_at_end": common.load_average(),
        "model": MODEL,
        "pretrain_minutes": args.pretrain_minutes,
        "finetune_minutes": args.finetune_minutes,
        "data": args.data,
    }
    command = (
        f"python -m benchmarks.bert.electra_vs_mlm --pretrain-minutes {args.pretrain_minutes} "
        f"--finetune-minutes {args.finetune_minutes}"
    )
    out = Path("docs/results")
    (out / "electra_vs_mlm.json").write_text(
        json.dumps({"meta": meta, "command": command, "rows": rows}, indent=2) + "\n"
    )
    lines = [
        "# ELECTRA vs masked-LM pretraining at equal compute (`benchmarks/bert/electra_vs_mlm.py`)",
        "",
        f"`{command}`",
        "",
        f"Data {args.data} (pretraining reads the train split only); BERT {' '.join(MODEL)}; "
        f"{args.pretrain_minutes} min of pretraining each, then {args.finetune_minutes} min of "
        "fine-tuning (`classify --init`, lr 2e-4, batch 32, 64 tokens); fp32, one thread, "
        f"lr schedules run by the clock; {meta['logical_cores']} logical cores shared with other "
        "jobs "
        f"(load average {load_start:.1f} at start, {meta['load_average_at_end'][0]:.1f} at end).",
        "",
        "| pretraining | steps | CPU s | last validation (pretraining) | fine-tune steps "
        "| fine-tune CPU s | val acc | test acc |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ev = row.get("pretrain_last_eval", {})
        shown = ", ".join(f"{k} {v:.3f}" for k, v in ev.items() if k.startswith("val_"))
        pre, fin = row.get("pretrain_summary", {}), row["finetune_summary"]
        cpu = f"{pre['cpu_time_s']:.0f}" if pre else "-"
        lines.append(
            f"| {row['pretraining']} | {pre.get('steps', '-')} | {cpu} | {shown or '-'} | "
            f"{fin.get('steps', '-')} | {fin.get('cpu_time_s', 0):.0f} | "
            f"{row['val_accuracy']:.4f} | {row['test_accuracy']:.4f} |"
        )
    common.write_page((out / "electra_vs_mlm.md"), lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
