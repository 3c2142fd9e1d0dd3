"""`attnlab explore RUN [INPUT ...] [--out page.html] [--png FILE] [--serve]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab.errors import UserError

VIEWS = ("head", "matrix", "scale", "tokens", "pieces", "steps", "image", "gates")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "explore",
        help="attention explorer: one offline HTML page for any run (or a live page)",
        description="Writes one self-contained HTML page (no network, opens from disk) showing "
        "the attention of a classifier, BERT (also `e5`, `minilm`), GPT, translation, ViT or "
        "CNN run "
        "for the given inputs: texts, prompts, source sentences or image files (vision runs "
        "without inputs show test images). --serve serves the page with a box to try new inputs.",
    )
    p.add_argument("run", help="run directory, GPT-2/BERT checkpoint directory, e5 or minilm")
    p.add_argument("inputs", nargs="*", metavar="INPUT", help="texts, prompts or image files")
    p.add_argument("--out", default=None, help="page path (default: RUN/explore.html)")
    p.add_argument("--png", default=None, help="also save a screenshot of one view (chromium)")
    p.add_argument("--view", default=None, choices=VIEWS, help="the view --png shows")
    p.add_argument("--serve", action="store_true", help="serve a live page instead of writing one")
    p.add_argument("--host", default="127.0.0.1", help="--serve: interface (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="--serve: port (default: a free one)")
    p.add_argument("--max-chars", type=int, default=2000, help="longest input text accepted")
    p.add_argument("--member", type=int, default=1, help="ensemble runs: whose attention (1..M)")
    p.add_argument("--max-new-tokens", type=int, default=20, help="GPT: tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, help="GPT: 0 = greedy")
    p.add_argument("--seed", type=int, default=0, help="GPT: sampling seed")
    p.add_argument("--beam-size", type=int, default=None, help="translation: 1 = greedy")


def options(args: argparse.Namespace) -> dict:
    """The keyword arguments of :func:`attnlab.explore.page.explore_data` from the CLI."""
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port}: give a port from 1 to 65535 (0 picks a free one)")
    if args.max_chars < 1:
        raise UserError(f"--max-chars must be >= 1, got {args.max_chars}")
    return {
        "max_chars": args.max_chars,
        "member": args.member - 1,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
        "beam_size": args.beam_size,
    }


def run(args: argparse.Namespace) -> int:
    from attnlab.data.io import output_errors
    from attnlab.explore.page import explore_data, render_page
    from attnlab.explore.sources import load_source

    opts = options(args)
    if args.serve:
        if args.png or args.out:
            raise UserError("--serve shows the page live; leave out --out and --png")
        from attnlab.explore.server import serve

        serve(load_source(args.run), args.inputs, opts, args.host, args.port)
        return 0
    if args.view and not args.png:
        raise UserError("--view chooses the view of --png; give --png FILE too")
    source = load_source(args.run)
    data = explore_data(source, args.inputs, **opts)
    out = Path(args.out) if args.out else Path(args.run) / "explore.html"
    if not args.out and not Path(args.run).is_dir():  # e5, minilm: no run folder to write into
        out = Path(f"explore-{source.name}.html")
    with output_errors("--out"):
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_page(data), encoding="utf-8")
    size = out.stat().st_size
    print(f"page written to {out} ({size / 1024:.0f} KiB); open it in any browser")
    if args.png:
        from attnlab.explore.png import screenshot

        with output_errors("--png"):
            png = screenshot(out, args.png, args.view)
        print(f"screenshot written to {png}", file=sys.stderr)
    return 0
