"""What one fine-tuning step of the e5 classifier costs in memory and time, by attention
dropout and micro-batch: the measurements behind presets/classify.toml's choices.

Each case runs in a fresh interpreter (so one case's peak cannot hide another's): the e5
encoder and its tokenizer are loaded, then one forward and backward pass of the classifier in
training mode on the longest batch the preset allows (``--length`` pieces, every text full
length), and, for a micro-batch smaller than the step, as many micro-batches as make up the
step (gradients accumulated, as ``grad_accum`` does). Peak: VmHWM over VmRSS before the step
(Linux). Time: the step's wall time, cases interleaved over ``--rounds`` rounds, median.
With attention dropout > 0 PyTorch's fused kernel cannot run in training and the attention
falls back to explicit weights, stored for the backward pass.

    python -m benchmarks.classify.e5_step_memory [--rounds 3] [--threads 1]
        -> docs/results/e5_step_memory.{json,md}
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Sequence

from benchmarks.common import command_line, load_average, machine, machine_line, write_results

STEM = "e5_step_memory"
CASES = (  # (attention dropout, micro-batch), each for a step of --step texts
    (0.1, 32),
    (0.0, 32),
    (0.1, 16),
    (0.0, 16),
)
CASE = """
import json, sys, time
import torch
from attnlab.models.bert import BertClassifier
from attnlab.models.e5 import load_e5

attn_dropout, micro, step, length, threads = (float(sys.argv[1]), int(sys.argv[2]),
                                             int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
torch.set_num_threads(threads)

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024  # MiB

encoder, _ = load_e5()
cfg = encoder.cfg.__class__(**{**vars(encoder.cfg), "attn_dropout": attn_dropout})
model = BertClassifier(cfg, 2, "mean")
model.bert.load_state_dict(encoder.state_dict(), strict=False)
del encoder
model.train()
torch.manual_seed(0)
ids = torch.randint(5, 250000, (step, length))  # (B, T), every text full length
lengths = torch.full((step,), length)
labels = torch.randint(0, 2, (step,))
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
before = status("VmRSS")
start = time.perf_counter()
for i in range(0, step, micro):
    logits = model(ids[i : i + micro], lengths[i : i + micro])  # (b, 2)
    loss = torch.nn.functional.cross_entropy(logits, labels[i : i + micro]) * micro / step
    loss.backward()
seconds = time.perf_counter() - start
print(json.dumps({"peak_mib": status("VmHWM") - before, "base_mib": before, "s": seconds}))
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--step", type=int, default=32, help="texts per optimizer step")
    p.add_argument("--length", type=int, default=128, help="pieces per text")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    info = machine(threads=args.threads)
    runs: dict[str, list[dict]] = {}
    for _ in range(args.rounds):  # interleaved, so load changes touch every case alike
        for dropout, micro in CASES:
            argv_case = [str(dropout), str(micro), str(args.step), str(args.length)]
            out = subprocess.run(
                [sys.executable, "-c", CASE, *argv_case, str(args.threads)],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            runs.setdefault(f"{dropout}/{micro}", []).append(
                json.loads(out.stdout.strip().splitlines()[-1])
            )
    info["load_average_at_end"] = load_average()
    cases = {
        key: {
            "attn_dropout": float(key.split("/")[0]),
            "micro_batch": int(key.split("/")[1]),
            "peak_mib": round(max(r["peak_mib"] for r in rs)),
            "base_mib": round(statistics.median(r["base_mib"] for r in rs)),
            "step_s": round(statistics.median(r["s"] for r in rs), 2),
        }
        for key, rs in runs.items()
    }
    reference = cases[f"{CASES[0][0]}/{CASES[0][1]}"]["step_s"]
    lines = [
        "# One fine-tuning step of the e5 classifier: memory and time",
        "",
        machine_line(info),
        "",
        f"One optimizer step of {args.step} texts x {args.length} pieces (the preset's longest "
        "batch), forward and backward of the classifier in training mode, in a fresh "
        f"interpreter per case; {args.rounds} rounds, cases interleaved. Peak: the most the "
        "step added to the resident set (VmHWM - VmRSS before it), the worst round; the "
        "loaded encoder and tokenizer before it are the base. Time: median, and as a ratio "
        "to the first row, measured side by side.",
        "",
        "| attention dropout | micro-batch | step peak MiB | base MiB | step s | time ratio |",
        "|---|---|---|---|---|---|",
    ]
    for c in cases.values():
        lines.append(
            f"| {c['attn_dropout']} | {c['micro_batch']} | {c['peak_mib']:,} | "
            f"{c['base_mib']:,} | {c['step_s']:.2f} | {c['step_s'] / reference:.2f} |"
        )
    lines.append(
        "\nAdamW's two moments for the ~21.6M trained weights add about 165 MiB more once "
        "the first step is taken (not in this table)."
    )
    write_results(
        STEM,
        {"machine": info, "cases": cases, "args": vars(args)},
        lines,
        command=command_line(argv),
    )


if __name__ == "__main__":
    main()
