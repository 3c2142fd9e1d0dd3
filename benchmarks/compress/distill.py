"""Knowledge distillation table: teacher, student from scratch, distilled student.

The two students have the same small architecture and the same training budget: the same
number of optimizer steps on the same batches (a wall-clock budget is unfair on a machine
whose load changes under the runs); the distilled one learns from the teacher run's soft
labels as well (`attnlab train distill`; the teacher's one pass over the training texts is
its extra cost, in its CPU seconds).
All three are then scored on the test split and their forward pass timed on the same 256 test
texts (fp32, one thread, side by side in this process).

    python -m benchmarks.compress.distill --teacher RUN [--steps 600] [--temperature 2]
        [--alpha 0.5]
        -> docs/results/distill.{json,md}
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.compress.prune_heads import latency_ms, test_batches, timing_batch

ROOT = Path("/tmp/attnlab_distill")
STUDENT = ["--d-model", "64", "--n-heads", "2", "--n-layers", "1",
           "--d-ff", "256", "--ngram-buckets", "0"]  # fmt: skip
COMMON = ["--tensorboard", "false", "--precision", "fp32", "--num-threads", "1"]


def score(run_dir: Path, rounds: int) -> dict:
    from attnlab.commands.prune import accuracy, count_parameters
    from attnlab.runs.load import load_run

    run = load_run(run_dir)
    model = run.model.float().eval()
    test = test_batches(run)
    summary = run_dir / "summary.json"
    return {
        "run": str(run_dir),
        "test": accuracy(model, test),
        "parameters": count_parameters(model)["total"],
        "latency_ms": latency_ms(model, timing_batch(test), rounds),
        "summary": json.loads(summary.read_text()) if summary.exists() else {},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", required=True)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--temperature", type=float, default=2.0)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    info = common.machine(threads=1)
    load_start = info["load_average_at_start"][0]
    budget = ["--max-steps", str(args.steps)]
    soft = ["--teacher", args.teacher, "--temperature", str(args.temperature),
            "--alpha", str(args.alpha)]  # fmt: skip
    commands = {
        # --init none: the character model (train classify fine-tunes e5 by default)
        "scratch": ["train", "classify", "--init", "none", "--out", str(ROOT / "scratch")],
        "distilled": ["train", "distill", "--out", str(ROOT / "distilled"), *soft],
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "attnlab", *c, *STUDENT, *budget, *COMMON],
            stdout=subprocess.DEVNULL,
        )
        for c in commands.values()
    ]
    for proc in procs:
        if proc.wait() != 0:
            raise SystemExit(f"failed: {proc.args}")
    torch.set_num_threads(1)
    rows = {
        "teacher": score(Path(args.teacher), args.rounds),
        "student from scratch": score(ROOT / "scratch", args.rounds),
        "distilled student": score(ROOT / "distilled", args.rounds),
    }
    meta = {
        **info,
        "load_average_at_end": common.load_average(),
        "student": STUDENT,
        "steps": args.steps,
        "temperature": args.temperature,
        "alpha": args.alpha,
    }
    command = (
        f"python -m benchmarks.compress.distill --teacher {args.teacher} --steps {args.steps} "
        f"--temperature {args.temperature} --alpha {args.alpha}"
    )
    out = Path("docs/results")
    (out / "distill.json").write_text(
        json.dumps({"meta": meta, "command": command, "rows": rows}, indent=2) + "\n"
    )
    base = rows["teacher"]["latency_ms"]
    lines = [
        "# Knowledge distillation: teacher, student from scratch, distilled student "
        "(`benchmarks/compress/distill.py`)",
        "",
        f"`{command}`",
        "",
        f"Students: `{' '.join(STUDENT)}`, {args.steps} steps of batch 64 each (trained at the "
        f"same time, fp32, one thread), T = {args.temperature}, "
        f"α = {args.alpha}. Test split of the bundled Chinese reviews. Latency: median of "
        f"{args.rounds} forward passes over the same 256 test texts, one thread; "
        f"{meta['logical_cores']} "
        f"logical CPUs shared with other jobs (load average {load_start:.1f} at start, "
        f"{meta['load_average_at_end'][0]:.1f} at end).",
        "",
        "| model | test acc | parameters | latency ms | speed vs teacher | train steps "
        "| train CPU s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        s = r["summary"]
        lines.append(
            f"| {name} | {r['test']['accuracy']:.4f} | {r['parameters']:,} | "
            f"{r['latency_ms']:.1f} | {base / r['latency_ms']:.2f}x | {s.get('steps', '-')} | "
            f"{s.get('cpu_time_s', 0):.0f} |"
        )
    common.write_page((out / "distill.md"), lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
