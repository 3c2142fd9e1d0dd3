"""``attnlab ablate classify``: train variants of a preset on one split and budget, compare them.

It varies the main job's own recipe by default (``--arch e5``, presets/classify.toml: the
learning rate, the blocks that train, the probe, the extra data, ...); ``--arch char`` varies
the character model's.

By default each factor is varied on its own around the preset (one factor at a time); with
``--grid`` the full product is trained. Every variant gets the same data split, the same seeds
and the same training budget. A sweep directory holds one run directory per (variant, seed),
``results.csv`` (one row per run), ``results.md`` (mean ± std per variant) and ``results.png``.
Running the same command again skips finished runs and resumes a half-finished one.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from attnlab.configs import parse_key_values
from attnlab.errors import UserError
from attnlab.runs import sections, training
from attnlab.runs.registry import get_task

COLUMNS = (
    "variant",
    "factor",
    "value",
    "seed",
    "val_acc",
    "test_acc",
    "test_macro_f1",
    "ood_dev_acc",
    "ood_test_acc",
    "n_params",
    "steps",
    "wall_time_s",
    "stop_reason",
)


def parse_factors(items: list[str], arch: str) -> dict[str, list[str]]:
    """["lr=1e-5,3e-5", "pooling=mean,cls"] -> {"lr": ["1e-5", "3e-5"], ...}."""
    factors: dict[str, list[str]] = {}
    task = get_task("classify")
    owner = sections.field_owner(task.arch_sections(training.check_arch(task, arch)))
    for key, value in parse_key_values(items).items():
        if key == "arch":
            raise UserError("cannot vary arch: each architecture has its own recipe; sweep one "
                            "--arch at a time")  # fmt: skip
        if key not in owner:
            raise UserError(
                f"cannot vary {key!r}: not a setting of classify --arch {arch} "
                "(`attnlab train classify --arch ARCH --help` lists them)"
            )
        values = [v.strip() for v in value.split(",") if v.strip()]
        if not values:
            raise UserError(f"factor {key!r} has no values; write e.g. {key}=1,2")
        factors[key] = values
    return factors


def variants(
    factors: dict[str, list[str]], base: dict[str, Any], grid: bool
) -> list[tuple[str, str, str, dict[str, str]]]:
    """(name, factor, value, overrides) for each variant; the preset itself comes first."""
    if grid:
        out = []
        keys = list(factors)
        for combo in itertools.product(*(factors[k] for k in keys)):
            overrides = dict(zip(keys, combo))
            name = "-".join(f"{k}={v}" for k, v in overrides.items())
            out.append((name, "grid", name, overrides))
        return out
    out = [("preset", "preset", "", {})]
    for key, values in factors.items():
        for value in values:
            if str(base.get(key)) == str(value):
                continue  # this value is the preset itself
            out.append((f"{key}={value}", key, value, {key: value}))
    return out


def _flat_preset(config: str | None, fixed: dict[str, str], arch: str) -> dict[str, Any]:
    cfg = training.build_config("classify", config, {**fixed, "arch": arch})
    flat: dict[str, Any] = {}
    for part in cfg.sections.values():
        flat.update(vars(part))
    return flat


BUDGET = {"max_steps": "--steps", "epochs": "--epochs", "max_minutes": "--minutes"}


def fixed_settings(args: argparse.Namespace) -> dict[str, str]:
    """The settings every variant shares: --set, and the budget --steps, --epochs, --minutes
    give (each field said once: nothing is dropped without a word)."""
    if args.seeds < 1:
        raise UserError(f"--seeds must be >= 1 (seeds per variant), got {args.seeds}")
    if args.steps and args.epochs:
        raise UserError(
            f"--epochs {args.epochs} would be ignored: --steps {args.steps} sets the budget; "
            "give one of them"
        )
    fixed = parse_key_values(args.set)
    for key, flag in BUDGET.items():
        value = getattr(args, flag[2:])
        if not value:
            continue
        if key in fixed:
            raise UserError(
                f"{key} is given twice, as {flag} {value} and as --set {key}={fixed[key]}; keep one"
            )
        fixed[key] = str(value)
    return fixed


def check_sweep_folder(out: Path, same: dict[str, Any]) -> None:
    """Refuse an --out that is a file, someone else's folder, or a sweep of other settings
    (its finished runs would be reported as if this command had trained them)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder for the sweep")
    if not out.is_dir() or not any(out.iterdir()):
        return
    recorded = out / "sweep.json"
    if not recorded.is_file():
        raise UserError(f"--out {out} holds files but no sweep (sweep.json); give a new folder")
    try:
        raw = json.loads(recorded.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{recorded} is unreadable ({err}); give a new --out") from None
    raw = raw if isinstance(raw, dict) else {}
    for key, value in same.items():
        theirs = raw.get(key)
        if theirs == value:
            continue
        if isinstance(theirs, dict) and isinstance(value, dict):  # name only what differs
            names = sorted(k for k in {*theirs, *value} if theirs.get(k) != value.get(k))
            theirs = ", ".join(f"{k}={theirs.get(k)}" for k in names)
            value = ", ".join(f"{k}={value.get(k)}" for k in names)
        raise UserError(
            f"--out {out} holds a sweep with {key} {theirs}, this command has {value}: its "
            "finished runs would not be this command's; give a new --out, or the sweep's own "
            "settings to continue it"
        )


def run_sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Train every (variant, seed) not yet finished, then write the tables and the plot.

    The same folder continues a sweep of the same fixed settings, preset and --grid: finished
    runs are kept, new variants or seeds are trained."""
    out = Path(args.out)
    fixed = fixed_settings(args)
    factors = parse_factors(args.factors, args.arch)
    plan = variants(factors, _flat_preset(args.config, fixed, args.arch), args.grid)
    seeds = list(range(args.seeds))
    check_sweep_folder(
        out, {"fixed": fixed, "config": args.config, "grid": args.grid, "arch": args.arch}
    )
    out.mkdir(parents=True, exist_ok=True)  # after the checks: a refused sweep leaves nothing
    (out / "sweep.json").write_text(
        json.dumps(
            {
                "factors": factors,
                "grid": args.grid,
                "seeds": seeds,
                "fixed": fixed,
                "config": args.config,
                "arch": args.arch,
                "variants": [p[0] for p in plan],
            },
            indent=2,
        )
        + "\n"
    )
    rows: list[dict[str, Any]] = []
    total = len(plan) * len(seeds)
    started = time.perf_counter()
    for k, ((name, factor, value, overrides), seed) in enumerate(
        itertools.product(plan, seeds), start=1
    ):
        run_dir = out / f"{name}-seed{seed}"
        if (run_dir / "results.json").exists():
            print(f"[{k}/{total}] {name} seed {seed}: done already", file=sys.stderr)
        else:
            print(
                f"[{k}/{total}] {name} seed {seed}: training "
                f"({(time.perf_counter() - started) / 60:.1f} min into the sweep)",
                file=sys.stderr,
            )
            settings = {**fixed, **overrides, "seed": str(seed), "tensorboard": "false",
                        "arch": args.arch}  # fmt: skip
            training.train(
                "classify",
                run_dir,
                settings,
                args.config,
                resume=(run_dir / "config.json").exists(),
            )
        rows.append(_row(run_dir, name, factor, value, seed))
        write_tables(out, rows)
    print(f"sweep written to {out}/results.md, results.csv, results.png", file=sys.stderr)
    return rows


def _row(run_dir: Path, name: str, factor: str, value: str, seed: int) -> dict[str, Any]:
    results = json.loads((run_dir / "results.json").read_text())
    test, summary, ood = results.get("test"), results["summary"], results.get("ood") or {}
    return {
        "variant": name,
        "factor": factor,
        "value": value,
        "seed": seed,
        "val_acc": results["val"]["accuracy"],
        "test_acc": test["accuracy"] if test else float("nan"),
        "test_macro_f1": test["macro_f1"] if test else float("nan"),
        "ood_dev_acc": ood["dev"]["accuracy"] if "dev" in ood else float("nan"),
        "ood_test_acc": ood["test"]["accuracy"] if "test" in ood else float("nan"),
        "n_params": results["n_params"],
        "steps": summary["steps"],
        "wall_time_s": round(summary["wall_time_s"], 1),
        "stop_reason": summary["stop_reason"],
    }


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per variant: mean and std over seeds of the metrics."""
    by_variant: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_variant.setdefault(row["variant"], []).append(row)
    summary = []
    for name, group in by_variant.items():
        entry: dict[str, Any] = {
            "variant": name,
            "factor": group[0]["factor"],
            "value": group[0]["value"],
            "seeds": len(group),
            "n_params": group[0]["n_params"],
        }
        for key in ("val_acc", "test_acc", "test_macro_f1", "ood_dev_acc", "ood_test_acc",
                    "wall_time_s"):  # fmt: skip
            entry[key] = _mean_std([float(r[key]) for r in group])
        summary.append(entry)
    return summary


def write_tables(out: Path, rows: list[dict[str, Any]]) -> None:
    """results.csv (every run), results.md (per variant, mean ± std) and results.png."""
    with open(out / "results.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    summary = summarise(rows)
    metrics = ("val_acc", "test_acc", "test_macro_f1", "ood_dev_acc", "ood_test_acc")
    lines = [
        "| variant | seeds | params | val acc | test acc | test macro-F1 | OOD dev | OOD test "
        "| train time (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in summary:
        lines.append(
            f"| {e['variant']} | {e['seeds']} | {e['n_params'] / 1e3:.0f}k | "
            + " | ".join(f"{e[k][0]:.4f} ± {e[k][1]:.4f}" for k in metrics)
            + f" | {e['wall_time_s'][0]:.0f} |"
        )
    (out / "results.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    plot_summary(summary, out / "results.png")


def plot_summary(summary: list[dict[str, Any]], path: Path) -> None:
    """Validation and test accuracy per variant with ±1 std error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [e["variant"] for e in summary]
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(names) + 2), 4))
    for offset, key, color in ((-0.2, "val_acc", "tab:blue"), (0.2, "test_acc", "tab:orange")):
        ax.bar(
            [i + offset for i in x],
            [e[key][0] for e in summary],
            width=0.4,
            yerr=[e[key][1] for e in summary],
            color=color,
            label=key.replace("_", " "),
        )
    lows = [min(e["val_acc"][0], e["test_acc"][0]) for e in summary]
    ax.set_ylim(max(0.0, min(lows) - 0.05), min(1.0, max(e["val_acc"][0] for e in summary) + 0.03))
    ax.set_xticks(list(x))
    ax.set_xticklabels(names, rotation=45, ha="right")
    ax.set_ylabel("accuracy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
