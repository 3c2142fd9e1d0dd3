"""How many pieces predict should read: trained classifier runs evaluated at the length they trained
at, twice it, and the encoder's whole window — the measurement behind ``read_len = max_len``
(src/attnlab/tasks/classify_steps.py).

    python -m benchmarks.classify.read_length RUN [RUN ...] -> docs/results/read_length.{json,md}

Each run's own test split (its ``--test-data`` file where it had one), through the run's float32
model exactly as ``evaluate`` reads it, with only the reader's length changed; for a run on the
bundled reviews the out-of-domain sets too. Training never reads the predict length (validation
and the checkpoint choice read the training length), so a run trained before the rule is the
same model a run after it trains: only what predict reads differs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import (
    RESULTS,
    command_line,
    load_average,
    machine,
    machine_line,
    write_page,
)

STEM = "read_length"
WINDOW = 512  # e5's whole window


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="trained e5 classifier run folders")
    args = p.parse_args(argv)

    import torch

    from attnlab.infer.classifier import ClassifierRun, evaluate_ood

    torch.set_num_threads(1)
    info = machine(threads=1)
    rows = []
    for folder in args.runs:
        run = ClassifierRun.load(folder)
        trained = run.train_len
        row: dict = {"run": Path(folder).name, "trained_at": trained, "lengths": {}}
        for length in sorted({trained, min(2 * trained, WINDOW), WINDOW}):
            run.reader.max_len = length
            test = run.evaluate()
            scores = {"test_accuracy": test["accuracy"], "test_macro_f1": test["macro_f1"]}
            if run.config.data.data == "chinese_reviews":  # the OOD sets are its domain's
                ood = evaluate_ood(run.model, run.reader, run.labels, 32, "cpu") or {}
                scores |= {f"ood_{k}_accuracy": v["accuracy"] for k, v in ood.items()}
            row["lengths"][str(length)] = scores
            row["source"] = test["source"]  # the same split at every length
        rows.append(row)
        print(json.dumps(row, ensure_ascii=False), flush=True)
    info["load_average_at_end"] = load_average()
    out = {"command": command_line(argv), "machine": info, "runs": rows}
    (RESULTS / f"{STEM}.json").write_text(json.dumps(out, indent=1, ensure_ascii=False), "utf-8")
    write_page(RESULTS / f"{STEM}.md", page(out), out["command"])


def page(out: dict) -> list[str]:
    lines = [
        "# How many pieces predict reads: the length training read, twice it, or the window",
        "",
        machine_line(out["machine"]),
        "",
        "Each run's test accuracy (float32, its own test split) with predict reading the length "
        "the run trained at, twice that, and e5's whole window (512). The runs were trained "
        "before predict's length followed training's (their data_report.json says 512); the "
        "length predict reads does not enter training, so these are the models a run trains "
        "now. Runs named `<dataset>_s<seed>` are the own-data benchmark's "
        "([own_data.md](own_data.md)); `main_s0` is the main job (the README's command, seed 0).",
        "",
        "| run | trained at | at that length | twice it | 512 | best |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in out["runs"]:
        t = row["trained_at"]
        acc = {int(k): v["test_accuracy"] for k, v in row["lengths"].items()}
        cells = [acc.get(t), acc.get(min(2 * t, WINDOW)), acc.get(WINDOW)]
        best = max(acc.values())
        winners = ", ".join(str(k) for k, v in sorted(acc.items()) if v == best)
        shown = " | ".join("-" if c is None else f"{c:.3f}" for c in cells)
        lines.append(f"| {row['run']} | {t} | {shown} | {winners} |")
    ood = [r for r in out["runs"] if any("ood_" in k for v in r["lengths"].values() for k in v)]
    if ood:
        lines += ["", "Out-of-domain accuracy of the runs on the bundled reviews:", "",
                  "| run | length | OOD dev | OOD test |", "|---|---:|---:|---:|"]  # fmt: skip
        for row in ood:
            for length, v in row["lengths"].items():
                lines.append(f"| {row['run']} | {length} | {v.get('ood_dev_accuracy', 0):.4f} | "
                             f"{v.get('ood_test_accuracy', 0):.4f} |")  # fmt: skip
    return lines


if __name__ == "__main__":
    main()
