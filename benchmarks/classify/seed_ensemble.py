"""The main job's runs of one recipe averaged: does a seed ensemble read what each seed misreads?

Reads finished runs of the same recipe trained with different seeds (``attnlab train classify
--seed S``, e.g. the main_job benchmark's), predicts the bundled out-of-domain dev and test sets
and the tutorial's three sentences with each run (``ClassifierRun.predict``), and scores each
run alone and the ensembles that average p(positive) over the first three runs and over all of
them. It then counts, for each set, how many of its texts every run misreads (an error no
average can undo), some runs misread, or none, and which way the average of all runs errs: the
positive texts it reads as negative and the negative ones it reads as positive, and how many of
each it reads with confidence (p(positive) below 0.2, or above 0.8): errors a shifted decision
threshold cannot undo. The runs were trained beforehand; nothing here
trains or chooses anything (OOD test is read, never chosen on).

    python -m benchmarks.classify.seed_ensemble RUN RUN RUN [RUN ...] [--stem NAME] [--title T]
        -> docs/results/main_job_ensemble.{json,md} (or STEM.{json,md})
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks import common

STEM = "main_job_ensemble"
TITLE = "The main job's seeds averaged: a seed ensemble"
PHENOMENON = "contrast"  # the OOD sets' turned (转折) sentences
CONFIDENT = 0.2  # p(positive) below this (or above 1 - this) is a confident reading


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="finished runs of one recipe, 2 or more")
    p.add_argument("--stem", default=STEM, help="the page's name under docs/results/")
    p.add_argument("--title", default=TITLE, help="the page's heading")
    return p


def p_positive(runs: Sequence[Path]) -> tuple[dict[str, dict], dict[str, list[list[float]]]]:
    """The sets ({name: texts, labels, tags}) and each run's p(positive) on each set's texts."""
    from attnlab.data.sentiment import TUTORIAL_EXAMPLES, load_ood
    from attnlab.infer.classifier import ClassifierRun

    sets = {}
    for name in ("dev", "test"):
        corpus, tags = load_ood(name)
        sets[f"OOD {name}"] = {"texts": corpus.texts, "labels": corpus.labels, "tags": tags}
    sets["tutorial"] = {
        "texts": [t for t, _ in TUTORIAL_EXAMPLES],
        "labels": [label for _, label in TUTORIAL_EXAMPLES],
        "tags": [{} for _ in TUTORIAL_EXAMPLES],
    }
    probs: dict[str, list[list[float]]] = {name: [] for name in sets}
    for i, run in enumerate(runs):
        print(f"run {i + 1}/{len(runs)}: {run}", file=sys.stderr, flush=True)
        clf = ClassifierRun.load(run)
        for name, s in sets.items():
            probs[name].append([p["probs"]["positive"] for p in clf.predict(s["texts"])])
    return sets, probs


def correct(s: dict, p: Sequence[float]) -> list[bool]:
    """Whether each text of the set is read right, reading p(positive) > 0.5."""
    return [(q > 0.5) == (label == "positive") for q, label in zip(p, s["labels"])]


def scores(s: dict, p: Sequence[float]) -> dict[str, float]:
    """Accuracy over the set and over its turned sentences."""
    right = correct(s, p)
    turned = [r for r, tag in zip(right, s["tags"]) if tag.get("phenomenon") == PHENOMENON]
    return {"accuracy": sum(right) / len(right),
            "turned": sum(turned) / len(turned) if turned else None}  # fmt: skip


def mean(rows: Sequence[Sequence[float]]) -> list[float]:
    return [sum(col) / len(col) for col in zip(*rows)]


def seed_of(run: Path) -> str:
    """The run's name on the page: its seed (train_config.json) and its folder."""
    seed = json.loads((run / "train_config.json").read_text())["seed"]
    return f"seed {seed} ({run.name})"


