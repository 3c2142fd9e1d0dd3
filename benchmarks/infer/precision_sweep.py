"""How far each fast CPU path's probabilities fall from float32's on the test suite's tiny runs:
the sweep tests/infer/test_inference_paths.py takes its tolerances from.

For seeds 0..N-1 it writes the tiny e5 (mean pooling), MiniLM-layout BERT ([CLS] pooling) and
character runs the tests use (random weights), predicts the check set and the tests' texts
through fp32 and each path this CPU has (int8; bf16 where native), and records the largest
|p - p_fp32| over texts and classes and the labels that changed. Writes
docs/results/precision_sweep.{json,md}.

    python -m benchmarks.infer.precision_sweep [--seeds 20]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchmarks.common import RESULTS, command_line, machine, machine_line, write_page


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args(argv)

    import torch
    from tests import _runs  # the tests' own tiny runs (tests/_runs.py, tests/explore/)
    from tests.explore import explore_runs

    from attnlab.infer.classifier import check_set
    from attnlab.infer.precision import available
    from attnlab.runs.load import load_run

    info = machine(threads=1)
    torch.set_num_threads(1)
    texts = check_set() + ["Great film, I loved it!", "好" * 300, "差"]
    worst: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            root = Path(tmp) / str(seed)
            runs = {
                "e5 mean": _runs.e5_run(root / "e5", "mean", seed=seed),
                "bert cls": _runs.bert_run(root / "bert", "cls", seed=seed),
            }
            torch.manual_seed(seed)
            runs["char"] = explore_runs.classifier_run(root / "char")
            for kind, path in runs.items():
                run = load_run(path)
                ref = run.probs(run.model, texts)
                for p in available():
                    if p == "fp32":
                        continue
                    run.use_precision(p, [1])
                    got = run.probs(run.infer_model, texts)
                    row = worst.setdefault(f"{kind} / {p}", {"max_prob_change": 0.0,
                                                             "labels_changed": 0})  # fmt: skip
                    change = float((got - ref).abs().max())
                    row["max_prob_change"] = max(row["max_prob_change"], change)
                    row["labels_changed"] += int((got.argmax(-1) != ref.argmax(-1)).sum())
            print(f"seed {seed}: " + ", ".join(f"{k} {v['max_prob_change']:.4f}"
                                               for k, v in worst.items()), flush=True)  # fmt: skip
    result = {"command": command_line(argv), "machine": info, "seeds": args.seeds,
              "texts": len(texts), "worst": worst}  # fmt: skip
    (RESULTS / "precision_sweep.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "# Fast CPU paths against float32 on the tests' tiny runs",
        "",
        machine_line(info),
        "",
        f"Seeds 0..{args.seeds - 1}, {len(texts)} texts each (the check set and three of the "
        "tests' texts: English, 300 characters, one character); random-weight tiny runs, so "
        "labels can flip where a text sits near 0.5: the labels-unchanged check on a trained "
        "run is on docs/results/throughput.md. The character run's fixture seeds its own "
        "weights (0), so its row is one model's.",
        "",
        "| run / path | largest probability change | labels changed (of all texts x seeds) |",
        "|---|---|---|",
    ]
    lines += [f"| {k} | {v['max_prob_change']:.5f} | {v['labels_changed']} |"
              for k, v in worst.items()]  # fmt: skip
    write_page(RESULTS / "precision_sweep.md", "\n".join(lines) + "\n", result["command"])


if __name__ == "__main__":
    main()
