"""``attnlab verify``: rerun every parity check against its oracle, print the table.

Wired into the CLI as ``"verify": (command.add_parser, command.run)``. Exit status 0 when every
chosen check ran and passed, 1 when any failed or crashed. A check whose oracle is not installed
proves nothing, so it is no pass: the command refuses before running anything, in one line
naming what to install (exit 2), unless ``--skip-missing`` asks for only the checks that can
run (the others are listed as skipped, with their install command); with none left to run it
refuses all the same.
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.errors import UserError

if TYPE_CHECKING:  # torch and the checks load only when verify runs (`attnlab --help` stays fast)
    from attnlab.verify.check import Row


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="rerun every parity check against PyTorch / Hugging Face oracles; print the table",
        description="Runs each of attnlab's parity checks (attention, layers, stacks, LLaMA, T5, "
        "GPT-2, ViT, BERT, MiniLM, Mamba, RWKV, Mixtral MoE) on fresh random configurations from "
        "one seed and prints: component, oracle, cases, max abs error, tolerance, pass. Exits 1 if "
        "any check fails, and 2 (naming what to install) if a chosen check's oracle is not "
        "installed: a check that cannot run is no pass. --skip-missing runs the others.",
    )
    p.add_argument("--seed", type=int, default=None, help="seed (default: a fresh one, printed)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the table as JSON")
    p.add_argument(
        "--only",
        default="",
        help="comma-separated words; run the checks whose component or oracle contains one",
    )
    p.add_argument("--num-threads", type=int, default=1, help="torch threads; 0 = default")
    p.add_argument("--list", action="store_true", help="list the checks and their oracles")
    p.add_argument(
        "--skip-missing",
        action="store_true",
        help="run only the checks whose oracles are installed; the others are listed as "
        "skipped (without it, a missing oracle stops the command before any check runs)",
    )


def select(only: str) -> list:
    from attnlab.verify.registry import CHECKS

    words = [w.strip().lower() for w in only.split(",") if w.strip()]
    if not words:
        return list(CHECKS)
    chosen = [
        c for c in CHECKS if any(w in c.component.lower() or w in c.oracle.lower() for w in words)
    ]
    if not chosen:
        names = ", ".join(c.component for c in CHECKS)
        raise UserError(f"--only {only!r} matches no check; the checks are: {names}")
    return chosen


def run(args: argparse.Namespace) -> int:
    import torch

    from attnlab.train.config import check_num_threads
    from attnlab.verify.check import failed, format_table, missing_oracles, run_checks, write_json

    checks = select(args.only)
    if args.json:
        _check_json_target(Path(args.json))  # before minutes of checks, not after
    if args.list:
        for c in checks:
            lacking = ", ".join(o.name for o in missing_oracles(c))
            line = f"{c.component:36s} {c.oracle:32s} tolerance {c.tolerance:.0e}"
            print(line + (f"  (not installed: {lacking})" if lacking else ""))
        return 0
    check_runnable(checks, args.skip_missing)
    check_num_threads(args.num_threads)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    seed = secrets.randbits(31) if args.seed is None else args.seed
    print(f"attnlab verify: seed {seed} (replay with --seed {seed}), {len(checks)} checks")
    start = time.perf_counter()
    rows = run_checks(checks, seed, progress=_progress(len(checks)))
    wall = time.perf_counter() - start
    print()
    print(format_table(rows))
    print(summary(rows, wall, seed))
    if args.json:
        from attnlab.data.io import output_errors

        with output_errors("--json"):
            write_json(rows, args.json, meta(seed, wall))
        print(f"table written to {args.json}")
    return 1 if failed(rows) else 0


def check_runnable(checks: list, skip_missing: bool) -> None:
    """Refuse checks that cannot run, naming what to install: a parity that was never measured
    is not a pass. ``skip_missing`` accepts them (listed as skipped) while any other can run."""
    from attnlab.verify.check import missing_oracles

    lacking = [o for c in checks for o in missing_oracles(c)]
    if not lacking:
        return
    blocked = sum(bool(missing_oracles(c)) for c in checks)
    ready = len(checks) - blocked
    if skip_missing and ready:
        return
    names = ", ".join(sorted({o.name for o in lacking}))
    install = "; ".join(sorted({o.install for o in lacking}))
    if ready:
        what = f"{blocked} of the {len(checks)} checks cannot run"
        rest = f", or pass --skip-missing to run the other {ready}"
    else:
        what = (
            "the check cannot run"
            if len(checks) == 1
            else f"none of the {len(checks)} checks can run"
        )
        rest = ""
    raise UserError(f"{what}: {names} not installed; {install}{rest}")


def _check_json_target(path: Path) -> None:
    """Refuse a --json path that cannot become a file: a folder, or one in no folder."""
    from attnlab.data.io import check_file_target

    check_file_target(path, "--json")
    if not path.parent.is_dir():
        raise UserError(f"--json {path}: there is no folder {path.parent}; create it first")


def _progress(total: int):
    done = [0]

    def show(row: Row) -> None:
        done[0] += 1
        print(f"  [{done[0]}/{total}] {row.component}: {row.status}", file=sys.stderr, flush=True)

    return show


def summary(rows: list[Row], wall: float, seed: int) -> str:
    from attnlab.verify.check import MISSING, PASS

    n_pass = sum(r.status == PASS for r in rows)
    missing = [r for r in rows if r.status == MISSING]
    bad = [r for r in rows if r.status not in (PASS, MISSING)]
    lines = [f"{n_pass}/{len(rows)} passed in {wall:.0f} s (seed {seed})"]
    if missing:
        lines.append(f"{len(missing)} skipped, oracle not installed:")
        hints = sorted({n for r in missing for n in r.note.split("; ")})
        lines += [f"  {h}" for h in hints]
    if bad:
        lines.append("FAILED: " + ", ".join(r.component for r in bad))
    return "\n".join(lines)


def meta(seed: int, wall: float) -> dict:
    import torch

    try:
        import transformers

        tf_version = transformers.__version__
    except ImportError:
        tf_version = None
    return {
        "seed": seed,
        "wall_s": round(wall, 2),
        "torch": torch.__version__,
        "transformers": tf_version,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
