"""Train a translation preset on the bundled Bible for a time budget; BLEU/chrF, greedy vs beam.

python benchmarks/translate_train.py --steps 600 --minutes 14 \
    --out docs/results/translate_ende_small
python benchmarks/translate_train.py --config default --pair en-zh --minutes 20 --by-time \
    --out docs/results/translate_enzh_default tgt_tokenizer=char shared_embeddings=false

`--config default` is `attnlab train translate` with no preset; `--by-time` runs the lr
schedule on the clock (`schedule_by_time`), so a run the budget stops still ends its decay.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import torch

from attnlab.tasks.translate import TranslatorRun, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="small", help="bundled preset name, or default")
    parser.add_argument("--pair", default="en-de", help="bundled Bible pair: en-de, en-zh, ...")
    parser.add_argument("--by-time", action="store_true", help="lr schedule on the clock")
    parser.add_argument(
        "--eval-only", action="store_true", help="only rescore the finished run in --run"
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="more config fields")
    parser.add_argument("--steps", type=int, default=600, help="optimizer steps (cosine length)")
    parser.add_argument("--minutes", type=float, default=14.0, help="training wall-time budget")
    parser.add_argument("--run", type=Path, default=Path("runs/bench-translate-small"))
    parser.add_argument("--out", type=Path, default=Path("docs/results/translate_ende_small"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.eval_only:  # rescore the finished run in --run (e.g. after a scoring fix)
        results = json.loads((args.run / "results.json").read_text())
        results["test"] = TranslatorRun.load(args.run).evaluate("test")
        total = json.loads(args.out.with_suffix(".json").read_text())["total_wall_s_with_eval"]
    else:
        shutil.rmtree(args.run, ignore_errors=True)
        start = time.perf_counter()
        overrides = {"max_steps": str(args.steps), "max_minutes": str(args.minutes)}
        overrides |= {"pair": args.pair, "num_threads": "1", "tensorboard": "false"}
        if args.by_time:
            overrides["schedule_by_time"] = "true"
        overrides |= dict(kv.split("=", 1) for kv in args.overrides)
        results = train(args.run, overrides, None if args.config == "default" else args.config)
        total = time.perf_counter() - start
    beam = results["test"]
    greedy = TranslatorRun.load(args.run).evaluate("test", beam_size=1)
    summary = results["summary"]
    report = {
        "config": args.config,
        "pair": args.pair,
        "schedule_by_time": args.by_time,
        "overrides": args.overrides,
        "data": results["data"],
        "n_params": results["n_params"],
        "train_wall_s": round(summary["wall_time_s"], 1),
        "steps": summary["steps"],
        "stop_reason": summary["stop_reason"],
        "best_val_loss": round(summary["best_metric"], 4),
        "total_wall_s_with_eval": round(total, 1),
        "load_average_1min_at_end": os.getloadavg()[0],
        "test_beam": beam,
        "test_greedy": greedy,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    rows = [
        f"| {name} | {r['beam_size']} | {r['bleu']:.2f} | {r['chrf']:.2f} | "
        f"{r['decode_seconds']:.1f} |"
        for name, r in (("greedy", greedy), ("beam", beam))
    ]
    md = [
        f"# {args.pair} on the bundled Bible, preset `{args.config}`",
        "",
        f"Produced by `python benchmarks/translate_train.py --config {args.config} --pair "
        f"{args.pair} --steps {args.steps} --minutes {args.minutes}"
        f"{' --by-time' if args.by_time else ''}{''.join(' ' + kv for kv in args.overrides)}`"
        f"{' (test scores recomputed with --eval-only)' if args.eval_only else ''}: "
        f"{results['n_params'] / 1e6:.2f}M parameters, {summary['steps']} optimizer steps in "
        f"{summary['wall_time_s'] / 60:.1f} min on one CPU thread of a shared, busy 2-core "
        f"machine (stop: {summary['stop_reason']}); best dev loss {summary['best_metric']:.3f} "
        f"nats/token. Test split: {beam['n']} verses (whole chapters held out).",
        "",
        "| decoding | beam | BLEU | chrF | decode time (s) |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"sacreBLEU signatures: `{beam['signatures'][0]}`, `{beam['signatures'][1]}`.",
        "",
        "Examples (beam):",
        "",
        *[f"- src: {e['src']}\n  - ref: {e['ref']}\n  - hyp: {e['hyp']}" for e in beam["examples"]],
    ]
    args.out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(json.dumps(report, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