def measure(runs: Sequence[Path]) -> dict:
    sets, probs = p_positive(runs)
    members = {seed_of(run): {name: scores(sets[name], probs[name][i]) for name in sets}
               for i, run in enumerate(runs)}  # fmt: skip
    ensembles = {}
    for k in sorted({min(3, len(runs)), len(runs)}):
        ensembles[f"first {k}"] = {name: scores(sets[name], mean(probs[name][:k])) for name in sets}
    shared = {}
    for name, s in sets.items():
        wrong = [sum(not r for r in col) for col in zip(*(correct(s, q) for q in probs[name]))]
        shared[name] = {
            "n": len(wrong),
            "every_run": sum(w == len(runs) for w in wrong),
            "some_runs": sum(0 < w < len(runs) for w in wrong),
            "texts_every_run_misreads": [
                s["texts"][j] for j, w in enumerate(wrong) if w == len(runs)
            ],
        }
    ways = {name: directions(s, mean(probs[name])) for name, s in sets.items()}
    return {"runs": [str(r) for r in runs], "members": members, "ensembles": ensembles,
            "shared_errors": shared, "directions": ways}  # fmt: skip


def directions(s: dict, p: Sequence[float]) -> dict[str, int]:
    """The errors of one reading of the set by the true label, and the confident ones."""
    pos = [q for q, label in zip(p, s["labels"]) if label == "positive"]
    neg = [q for q, label in zip(p, s["labels"]) if label != "positive"]
    return {
        "positive": len(pos),
        "positive_read_negative": sum(q <= 0.5 for q in pos),
        "positive_confident": sum(q < CONFIDENT for q in pos),
        "negative": len(neg),
        "negative_read_positive": sum(q > 0.5 for q in neg),
        "negative_confident": sum(q > 1 - CONFIDENT for q in neg),
    }


def _cell(r: dict) -> str:
    turned = "-" if r["turned"] is None else f"{r['turned']:.2f}"
    return f"{r['accuracy']:.3f} / {turned}"


def page(res: dict, info: dict, title: str = TITLE) -> list[str]:
    names = list(next(iter(res["members"].values())))
    lines = [
        f"# {title}",
        "",
        common.machine_line(info),
        "",
        f"{len(res['runs'])} runs of one recipe with different seeds, each read alone and "
        "averaged (the mean of their p(positive), read at 0.5). Each cell: accuracy / accuracy "
        "on the set's turned (转折) sentences (38 in each OOD set); OOD dev and test n = 210 "
        "each, the tutorial's 3 sentences. Nothing was chosen on OOD test.",
        "",
        "| model | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for run, r in res["members"].items():
        lines.append(f"| {run} | " + " | ".join(_cell(r[n]) for n in names) + " |")
    for label, r in res["ensembles"].items():
        lines.append(
            f"| **mean of the {label}** | " + " | ".join(_cell(r[n]) for n in names) + " |"
        )
    lines += [
        "",
        "Errors by how many runs make them: a text every run misreads stays misread in any "
        "average of them.",
        "",
        "| set | n | misread by every run | by some runs |",
        "|---|---|---|---|",
    ]
    for name, r in res["shared_errors"].items():
        lines.append(f"| {name} | {r['n']} | {r['every_run']} | {r['some_runs']} |")
    lines += [
        "",
        f"Which way the mean of all {len(res['runs'])} runs errs: positive texts read as "
        f"negative, negative ones read as positive, and of each how many with p(positive) below "
        f"{CONFIDENT} (or above {1 - CONFIDENT:.1f}), which no shift of the 0.5 threshold within "
        "that band would undo.",
        "",
        "| set | positive read negative | of them p < "
        f"{CONFIDENT} | negative read positive | of them p > {1 - CONFIDENT:.1f} |",
        "|---|---|---|---|---|",
    ]
    for name, d in res["directions"].items():
        lines.append(
            f"| {name} | {d['positive_read_negative']} of {d['positive']} | "
            f"{d['positive_confident']} | {d['negative_read_positive']} of {d['negative']} | "
            f"{d['negative_confident']} |"
        )
    lines += ["", "Misread by every run:", ""]
    for name, r in res["shared_errors"].items():
        lines += [f"- {name}: " + ("; ".join(r["texts_every_run_misreads"]) or "none")]
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if len(args.runs) < 2:
        raise SystemExit("give two or more runs of one recipe")
    missing = [str(r) for r in args.runs if not (r / "results.json").is_file()]
    if missing:
        raise SystemExit(f"not a finished run (no results.json): {', '.join(missing)}")
    info = common.machine()
    res = measure(args.runs)
    common.write_results(args.stem, {"machine": info, **res}, page(res, info, args.title),
                         command=common.command_line(argv))  # fmt: skip


if __name__ == "__main__":
    main()
