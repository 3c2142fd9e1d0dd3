"""How long `attnlab predict RUN` takes for the tutorial's three sentences, start-up included,
and where the time goes (a fresh interpreter per round, median of --rounds).

    python -m benchmarks.classify.predict_startup RUN [--rounds 5]
        -> docs/results/predict_startup.{json,md}

The breakdown times the same steps `predict` takes, one after another in one fresh process:
import torch, import attnlab's CLI, load the run (its tokenizer.json, the classifier, its
weights), classify the three sentences; then reads tokenizer.json once more on its own, to show
how much of the load that is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import command_line, load_average, machine, machine_line

STEM = "predict_startup"
SENTENCES = (
    "这部电影看得我热血沸腾，情节紧凑。",
    "剧情拖沓，演员演技一言难尽。",
    "电影前半段很无聊，但是结局让我感动",
)
BREAKDOWN = """
import json, sys, time
t = [time.perf_counter()]
import torch
t.append(time.perf_counter())
import attnlab.cli
from attnlab.data.sentencepiece import load_tokenizer
from attnlab.runs.load import load_run
t.append(time.perf_counter())
run_dir = sys.argv[1]
run = load_run(run_dir)
t.append(time.perf_counter())
run.predict(sys.argv[2:])
t.append(time.perf_counter())
load_tokenizer(run_dir + "/tokenizer.json")  # again, alone: the part of the load it takes
t.append(time.perf_counter())
print(json.dumps([b - a for a, b in zip(t, t[1:])]))
"""
STEPS = ("import torch", "import attnlab", "load the run", "predict")
PART = "of the load: reading tokenizer.json (timed again, alone)"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="a `train classify` run folder")
    p.add_argument("--rounds", type=int, default=5)
    return p


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    info = machine()
    predict = [sys.executable, "-m", "attnlab", "predict", str(args.run), *SENTENCES]
    walls, steps = [], []
    for _ in range(args.rounds):  # interleaved, so load changes touch both alike
        walls.append(wall(predict))
        out = subprocess.run(
            [sys.executable, "-c", BREAKDOWN, str(args.run), *SENTENCES],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        steps.append(json.loads(out.stdout.strip().splitlines()[-1]))
    info["load_average_at_end"] = load_average()
    medians = [statistics.median(s[i] for s in steps) for i in range(len(STEPS) + 1)]
    part = medians.pop()
    data = {
        "machine": info,
        "run": str(args.run),
        "rounds": args.rounds,
        "predict_wall_s": walls,
        "breakdown_s": {**dict(zip(STEPS, medians)), PART: part},
    }
    lines = [
        "# `attnlab predict` of the tutorial's three sentences, start-up included",
        "",
        machine_line(info),
        "",
        f"A fresh interpreter per round, {args.rounds} rounds; the run: `{args.run}` "
        f"(a `train classify` folder). `attnlab predict RUN` + the three sentences: median "
        f"{statistics.median(walls):.2f} s (min {min(walls):.2f}, max {max(walls):.2f}).",
        "",
        "Where the time goes (the same steps in one fresh process, median per step):",
        "",
        "| step | seconds |",
        "|---|---|",
        *(f"| {name} | {s:.2f} |" for name, s in zip(STEPS, medians)),
        f"| total | {sum(medians):.2f} |",
        f"| ({PART}) | {part:.2f} |",
    ]
    from benchmarks.common import write_results

    write_results(STEM, data, lines, command=command_line(argv))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
