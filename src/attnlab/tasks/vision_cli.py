"""Command line of the vision task: `train vit/cnn`; eval, predict and attention of its runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnlab.configs import add_dataclass_arguments, collect_overrides, parse_key_values
from attnlab.tasks.vision import is_vision_run

__all__ = ["add_train_parsers", "is_vision_run", "run_attention", "run_eval", "run_predict"]


def add_train_parsers(tasks: argparse._SubParsersAction) -> None:
    """`train vit` and `train cnn`, with every config field as an option."""
    from attnlab.tasks import vision

    helps = {
        "vit": "Vision Transformer image classifier (Fashion-MNIST by default)",
        "cnn": "small ResNet with --attention none|se|eca|cbam|ca (Fashion-MNIST by default)",
    }
    for arch, help_text in helps.items():
        p = tasks.add_parser(
            arch,
            help=help_text,
            description=f"{help_text}. Every config field is an option; key=value positionals "
            "work too. Bundled presets: "
            + ", ".join(sorted(q.stem for q in vision.PRESETS.glob(f"{arch}*.toml"))),
        )
        p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
        p.add_argument("--out", default=None, help=f"run directory (default: runs/{arch}[-N])")
        p.add_argument("--config", default=None, help="a TOML preset file or a bundled name")
        p.add_argument("--resume", action="store_true", help="continue the run in --out")
        p.add_argument("--device", default="cpu", help="cpu or cuda")
        for cls in vision.sections(arch).values():
            add_dataclass_arguments(p, cls)


def run_train(args: argparse.Namespace) -> int:
    """Train, then print test accuracy, parameters, wall time and inference speed."""
    from attnlab.cli import _free_run_dir
    from attnlab.tasks import vision

    overrides = parse_key_values(args.overrides)
    for cls in vision.sections(args.task).values():
        overrides.update(collect_overrides(args, cls))
    out = Path(args.out) if args.out else Path(f"runs/{args.task}")
    if args.out is None and not args.resume:
        out = _free_run_dir(out)
    print(f"run directory: {out}", file=sys.stderr)
    results = vision.train(args.task, out, overrides, args.config, args.resume, args.device)
    summary, test = results["summary"], results["test"]
    print(
        f"\nbest val acc {summary['best_metric']:.4f} at step {summary['best_step']} "
        f"({summary['stop_reason']}); {summary['wall_time_s'] / 60:.1f} min training"
    )
    print(
        f"test accuracy {test['accuracy']:.4f}, macro-F1 {test['macro_f1']:.4f} "
        f"(n = {test['n']}); {results['n_params']:,} parameters; "
        f"{results['images_per_s']:.0f} images/s at inference"
    )
    print(f"results in {out}/ (results.json, test_report.txt, curves.png, metrics.jsonl)")
    return 0


def run_eval(args: argparse.Namespace) -> int:
    """`attnlab eval RUN [--data FOLDER] [--split S]` for a vision run."""
    from attnlab.metrics import format_report
    from attnlab.tasks.vision import VisionRun

    report = VisionRun.load(args.run).evaluate(args.split, args.data)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def run_predict(args: argparse.Namespace) -> int:
    """`attnlab predict RUN image.png ...`: label and top probabilities per image."""
    from attnlab.tasks.vision import VisionRun

    if not args.texts:
        raise ValueError("no image given: pass image files, e.g. attnlab predict RUN shoe.png")
    for pred in VisionRun.load(args.run).predict(args.texts):
        if args.json:
            print(json.dumps(pred, ensure_ascii=False))
        else:
            top = sorted(pred["probs"].items(), key=lambda kv: -kv[1])[:3]
            probs = "  ".join(f"{k} {v:.3f}" for k, v in top)
            print(f"{pred['label']}\t{probs}\t{pred['image']}")
    return 0


def run_attention(args: argparse.Namespace) -> int:
    """`attnlab attention RUN image.png --out rollout.png`: attention rollout of a ViT run."""
    from attnlab.tasks.vision import VisionRun, plot_rollout

    run = VisionRun.load(args.run)
    image, rollout, pred = run.rollout(args.text)
    out = Path(args.out) if args.out else Path(args.run) / "rollout.png"
    title = f"{Path(args.text).name} → {pred['label']} ({pred['probs'][pred['label']]:.2f})"
    plot_rollout(image, rollout, out, title)
    g = rollout.shape[0]
    k = int(rollout.argmax())
    print(
        f"{pred['label']} ({pred['probs'][pred['label']]:.3f}); most attended patch: "
        f"row {k // g}, column {k % g} of {g}×{g} ({rollout.max():.3f})"
    )
    print(f"rollout written to {out}")
    return 0
