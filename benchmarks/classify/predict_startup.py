"""How long `attnlab predict RUN` takes for the tutorial's three sentences, start-up included,
and where the time goes (a fresh interpreter per round, median of --rounds).

    python -m benchmarks.classify.predict_startup RUN [--rounds 5]
        -> docs/results/predict_startup.{json,md}

The breakdown times the same steps `predict` takes, one after another in one fresh process:
import torch, import attnlab's CLI, load the run (its tokenizer.json, the classifier, its
weights), classify the three sentences; then reads tokenizer.json once more on its own, to show
how much of the load that is. That process's own wall time, less its steps, is what starting
an interpreter costs beside them (both processes end without the interpreter's teardown); what
`attnlab predict` takes beyond the breakdown's wall is the command line's own (parsing,
printing). Each round also runs the same `predict` ending as scripts normally do, with the
interpreter's teardown (``sys.exit(main())``), to show what ending without it saves.
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
import json, os, sys, time
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
print(json.dumps([b - a for a, b in zip(t, t[1:])]), flush=True)
os._exit(0)  # as `attnlab predict` ends: without the interpreter's teardown
"""
# `attnlab predict` as it was before it skipped the teardown
WITH_TEARDOWN = "import sys; from attnlab.cli import main; sys.exit(main(sys.argv[1:]))"
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


def _spread(values: list[float]) -> str:
    """'median (min to max)' of seconds."""
    return f"{statistics.median(values):.2f} ({min(values):.2f} to {max(values):.2f})"


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    info = machine()
    predict = [sys.executable, "-m", "attnlab", "predict", str(args.run), *SENTENCES]
    walls, steps, breakdown_walls, teardown_walls = [], [], [], []
    for _ in range(args.rounds):  # interleaved, so load changes touch all alike
        walls.append(wall(predict))
        teardown_walls.append(wall([sys.executable, "-c", WITH_TEARDOWN, *predict[3:]]))
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", BREAKDOWN, str(args.run), *SENTENCES],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        breakdown_walls.append(time.perf_counter() - start)
        steps.append(json.loads(out.stdout.strip().splitlines()[-1]))
    info["load_average_at_end"] = load_average()
    medians = [statistics.median(s[i] for s in steps) for i in range(len(STEPS) + 1)]
    part = medians.pop()
    # the breakdown's process, less its steps (its second tokenizer read included)
    interpreter = statistics.median(w - sum(s) for w, s in zip(breakdown_walls, steps))
    command = statistics.median(walls) - statistics.median(breakdown_walls) + part
    data = {
        "machine": info,
        "run": str(args.run),
        "rounds": args.rounds,
        "predict_wall_s": walls,
        "predict_with_teardown_wall_s": teardown_walls,
        "breakdown_s": {**dict(zip(STEPS, medians)), PART: part},
        "interpreter_s": interpreter,
        "command_line_s": command,
    }
    lines = [
        "# `attnlab predict` of the tutorial's three sentences, start-up included",
        "",
        machine_line(info),
        "",
        f"A fresh interpreter per round, {args.rounds} rounds; the run: `{args.run}` "
        f"(a `train classify` folder). `attnlab predict RUN` + the three sentences: median "
        f"{statistics.median(walls):.2f} s (min {min(walls):.2f}, max {max(walls):.2f}); "
        f"the same ending with the interpreter's teardown: median "
        f"{statistics.median(teardown_walls):.2f} s; in each round the teardown cost "
        f"{_spread([t - w for t, w in zip(teardown_walls, walls)])} s.",
        "",
        "Where the time goes (the same steps in one fresh process, median per step):",
        "",
        "| step | seconds |",
        "|---|---|",
        f"| start an interpreter | {interpreter:.2f} |",
        *(f"| {name} | {s:.2f} |" for name, s in zip(STEPS, medians)),
        f"| the command line's own (parsing, printing: predict's median less the "
        f"breakdown's, without its second tokenizer read) | {command:.2f} |",
        f"| total | {interpreter + sum(medians) + command:.2f} |",
        f"| ({PART}) | {part:.2f} |",
    ]
    from benchmarks.common import write_results

    write_results(STEM, data, lines, command=command_line(argv))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
