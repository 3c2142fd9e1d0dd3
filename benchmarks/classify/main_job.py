"""The main job end to end: what `attnlab train classify` costs and scores, run after run.

``run`` trains one run of the README's command in a child process — `python -m attnlab train
classify --out OUT --seed S` plus any settings after ``--`` — and records beside the run
(OUT/cost.json) the command's whole wall and CPU time (loading, the frozen pass, training, the
final evaluations), the child's peak resident memory, the machine (CPU, whether it has bf16 matrix
units, threads) and its load before and after. ``report`` reads such runs and writes
docs/results/main_job.md (and .json; ``--stem`` names another page): per run its cost,
precision, the checkpoint kept, in-domain and out-of-domain accuracy, the turned (转折)
sentences and the tutorial's three sentences; then the mean and range over the runs of each
recipe.

    python -m benchmarks.classify.main_job run --out /tmp/mj/s0 --seed 0
    python -m benchmarks.classify.main_job run --out /tmp/mj/fp32 --seed 0 -- --precision fp32
    python -m benchmarks.classify.main_job report /tmp/mj/s0 /tmp/mj/s1 /tmp/mj/s2 --name default
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common

STEM = "main_job"
TITLE = "The main job end to end: cost and scores"
TUTORIAL_THIRD = "电影前半段很无聊，但是结局让我感动"
# an in-domain text whose last clause opens with a turn word ("…，不过总体还可以"): where a
# verdict followed by a concession and a turn that decides read alike
TURN_FINAL = re.compile(r"[，,。！!；;]\s*(?:但是|但|不过|可是|只是|就是|然而|可惜)"
                        r"[^，,。！!；;]*$")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    run = sub.add_parser("run", help="train one run of the main job and record its cost")
    run.add_argument("--out", type=Path, required=True, help="the new run folder")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("settings", nargs=argparse.REMAINDER, help="-- then more train options")
    report = sub.add_parser("report", help="the page of finished runs")
    report.add_argument("dirs", nargs="+", type=Path)
    report.add_argument(
        "--name", action="append", default=[], help="the recipe of each run, in order (runs "
        "of one name are summarised together); default: the folder's name",
    )  # fmt: skip
    report.add_argument("--note", action="append", default=[],
                        help="a paragraph for the page, after the tables")  # fmt: skip
    report.add_argument("--stem", default=STEM, help="the page's name under docs/results/")
    report.add_argument("--title", default=TITLE, help="the page's heading")
    return p


def bf16_units() -> bool:
    """Whether this CPU has bf16 matrix units (AMX) or bf16 vector instructions (the flags
    Linux reports)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def run(args: argparse.Namespace) -> None:
    settings = [s for s in args.settings if s != "--"]
    command = [sys.executable, "-m", "attnlab", "train", "classify", "--out", str(args.out),
               "--seed", str(args.seed), *settings]  # fmt: skip
    info = common.machine(bf16_units=bf16_units())
    began = time.perf_counter()
    done = subprocess.run(command, check=False)
    wall = time.perf_counter() - began
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak_kib = usage.ru_maxrss  # Linux: KiB
    if done.returncode != 0:
        raise SystemExit(f"the run failed (exit {done.returncode}); nothing recorded")
    threads = json.loads((args.out / "config.json").read_text())["train"]["num_threads"]
    info["torch_threads"] = threads or os.cpu_count()  # 0: torch's default, a thread a core
    record = {
        "command": "attnlab train classify " + " ".join(command[5:]),
        "seed": args.seed,
        "wall_s": round(wall, 1),
        # CPU time (user + system) compares runs that shared the machine
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_gib": round(peak_kib / 2**20, 3),
        "machine": {**info, "load_average_at_end": common.load_average()},
    }
    (args.out / "cost.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"{args.out}: {wall / 60:.1f} min, peak {peak_kib / 2**20:.2f} GiB")


def turn_final(run_dir: Path, run) -> dict[str, dict[str, float]]:
    """Accuracy on the in-domain validation and test texts whose last clause opens with a turn
    word (``TURN_FINAL``), and how many there are."""
    from attnlab.data.sentiment import read_corpus
    from attnlab.data.splits import load_split

    config = json.loads((run_dir / "config.json").read_text())["data"]
    corpus = read_corpus(config["data"], config["text_col"], config["label_col"])
    split = load_split(run_dir / "split.json", corpus.texts)
    out = {}
    for name in ("val", "test"):
        ids = [i for i in split[name] if TURN_FINAL.search(corpus.texts[i].rstrip("。！!~ ."))]
        preds = run.predict([corpus.texts[i] for i in ids])
        right = sum(p["label"] == corpus.labels[i] for p, i in zip(preds, ids))
        out[name] = {"n": len(ids), "accuracy": round(right / max(len(ids), 1), 4)}
    return out


def scores(run_dir: Path) -> dict:
    """What a finished run scored: test, OOD, the turned OOD sentences, the tutorial's."""
    from attnlab.data.sentiment import TUTORIAL_EXAMPLES
    from attnlab.infer.classifier import ClassifierRun

    results = json.loads((run_dir / "results.json").read_text())
    summary = results["summary"]
    ood = results.get("ood") or {}
    data_report = json.loads((run_dir / "data_report.json").read_text())
    frozen = data_report.get("frozen_states") or {}
    turned = {
        name: report["accuracy_by"]["phenomenon"].get("contrast", {}).get("accuracy")
        for name, report in ood.items()
    }
    run = ClassifierRun.load(run_dir)
    preds = run.predict([t for t, _ in TUTORIAL_EXAMPLES])
    right = sum(p["label"] == want for p, (_, want) in zip(preds, TUTORIAL_EXAMPLES))
    return {
        "val": results["val"]["accuracy"],
        "test": results["test"]["accuracy"],
        "ood_dev": ood.get("dev", {}).get("accuracy"),
        "ood_test": ood.get("test", {}).get("accuracy"),
        "turned_dev": turned.get("dev"),
        "turned_test": turned.get("test"),
        "tutorial_right": right,
        "tutorial_p_positive": [round(p["probs"]["positive"], 3) for p in preds],
        "precision": summary["precision"],
        "training_s": round(summary["wall_time_s"], 1),
        "checkpoint": f"{summary['monitor']}, step {summary['best_step']} of {summary['steps']}",
        "frozen_pass_s": frozen.get("seconds"),
        "turn_final": turn_final(run_dir, run),
    }


def report(args: argparse.Namespace) -> None:
    names = args.name + [d.name for d in args.dirs[len(args.name) :]]
    rows = []
    for name, run_dir in zip(names, args.dirs):
        cost = json.loads((run_dir / "cost.json").read_text())
        rows.append({"name": name, "run": str(run_dir), **cost, **scores(run_dir)})
    data = {"title": args.title, "runs": rows, "notes": args.note}
    common.write_results(args.stem, data, render(data), common.command_line())


def _mean_range(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f}"


def _cpu_mean(rows: list[dict]) -> str:
    cpu = [r["cpu_s"] for r in rows if r.get("cpu_s") is not None]
    return _minutes(statistics.fmean(cpu)) if cpu else "-"


def render(data: dict) -> list[str]:
    rows = data["runs"]
    first = rows[0]["machine"]
    lines = [
        f"# {data['title']}",
        "",
        common.machine_line(first),
        "",
        "Each run is the README's `attnlab train classify` with the options shown, in a child "
        "process: wall time is the whole command (loading, the frozen pass, training, the "
        "final evaluations), CPU time its user + system time (the fair measure when runs "
        "shared the machine), the frozen pass and training (the loop, with its evaluations) "
        "as the run reports them, peak memory the child's resident peak. In-domain test n = 1,736, "
        "OOD dev / test n = 210 each, turned (转折) OOD sentences 38 + 38; turn-final: the "
        "in-domain validation and test texts whose last clause opens with a turn word (但是, "
        "不过, 只是 …: the script's TURN_FINAL), where a verdict then a concession and a turn "
        "that decides read alike; third: p(positive) "
        f"of {TUTORIAL_THIRD}. Validation (in domain, n = 1,736) and OOD dev are the sets a "
        "choice may read; test, OOD test and the tutorial's sentences are read, never chosen on.",
        "",
        "| recipe | seed | precision | threads | bf16 units | load at start | wall min | CPU min "
        "| frozen pass s | training min | peak GiB "
        "| checkpoint kept by | val | test | OOD dev / test | 转折 dev / test "
        "| turn-final val / test | tutorial | third |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m, tf = r["machine"], r["turn_final"]
        lines.append(
            f"| {r['name']} | {r['seed']} | {r['precision']} | {m['torch_threads']} | "
            f"{'yes' if m.get('bf16_units') else 'no'} | {m['load_average_at_start'][0]:.1f} | "
            f"{r['wall_s'] / 60:.1f} | {_minutes(r.get('cpu_s'))} | "
            f"{r.get('frozen_pass_s') or '-'} | "
            f"{r['training_s'] / 60:.1f} | {r['peak_rss_gib']:.2f} | {r.get('checkpoint', '')} | "
            f"{r['val']:.3f} | {r['test']:.3f} | "
            f"{r['ood_dev']:.3f} / {r['ood_test']:.3f} | "
            f"{r['turned_dev']:.2f} / {r['turned_test']:.2f} | "
            f"{tf['val']['accuracy']:.3f} / {tf['test']['accuracy']:.3f} | "
            f"{r['tutorial_right']} of 3 | "
            f"{r['tutorial_p_positive'][2]:.2f} |"
        )
    lines += [
        "",
        "Per recipe: mean (min–max) over its runs.",
        "",
        "| recipe | runs | val | test | OOD dev | OOD test | 转折 dev | 转折 test "
        "| turn-final val | turn-final test "
        "| third, each run | wall min, largest | CPU min, mean | peak GiB, largest |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(r["name"] for r in rows):
        rs = [r for r in rows if r["name"] == name]
        cells = [_mean_range([r[k] for r in rs]) for k in
                 ("val", "test", "ood_dev", "ood_test", "turned_dev", "turned_test")]  # fmt: skip
        cells += [_mean_range([r["turn_final"][k]["accuracy"] for r in rs])
                  for k in ("val", "test")]  # fmt: skip
        third = ", ".join(f"{r['tutorial_p_positive'][2]:.2f}" for r in rs)
        lines.append(
            f"| {name} | {len(rs)} | " + " | ".join(cells) + f" | {third} | "
            f"{max(r['wall_s'] for r in rs) / 60:.1f} | {_cpu_mean(rs)} | "
            f"{max(r['peak_rss_gib'] for r in rs):.2f} |"
        )
    for note in data.get("notes", []):
        lines += ["", note]
    lines += ["", "Commands:", ""] + [f"- {r['name']}, seed {r['seed']}: `{r['command']}`"
                                      for r in rows]  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.mode == "run":
        run(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
