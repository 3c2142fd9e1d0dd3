"""Where full fine-tuning should stop: the plan's ``blocks`` rule measured between the sizes
own_data.md covers (180-1,800 training texts) and the main job's 6,000.

The rule (src/attnlab/tasks/classify_plan.py): at most ``FULL_MAX`` training texts train every
block at one rate; more keep the preset's top 4 blocks at lr decay 0.6. Each dataset here
(benchmarks/classify/_own_data_sets.py, ``--train-size`` rows of which the command holds out a
tenth for validation, 1,000 rows held out for the test) lies between the sizes own_data.md
measured and the main job's. Two arms of the README's own-data command, ``attnlab train
classify --data train.csv --test-data test.csv --out DIR --seed S`` plus flags, in a process of
their own with one thread (own_data.py's ``run_arm``), three seeds each:

- ``top 4``: ``--train-layers 4``, the preset's recipe above ``FULL_MAX`` (lr and decay the
  preset's, the epochs its rule's);
- ``every block``: ``--train-layers 0 --lr 3e-5 --lr-decay 1``, the rule's values at most
  ``FULL_MAX`` texts (the epochs then follow the plan's rule for every block).

The datasets' labels are no sentiment pair (0/1, book genres), so the film sentences and the
turns are off in both arms: the two differ in the blocks that train, their rate and the epochs.

    python -m benchmarks.classify.blocks_threshold --datasets reviews_4500,bible_zh --seeds 0,1,2
    python -m benchmarks.classify.blocks_threshold --render
    python -m benchmarks.classify.blocks_threshold --out /work/runs/blocks_threshold_6000 \
        --datasets reviews_6000,bible_zh --train-size 6000 --stem blocks_threshold_6000
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from statistics import mean, stdev

from benchmarks import common
from benchmarks.classify import _own_data_sets as sets
from benchmarks.classify.own_data import attnlab_run_dir, read_rows, run_arm

ARMS = {"top 4": "--train-layers 4", "every block": "--train-layers 0 --lr 3e-5 --lr-decay 1"}
DEFAULT_OUT = Path("/work/runs/blocks_threshold")
STEM = "blocks_threshold"
# the first page's top-4 rows ran before the rule's cut-off moved
EARLIER = ("The `top 4` rows of commits 028e6b8-83966db ran the plain command while the "
           "rule's cut-off was 3,000, which took the top 4 at this size with the same values. ")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="data, runs and results.jsonl")
    p.add_argument("--datasets", default="reviews_4500,bible_zh", help="comma-separated; "
                   "reviews_N is the bundled reviews labelled 0/1")  # fmt: skip
    p.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds")
    p.add_argument("--train-size", type=int, default=4500, help="training rows")
    p.add_argument("--test-size", type=int, default=1000, help="held-out rows")
    p.add_argument("--split-seed", type=int, default=0, help="seed of every dataset's split")
    p.add_argument("--render", action="store_true", help="only render the page")
    p.add_argument("--stem", default=STEM, help="the page's name under docs/results/ (another "
                   "size: another --out and another page)")  # fmt: skip
    return p


def measure(args: argparse.Namespace) -> None:
    lines = args.out / "results.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "commands.txt").open("a", encoding="utf-8") as f:
        f.write(common.command_line() + "\n")
    for name in args.datasets.split(","):
        record = sets.build(
            name, args.out / "data" / name, args.train_size, args.test_size, args.split_seed
        )
        print(f"{name}: {record['train_rows']} train, {record['test_rows']} test", flush=True)
        for seed in [int(s) for s in args.seeds.split(",")]:
            for arm, flags in ARMS.items():
                done = {(r["dataset"], r["arm_name"], r["seed"]) for r in read_rows(lines)
                        if "error" not in r}  # fmt: skip
                if (name, arm, seed) in done:
                    continue
                print(f"  {arm} seed {seed} ...", flush=True)
                ns = argparse.Namespace(out=args.out, attnlab_flags=flags)
                row = run_arm("attnlab", name, seed, ns, Path()) | {"arm_name": arm}
                if "error" not in row:
                    row |= plan_of(attnlab_run_dir(args.out, name, seed, flags))
                with lines.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
                result = row.get("error") or f"acc {row['accuracy']:.3f} F1 {row['macro_f1']:.3f}"
                print(f"  {arm} seed {seed}: {result}, {row['wall_s'] / 60:.1f} min", flush=True)


def plan_of(run: Path) -> dict:
    """The run's training texts and epochs, as its plan decided them (data_report.json)."""
    plan = json.loads((run / "data_report.json").read_text(encoding="utf-8"))["plan"]
    epochs = next(s["value"] for s in plan["steps"] if s["step"] == "epochs")
    blocks = next(s["value"] for s in plan["steps"] if s["step"] == "blocks")
    return {"n_train": plan["n_train"], "epochs": epochs, "blocks": blocks}


