"""Train a translation preset on the bundled Bible for a time budget; BLEU/chrF, greedy vs beam.

python -m benchmarks.translate.train --pair en-de --out docs/results/translate_ende
python -m benchmarks.translate.train --stacks torch --out docs/results/translate_ende_torch
python -m benchmarks.translate.train --pair en-zh --out docs/results/translate_enzh_char \
    tgt_tokenizer=char shared_embeddings=false max_sentence_tokens=128

With no options it is `attnlab train translate` with its default preset (20 minutes, the lr
schedule on the clock), run on one thread; `--minutes`/`--steps` override the budget.
`--stacks torch` puts torch.nn.Transformer's encoder and decoder stacks in place of attnlab's
(same data, tokenizer, embeddings, tied projection, loss, schedule and seed; see
_torch_stacks.py): run the two side by side, one per core, for an equal-budget
comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from attnlab.runs import training
from attnlab.tasks import translate
from attnlab.tasks.translate import TranslatorRun
from benchmarks import common
from benchmarks.translate._runs import read_run_config


def spread_examples(run: Path, k: int = 6) -> list[dict[str, str]]:
    """The first test verse of k chapters spread over the test split, with the beam output."""
    test = translate.run_pairs(read_run_config(run), "test")
    hyps = (run / "test.beam.txt").read_text().splitlines()
    firsts = [i for i, p in enumerate(test) if i == 0 or test[i - 1].group != p.group]
    chosen = firsts[:: max(1, len(firsts) // k)][:k]
    return [
        {"group": test[i].group, "src": test[i].src, "ref": test[i].tgt, "hyp": hyps[i]}
        for i in chosen
    ]


def bleu_text(report: dict) -> str:
    """BLEU for the table; undefined (None) when no hypothesis has four tokens."""
    return "n/a" if report["bleu"] is None else f"{report['bleu']:.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="default", help="bundled preset name, or default")
    parser.add_argument("--pair", default="en-de", help="bundled Bible pair: en-de, en-zh, ...")
    parser.add_argument("--stacks", choices=("attnlab", "torch"), default="attnlab")
    parser.add_argument(
        "--eval-only", action="store_true", help="only rescore the finished run in --run"
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="more config fields")
    parser.add_argument("--steps", type=int, help="max optimizer steps (default: the preset's)")
    parser.add_argument("--minutes", type=float, help="training budget (default: the preset's)")
    parser.add_argument("--run", type=Path, default=None, help="default runs/bench-translate-*")
    parser.add_argument("--out", type=Path, default=Path("docs/results/translate_ende"))
    args = parser.parse_args(argv)
    run = args.run or Path(f"runs/bench-translate-{args.out.name}")
    torch.set_num_threads(1)
    if args.stacks == "torch":  # train and load the nn.Transformer stacks instead of ours
        from benchmarks.translate._torch_stacks import TorchSeq2Seq

        translate.Seq2SeqTransformer = TorchSeq2Seq  # type: ignore[misc]
    command = " ".join(a for a in sys.argv[1:] if a != "--eval-only")
    overrides_given = args.overrides
    if args.eval_only:  # rescore the finished run (e.g. after a scoring fix)
        results = json.loads((run / "results.json").read_text())
        results["test"] = TranslatorRun.load(run).evaluate(split="test")
        before = json.loads(args.out.with_suffix(".json").read_text())
        total, load_average = before["total_wall_s_with_eval"], before["load_average_1min_at_end"]
        command, overrides_given = before["command"], before["overrides"]
        args.config = before["config"]
    else:
        shutil.rmtree(run, ignore_errors=True)
        start = time.perf_counter()
        overrides = {"pair": args.pair, "num_threads": "1", "tensorboard": "false"}
        if args.steps is not None:
            overrides["max_steps"] = str(args.steps)
        if args.minutes is not None:
            overrides["max_minutes"] = str(args.minutes)
        overrides |= dict(kv.split("=", 1) for kv in args.overrides)
        preset = None if args.config == "default" else args.config
        results = training.train("translate", run, overrides, preset)
        total = time.perf_counter() - start
        load_average = os.getloadavg()[0]  # 1-minute load as training ends
    beam = results["test"]
    shutil.copy(run / "test.hyp.txt", run / "test.beam.txt")  # read by translate.compare
    greedy = TranslatorRun.load(run).evaluate(split="test", beam_size=1)
    shutil.copy(run / "test.hyp.txt", run / "test.greedy.txt")
    summary = results["summary"]
    saved = read_run_config(run)
    report = {
        "config": args.config,
        "pair": saved.data.pair,
        "command": command,
        "run": str(run),
        "rescored": args.eval_only,
        "stacks": args.stacks,
        "schedule_by_time": saved.train.schedule_by_time,
        "max_minutes": saved.train.max_minutes,
        "overrides": overrides_given,
        "data": results["data"],
        "n_params": results["n_params"],
        "train_wall_s": round(summary["wall_time_s"], 1),
        "steps": summary["steps"],
        "stop_reason": summary["stop_reason"],
        "best_val_loss": round(summary["best_metric"], 4),
        "total_wall_s_with_eval": round(total, 1),
        "load_average_1min_at_end": load_average,
        "test_beam": beam,
        "test_greedy": greedy,
        "examples_across_test": spread_examples(run),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    rows = [
        f"| {name} | {r['beam_size']} | {bleu_text(r)} | {r['chrf']:.2f} | "
        f"{r['decode_seconds']:.1f} |"
        for name, r in (("greedy", greedy), ("beam", beam))
    ]
    md = [
        f"# {report['pair']} on the bundled Bible, preset `{args.config}`",
        "",
        f"{'Test rescored with --eval-only. ' if args.eval_only else ''}"
        f"{args.stacks} encoder/decoder stacks, "
        f"{results['n_params'] / 1e6:.2f}M parameters, {summary['steps']} optimizer steps in "
        f"{summary['wall_time_s'] / 60:.1f} min on one CPU thread (2-core machine, load average "
        f"{report['load_average_1min_at_end']:.1f} at the end; stop: {summary['stop_reason']}); "
        f"best dev loss {summary['best_metric']:.3f} "
        f"nats/token. Test split: {beam['n']} verses (whole chapters held out).",
        "",
        "| decoding | beam | BLEU | chrF | decode time (s) |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"sacreBLEU signatures: `{beam['signatures'][0]}`, `{beam['signatures'][1]}`.",
        "",
        "Examples (beam), the first verse of chapters spread over the test split:",
        "",
        *[
            f"- {e['group']}: {e['src']}\n  - ref: {e['ref']}\n  - hyp: {e['hyp']}"
            for e in report["examples_across_test"]
        ],
    ]
    full = "python -m benchmarks.translate.train" + (f" {command}" if command else "")
    args.out.with_suffix(".md").write_text(common.with_command(md, full))
    print(json.dumps(report, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
