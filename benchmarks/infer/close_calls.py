"""How far bf16 (and int8) move a trained classifier's probabilities from float32's, and what the
bf16 path's float32 re-run of close calls costs and keeps: the measurement behind
``attnlab.infer.precision.BF16_MARGIN``.

    python -m benchmarks.infer.close_calls RUN [--margins 0.02,0.04,0.06,0.1,0.2]
        -> docs/results/close_calls.{json,md}

On the run's validation and test splits: float32's probabilities; each fast path's without the
re-run (bf16: the Linear weights in bfloat16 under autocast; int8: torch.ao's dynamic
quantization) and the largest |p - p_fp32| and labels changed; the share of texts whose
float32 top-two margin is under each margin; and the bf16 path as predict runs it (close calls
re-run in float32): labels changed and the share re-run; the same for the bf16 pass through
``torch.compile`` (``--compile``), whose fused kernels round differently from eager bf16.
"""

from __future__ import annotations

import argparse
import json

from benchmarks.common import (
    RESULTS,
    command_line,
    load_average,
    machine,
    machine_line,
    write_page,
)

STEM = "close_calls"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a trained e5 / BERT classifier run folder")
    p.add_argument("--margins", default="0.02,0.04,0.06,0.1,0.2")
    args = p.parse_args(argv)
    margins = [float(m) for m in args.margins.split(",")]

    import torch

    from attnlab.infer import precision as prec
    from attnlab.infer.classifier import ClassifierRun

    torch.set_num_threads(1)
    info = machine(threads=1)
    run = ClassifierRun.load(args.run)

    def probs(model: torch.nn.Module, texts: list[str]) -> torch.Tensor:
        return torch.cat([run.probs(model, texts[i : i + 64]) for i in range(0, len(texts), 64)])

    fp32 = prec.convert(run.model, "fp32")  # what predict runs: Linear on oneDNN
    paths = {"int8": prec.convert(run.model, "int8")}
    guarded = {}  # the bf16 path as predict runs it, eager and through torch.compile
    if "bf16" in prec.available():
        guarded["bf16"] = prec.convert(run.model, "bf16")
        if prec.compile_missing() is None:
            guarded["bf16 compiled"] = prec.compiled(prec.convert(run.model, "bf16"), run.model)
    paths.update({name: path.fast for name, path in guarded.items()})
    rows = {}
    for split in ("val", "test"):
        texts, _, source = run.split_texts(split)
        texts = sorted(texts, key=len)  # batches pad as little as predict's own sorting does
        ref = probs(fp32, texts)  # (N, C)
        top = ref.topk(2, dim=-1).values
        margin = top[:, 0] - top[:, 1]  # (N,)
        row = {
            "source": source,
            "n": len(texts),
            "under_margin": {str(m): float((margin < m).float().mean()) for m in margins},
        }
        for name, model in paths.items():
            got = probs(model, texts)
            row[name] = {
                "labels_changed": int((got.argmax(-1) != ref.argmax(-1)).sum()),
                "max_prob_change": float((got - ref).abs().max()),
            }
        for name, path in guarded.items():
            path.seen = path.rerun = 0
            got = probs(path, texts)
            row[f"{name} with re-run"] = {
                "margin": prec.BF16_MARGIN,
                "labels_changed": int((got.argmax(-1) != ref.argmax(-1)).sum()),
                "max_prob_change": float((got - ref).abs().max()),
                "rerun_share": path.rerun / max(1, path.seen),
            }
        rows[split] = row
        print(split, json.dumps(row), flush=True)
    info["load_average_at_end"] = load_average()
    out = {"command": command_line(argv), "machine": info, "run": args.run, "splits": rows}
    (RESULTS / f"{STEM}.json").write_text(json.dumps(out, indent=1), "utf-8")
    write_page(RESULTS / f"{STEM}.md", page(out, margins), out["command"])


def page(out: dict, margins: list[float]) -> list[str]:
    lines = [
        "# Close calls: how far the fast paths move a classifier's probabilities",
        "",
        machine_line(out["machine"]),
        "",
        f"Run: `{out['run']}`. Every path's probabilities against float32's on the run's own "
        "validation and test splits. A label can change only where the two likeliest classes' "
        "changes sum past their float32 margin, so the share of texts under a margin is what a "
        "re-run of close calls costs.",
        "",
        "| split | texts | path | labels changed | largest probability change | re-run |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for split, row in out["splits"].items():
        for name in ("int8", "bf16", "bf16 with re-run", "bf16 compiled",
                     "bf16 compiled with re-run"):
            if name in row:
                r = row[name]
                rerun = f"{r['rerun_share']:.1%} (margin {r['margin']})" if "margin" in r else "-"
                lines.append(f"| {split} | {row['n']} | {name} | {r['labels_changed']} | "
                             f"{r['max_prob_change']:.4f} | {rerun} |")  # fmt: skip
    lines += ["", "Share of texts whose float32 top-two margin is under:", "",
              "| split | " + " | ".join(str(m) for m in margins) + " |",
              "|---|" + "---:|" * len(margins)]  # fmt: skip
    for split, row in out["splits"].items():
        shares = " | ".join(f"{row['under_margin'][str(m)]:.1%}" for m in margins)
        lines.append(f"| {split} | {shares} |")
    return lines


if __name__ == "__main__":
    main()