def _spread(values: list[float], digits: int = 3) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{mean(values):.{digits}f} ± {stdev(values):.{digits}f}"


def render(args: argparse.Namespace) -> str:
    rows = [r for r in read_rows(args.out / "results.jsonl") if "error" not in r]
    grouped: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        grouped[row["dataset"]][row["arm_name"]].append(row)
    from attnlab.tasks.classify_plan import FULL_MAX

    lines = [
        "# Where full fine-tuning should stop: the plan's blocks rule between 1,800 and 6,000 "
        "texts",
        "",
        common.machine_line(common.machine(threads=1)),
        "",
        f"The rule now: at most {FULL_MAX} training texts train every block at lr 3e-5 (one "
        "rate); more keep the top 4 blocks at lr decay 0.6. `top 4` is the preset's recipe "
        "(`--train-layers 4`); `every block` is `--train-layers 0 --lr 3e-5 --lr-decay 1`, the "
        "rule's values for a file it fine-tunes whole (the epochs follow the plan's rule for "
        "every block). " + (EARLIER if args.stem == STEM else "") + "One thread per run, each "
        "in a process of its own; one other single-threaded job shared the two cores, so "
        "compare wall times as ratios within a dataset. ± is the "
        "standard deviation over seeds (the training seed; the split is fixed).",
        "",
        "| dataset | training texts | arm | blocks | epochs | seeds | accuracy | macro-F1 | "
        "wall min | CPU min | peak GiB | commit |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    verdicts = []
    for name, arms in grouped.items():
        for arm in ARMS:
            rs = arms.get(arm, [])
            if not rs:
                continue
            lines.append(
                f"| {name} | {rs[0]['n_train']} | {arm} | {rs[0]['blocks']} | "
                f"{', '.join(sorted({str(r['epochs']) for r in rs}))} | {len(rs)} | "
                f"{_spread([r['accuracy'] for r in rs])} | "
                f"{_spread([r['macro_f1'] for r in rs])} | "
                f"{_spread([r['wall_s'] / 60 for r in rs], 1)} | "
                f"{_spread([r['cpu_s'] / 60 for r in rs], 1)} | "
                f"{max(r['peak_rss_gib'] for r in rs):.2f} | "
                f"{', '.join(sorted({r['commit'] for r in rs}))} |"
            )
        a, b = arms.get("top 4", []), arms.get("every block", [])
        if a and b:
            gap = mean(r["accuracy"] for r in b) - mean(r["accuracy"] for r in a)
            spread = max(stdev([r["accuracy"] for r in rs]) if len(rs) > 1 else 0.0
                         for rs in (a, b))  # fmt: skip
            side = "above" if gap > spread else "below" if gap < -spread else "within the spread of"
            verdicts.append(f"- {name}: every block reads {gap:+.3f} against the top 4 "
                            f"(spread {spread:.3f}): {side} it")  # fmt: skip
    return "\n".join([*lines, "", *verdicts]) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if not args.render:
        measure(args)
    page = render(args)
    rows = read_rows(args.out / "results.jsonl")
    measured = args.out / "commands.txt"  # the commands that measured the rows, not a --render
    lines = measured.read_text(encoding="utf-8").splitlines() if measured.is_file() else []
    command = " && ".join(dict.fromkeys(lines)) or None
    common.write_results(args.stem, {"rows": rows}, page, command or common.command_line(argv))
    print(page)


if __name__ == "__main__":
    main()
