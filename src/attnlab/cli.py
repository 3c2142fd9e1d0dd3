"""The ``attnlab`` command: parses arguments, then hands over to the task modules."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from attnlab.configs import add_dataclass_arguments, collect_overrides, parse_key_values
from attnlab.explore import command as explore_command
from attnlab.tasks import bert_commands, lm_cli, translate_cli, vision_cli


def _free_run_dir(base: Path) -> Path:
    """``base`` if it holds no run yet, else the first free ``base-2``, ``base-3``, ..."""
    if not (base / "config.json").exists():
        return base
    n = 2
    while (base.parent / f"{base.name}-{n}" / "config.json").exists():
        n += 1
    return base.parent / f"{base.name}-{n}"


def _add_train(sub: argparse._SubParsersAction) -> None:
    from attnlab.tasks import classify

    train = sub.add_parser("train", help="train a model; writes a run directory")
    tasks = train.add_subparsers(dest="task", required=True, metavar="TASK")
    p = tasks.add_parser(
        "classify",
        help="character-level Transformer text classifier (bundled Chinese reviews by default)",
        description="Train a text classifier. Every config field is an option; key=value "
        "positionals work too (n_heads=8).",
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    p.add_argument(
        "--out",
        default=None,
        help="run directory (default: runs/classify, or runs/classify-N when that exists)",
    )
    p.add_argument("--config", default=None, help="a TOML preset ([data]/[model]/[train])")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    for cls in classify.SECTIONS.values():
        add_dataclass_arguments(p, cls)
    lm_cli.add_train_parser(tasks)  # train lm
    bert_commands.add_train_parsers(tasks, p)  # train mlm; train classify --init CHECKPOINT
    vision_cli.add_train_parsers(tasks)  # train vit; train cnn
    translate_cli.add_train_parser(tasks)  # train translate


def _run_train(args: argparse.Namespace) -> int:
    from attnlab.tasks import classify

    if args.task == "lm":
        return lm_cli.run_train(args)
    if args.task in ("vit", "cnn"):
        return vision_cli.run_train(args)
    if args.task == "translate":
        return translate_cli.run_train(args)
    bert_status = bert_commands.run_train(args)
    if bert_status is not None:
        return bert_status
    overrides = parse_key_values(args.overrides)
    for cls in classify.SECTIONS.values():
        overrides.update(collect_overrides(args, cls))
    if args.out is None:
        out = Path("runs/classify")
        # Under torchrun every rank must pick the same directory: no auto-numbering there.
        distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
        out = out if args.resume or distributed else _free_run_dir(out)
    else:
        out = Path(args.out)
    print(f"run directory: {out}", file=sys.stderr)
    results = classify.train(out, overrides, args.config, resume=args.resume, device=args.device)
    if "test" not in results:  # a non-main DDP rank
        return 0
    _print_results(out, results)
    return 0


def _print_results(out: Path, results: dict) -> None:
    from attnlab.tasks.classify import TUTORIAL_EXAMPLES, ClassifierRun

    summary, test = results["summary"], results["test"]
    print(
        f"\nbest {summary['monitor']} {summary['best_metric']:.4f} at step "
        f"{summary['best_step']} ({summary['stop_reason']}); "
        f"{summary['wall_time_s'] / 60:.1f} min, precision {summary['precision']}"
    )
    if test is not None:
        print(
            f"test accuracy {test['accuracy']:.4f}, macro-F1 {test['macro_f1']:.4f} "
            f"(n = {test['n']})"
        )
    run = ClassifierRun.load(out)
    if set(run.labels.labels) == {"positive", "negative"}:
        print("tutorial examples:")
        for pred, (_, want) in zip(
            run.predict([t for t, _ in TUTORIAL_EXAMPLES]), TUTORIAL_EXAMPLES
        ):
            mark = "ok" if pred["label"] == want else f"WRONG (expected {want})"
            print(f"  {pred['text']} -> {pred['label']} {pred['probs'][pred['label']]:.3f}  {mark}")
    print(f"results in {out}/ (results.json, test_report.txt, curves.png, metrics.jsonl)")


def _add_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="accuracy, macro-F1, per-class report, confusion matrix")
    p.add_argument("run", help="run directory")
    p.add_argument(
        "--data", default=None, help="a labelled CSV/TSV/JSONL (default: the run's own test split)"
    )
    p.add_argument("--split", default="test", choices=("train", "val", "test"))
    p.add_argument("--text-col", default=None)
    p.add_argument("--label-col", default=None)
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _run_eval(args: argparse.Namespace) -> int:
    from attnlab.tasks import bert_classify
    from attnlab.tasks.evaluate import evaluate_run

    if vision_cli.is_vision_run(args.run):
        return vision_cli.run_eval(args)
    if translate_cli.is_translate_run(args.run):
        return translate_cli.run_eval(args)
    if bert_classify.is_bert_run(args.run):
        evaluate_run = bert_classify.evaluate_run
    report = evaluate_run(args.run, args.data, args.split, args.text_col, args.label_col)
    if args.json:
        print(json.dumps(report, ensure_ascii=False, indent=2))
    else:
        from attnlab.metrics import format_report

        print(format_report(report))
    return 0


def _add_predict(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="label and probabilities for texts (or stdin lines)")
    p.add_argument("run", help="run directory")
    p.add_argument("texts", nargs="*", help="texts to classify; none = read lines from stdin")
    p.add_argument("--json", action="store_true", help="one JSON object per line")


def _run_predict(args: argparse.Namespace) -> int:
    from attnlab.tasks.bert_classify import BertClassifierRun, is_bert_run
    from attnlab.tasks.classify import ClassifierRun

    if vision_cli.is_vision_run(args.run):
        return vision_cli.run_predict(args)
    load = BertClassifierRun.load if is_bert_run(args.run) else ClassifierRun.load
    run = load(args.run)
    texts = args.texts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        raise ValueError("no text given: pass texts as arguments or pipe lines on stdin")
    for start in range(0, len(texts), 256):
        for pred in run.predict(texts[start : start + 256]):
            if args.json:
                print(json.dumps(pred, ensure_ascii=False))
            else:
                probs = "  ".join(f"{k} {v:.3f}" for k, v in pred["probs"].items())
                print(f"{pred['label']}\t{probs}\t{pred['text']}")
    return 0


def _add_attention(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attention", help="heatmaps of every layer × head for one text")
    p.add_argument("run", help="run directory")
    p.add_argument("text", help="the text to look inside")
    p.add_argument("--out", default=None, help="image path (default: RUN/attention.png)")
    p.add_argument(
        "--member", type=int, default=1, help="for an ensemble run: whose attention to draw (1..M)"
    )


def _run_attention(args: argparse.Namespace) -> int:
    from attnlab.tasks.classify import ClassifierRun
    from attnlab.viz import plot_attention_grid

    if vision_cli.is_vision_run(args.run):
        return vision_cli.run_attention(args)
    run = ClassifierRun.load(args.run)
    if not 1 <= args.member <= run.config.model.members:
        raise ValueError(
            f"--member {args.member}: this run has {run.config.model.members} member(s), "
            f"give 1..{run.config.model.members}"
        )
    info = run.inspect(args.text, member=args.member - 1)
    out = Path(args.out) if args.out else Path(args.run) / "attention.png"
    title = f"{args.text}  →  {info['label']} ({info['prob']:.2f})"
    if run.config.model.members > 1:
        title += f"  [attention of member {args.member} of {run.config.model.members}]"
    plot_attention_grid(
        info["attention"], info["tokens"], out, token_share=info["token_share"], title=title
    )
    top = sorted(zip(info["tokens"], info["token_share"].tolist()), key=lambda t: -t[1])[:5]
    print(
        f"{info['label']} ({info['prob']:.3f}); leans on: "
        + ", ".join(f"{tok} {share:.2f}" for tok, share in top)
    )
    print(f"heatmaps written to {out}")
    return 0


def _add_ablate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ablate", help="train variants of a preset and compare them")
    p.add_argument("task", choices=("classify",))
    p.add_argument(
        "factors",
        nargs="+",
        metavar="FIELD=V1,V2,...",
        help="values to try per config field, e.g. n_heads=1,2,4,8 pooling=mean,cls",
    )
    p.add_argument(
        "--grid",
        action="store_true",
        help="full product of the factors (default: one factor at a time)",
    )
    p.add_argument("--seeds", type=int, default=1, help="seeds per variant (mean ± std)")
    p.add_argument("--steps", type=int, default=0, help="optimizer steps per variant")
    p.add_argument("--epochs", type=int, default=0, help="epochs per variant (if no --steps)")
    p.add_argument(
        "--minutes",
        type=float,
        default=0.0,
        help="stop each variant after this much training wall time",
    )
    p.add_argument("--config", default=None, help="a TOML preset to vary around")
    p.add_argument("--out", default="runs/ablate-classify", help="sweep directory")
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="fixed overrides applied to every variant",
    )


def _run_ablate(args: argparse.Namespace) -> int:
    from attnlab.tasks.ablate import run_sweep

    run_sweep(args)
    return 0


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from attnlab.bench.run import DEFAULT_OUT, SECTIONS

    p = sub.add_parser(
        "bench",
        help="speed and memory vs PyTorch / Hugging Face; writes one markdown report",
        description="Attention kernels (explicit, fused, local, linear), MHA vs "
        "nn.MultiheadAttention, encoder layer vs nn.TransformerEncoderLayer, GPT training step "
        "vs GPT2LMHeadModel (with gradient checkpointing memory), generation with and without "
        "cache, and long-sequence scaling.",
    )
    p.add_argument("--quick", action="store_true", help="small shapes, few rounds (~1 minute)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"report path (default: {DEFAULT_OUT})")
    p.add_argument("--device", default="cpu", help="cpu or cuda (CUDA events time the GPU)")
    p.add_argument("--num-threads", type=int, default=1, help="torch threads; 0 = default")
    p.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}"
    )


def _run_bench(args: argparse.Namespace) -> int:
    from attnlab.bench.run import run_bench

    sections = tuple(s for s in args.only.split(",") if s)
    out = run_bench(args.out, args.quick, args.device, args.num_threads, sections)
    print(out.read_text())
    print(f"report written to {out} (data in {out.with_suffix('.json')})")
    return 0


COMMANDS = {
    "train": (_add_train, _run_train),
    "eval": (_add_eval, _run_eval),
    "predict": (_add_predict, _run_predict),
    "attention": (_add_attention, _run_attention),
    "ablate": (_add_ablate, _run_ablate),
    "generate": (lm_cli.add_generate_parser, lm_cli.run_generate),
    "translate": (translate_cli.add_translate_parser, translate_cli.run_translate),
    "bench": (_add_bench, _run_bench),
    "explore": (explore_command.add_parser, explore_command.run),
    **bert_commands.COMMANDS,  # embed, similarity, search
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnlab",
        description="Transformers written by hand in PyTorch: train, inspect and compare them.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add, _ in COMMANDS.values():
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # argparse fills a trailing `nargs="*"` positional before later options are seen, so
    # `predict RUN --json "text"` leaves "text" over: hand such leftovers to predict's texts.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if args.command != "predict" or any(e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.texts = list(args.texts) + extra
    try:
        return COMMANDS[args.command][1](args)
    except ValueError as err:  # bad input: a message that says what to change, no traceback
        print(f"attnlab: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnlab: interrupted (resume with --resume)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
