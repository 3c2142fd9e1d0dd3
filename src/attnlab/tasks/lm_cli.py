"""Command-line parts of the language-model task: `attnlab train lm` and `attnlab generate`."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from attnlab.configs import add_dataclass_arguments, collect_overrides, parse_key_values


def add_train_parser(tasks: argparse._SubParsersAction) -> None:
    """The `train lm` sub-command, with every config field as an option."""
    from attnlab.tasks import lm

    p = tasks.add_parser(
        "lm",
        help="GPT language model (Shakespeare, character level, by default)",
        description="Train a decoder-only Transformer on text. Every config field is an "
        "option; key=value positionals work too (n_layers=4). Bundled presets: "
        + ", ".join(sorted(path.stem for path in lm.PRESETS.glob("lm_*.toml"))),
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    p.add_argument(
        "--out", default=None, help="run directory (default: runs/lm, or runs/lm-N when taken)"
    )
    p.add_argument(
        "--config", default=None, help="a preset: a TOML file or a bundled name (baby, small, ...)"
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    for cls in lm.SECTIONS.values():
        add_dataclass_arguments(p, cls)


def run_train(args: argparse.Namespace) -> int:
    """Train, then print the best validation loss and the sample."""
    from attnlab.cli import _free_run_dir
    from attnlab.tasks import lm

    overrides = parse_key_values(args.overrides)
    for cls in lm.SECTIONS.values():
        overrides.update(collect_overrides(args, cls))
    out = Path(args.out) if args.out else Path("runs/lm")
    if args.out is None and not args.resume:
        out = _free_run_dir(out)
    print(f"run directory: {out}", file=sys.stderr)
    results = lm.train(out, overrides, args.config, resume=args.resume, device=args.device)
    if "summary" not in results:  # a non-main DDP rank
        return 0
    summary = results["summary"]
    loss = results["val_loss"]
    print(
        f"\nbest val loss {loss:.4f} (perplexity {math.exp(loss):.2f}) at step "
        f"{summary['best_step']} of {summary['steps']}; {summary['wall_time_s'] / 60:.1f} min, "
        f"precision {summary['precision']}"
    )
    if "sample" in results:
        print(f"sample:\n{results['sample']}")
    print(f"results in {out}/ (results.json, sample.txt, curves.png, metrics.jsonl)")
    return 0


def add_generate_parser(sub: argparse._SubParsersAction) -> None:
    """The `generate` command."""
    p = sub.add_parser(
        "generate",
        help="continue a prompt with a trained language model (or a Hugging Face GPT-2 dir)",
    )
    p.add_argument("run", help="run directory of `attnlab train lm`, or a GPT-2 checkpoint dir")
    p.add_argument("--prompt", default=None, help="text to continue (default: a newline)")
    p.add_argument("--max-new-tokens", type=int, default=500)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (1 = off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-samples", type=int, default=1, help="samples, generated as one batch")
    p.add_argument(
        "--stop", action="append", default=[], help="end a sample before this text (repeatable)"
    )
    p.add_argument("--no-cache", action="store_true", help="recompute the window at every step")
    p.add_argument("--device", default="cpu")


def run_generate(args: argparse.Namespace) -> int:
    """Stream one sample as it is produced; several are printed one after another."""
    from attnlab.tasks.lm import LMRun, check_request, default_prompt, generate_text

    check_request(args.max_new_tokens, args.num_samples, args.temperature, args.top_k, args.top_p)
    run = LMRun.load(args.run, args.device)
    prompt = default_prompt(run.tokenizer) if args.prompt is None else args.prompt
    streaming = args.num_samples == 1

    def on_text(_: int, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    context = run.model.cfg.context
    n_prompt = len(run.tokenizer.encode(prompt)) if prompt else 0
    if n_prompt > context:
        print(
            f"attnlab: warning: the prompt has {n_prompt} tokens, more than the model's context "
            f"of {context}; only its last {context} tokens are used",
            file=sys.stderr,
        )
    shown = args.prompt or ""  # the default prompt (a newline, <|endoftext|>) is not echoed
    if streaming:
        sys.stdout.write(shown)
    out = generate_text(
        run.model,
        run.tokenizer,
        prompt,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        num_samples=args.num_samples,
        stops=args.stop,
        use_cache=not args.no_cache,
        on_text=on_text if streaming else None,
        device=args.device,
    )
    if streaming:
        sys.stdout.write("\n")
    else:
        for i, text in enumerate(out.texts):
            print(f"--- sample {i + 1} ---\n{shown}{text}")
    return 0
