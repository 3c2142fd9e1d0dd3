"""Command-line parts of translation: `train translate`, `translate`, and `eval` of a run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnlab.configs import add_dataclass_arguments, collect_overrides, parse_key_values


def add_train_parser(tasks: argparse._SubParsersAction) -> None:
    """The `train translate` sub-command, with every config field as an option."""
    from attnlab.tasks import translate

    p = tasks.add_parser(
        "translate",
        help="encoder-decoder Transformer translation (Bible en->de by default)",
        description="Train a translation model. Every config field is an option; key=value "
        "positionals work too. Bundled presets: "
        + ", ".join(sorted(path.stem for path in translate.PRESETS.glob("translate*.toml"))),
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    p.add_argument("--out", default=None, help="run directory (default: runs/translate[-N])")
    p.add_argument("--config", default=None, help="a preset: TOML file or bundled name (copy)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    for cls in translate.SECTIONS.values():
        add_dataclass_arguments(p, cls)


def run_train(args: argparse.Namespace) -> int:
    """Train, then print the test scores."""
    from attnlab.cli import _free_run_dir
    from attnlab.tasks import translate

    overrides = parse_key_values(args.overrides)
    for cls in translate.SECTIONS.values():
        overrides.update(collect_overrides(args, cls))
    out = Path(args.out) if args.out else Path("runs/translate")
    if args.out is None and not args.resume:
        out = _free_run_dir(out)
    print(f"run directory: {out}", file=sys.stderr)
    results = translate.train(out, overrides, args.config, resume=args.resume, device=args.device)
    if "test" not in results:  # a non-main DDP rank
        return 0
    summary, test = results["summary"], results["test"]
    print(
        f"\nbest val loss {summary['best_metric']:.4f} at step {summary['best_step']}; "
        f"{summary['wall_time_s'] / 60:.1f} min"
    )
    print(_scores(test))
    print(f"results in {out}/ (results.json, test.hyp.txt, metrics.jsonl)")
    return 0


def _scores(report: dict) -> str:
    return (
        f"{report['split']} ({report['n']} sentences, beam {report['beam_size']}): "
        f"BLEU {report['bleu']:.2f}, chrF {report['chrf']:.2f}, "
        f"exact match {report['exact_match']:.4f}"
    )


def add_translate_parser(sub: argparse._SubParsersAction) -> None:
    """The `translate` command."""
    p = sub.add_parser("translate", help="translate sentences with a trained translation run")
    p.add_argument("run", help="run directory of `attnlab train translate`")
    p.add_argument("texts", nargs="*", help="sentences; none = --input or stdin lines")
    p.add_argument("--input", default=None, help="a file of sentences, one a line")
    p.add_argument("--output", default=None, help="write translations here (default: stdout)")
    p.add_argument("--beam", type=int, default=None, help="beam size (1 = greedy)")


def run_translate(args: argparse.Namespace) -> int:
    from attnlab.tasks.translate import TranslatorRun

    run = TranslatorRun.load(args.run)
    if args.texts:
        texts = list(args.texts)
    elif args.input:
        texts = Path(args.input).read_text(encoding="utf-8").splitlines()
    else:
        texts = [line.rstrip("\n") for line in sys.stdin]
    if not any(t.strip() for t in texts):
        raise ValueError("no text given: pass sentences, --input FILE, or lines on stdin")
    hyps = [h if t.strip() else "" for t, h in zip(texts, run.translate(texts, args.beam))]
    text = "".join(h + "\n" for h in hyps)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def is_translate_run(run_dir: str | Path) -> bool:
    """Whether config.json of ``run_dir`` says task "translate"."""
    path = Path(run_dir) / "config.json"
    return path.exists() and json.loads(path.read_text()).get("task") == "translate"


def run_eval(args: argparse.Namespace) -> int:
    """`attnlab eval RUN` for a translation run: BLEU and chrF on a split, hypotheses written."""
    from attnlab.tasks.translate import TranslatorRun

    split = {"val": "dev"}.get(args.split, args.split)
    report = TranslatorRun.load(args.run).evaluate(split)
    print(json.dumps(report, ensure_ascii=False, indent=2) if args.json else _scores(report))
    return 0
