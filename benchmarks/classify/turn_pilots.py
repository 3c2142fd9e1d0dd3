"""The pilot runs' composed turns and their post-hoc probe ensemble (classify_e5_pilots.md).

Three modes, each writing files the pilot runs read (no result page of its own: the runs are
`attnlab train classify` runs and the page logs them):

``score``    every qualifying clause (:func:`attnlab.data.turns.clause_pool`) of the first
             ``--train-examples`` training texts (split seed 0, sampled as the task samples) and
             its p(own label) under a logistic regression (L2 1e-3) on the frozen e5's mean-pooled
             features of those same texts -> a JSON list.
``compose``  a CSV (text, label) of the fast recipe's Pang & Lee sample (``--pang-lee`` texts,
             balanced, seed 0, as ``extra_train_examples`` draws them), ``--zh`` turns composed
             from the scored clauses at p >= ``--threshold`` and ``--en`` turns from Pang & Lee's
             own sentences; pass it as ``--extra-train FILE --extra-train-examples 0``.
``ensemble`` a run's p(positive) averaged with the frozen probe's (fitted on the fast recipe's
             3,000 reviews + 2,000 Pang & Lee sentences) at weights 0, .25, .5, .75, 1 on the OOD
             sets, their turned sentences and the tutorial's.

    python -m benchmarks.classify.turn_pilots score --out /tmp/pool.json
    python -m benchmarks.classify.turn_pilots compose --pool /tmp/pool.json --zh 1000 --out t.csv
    python -m benchmarks.classify.turn_pilots ensemble RUN
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    score = sub.add_parser("score", help="score the training sample's clauses")
    score.add_argument("--train-examples", type=int, default=3000)
    score.add_argument("--out", type=Path, required=True)
    compose = sub.add_parser("compose", help="write a CSV of Pang & Lee and composed turns")
    compose.add_argument("--pool", type=Path)
    compose.add_argument("--train-examples", type=int, default=3000)
    compose.add_argument("--zh", type=int, default=0)
    compose.add_argument("--en", type=int, default=0)
    compose.add_argument("--threshold", type=float, default=0.8)
    compose.add_argument("--pang-lee", type=int, default=2000)
    compose.add_argument("--seed", type=int, default=0)
    compose.add_argument("--out", type=Path, required=True)
    ensemble = sub.add_parser("ensemble", help="a run averaged with the frozen probe")
    ensemble.add_argument("dirs", nargs="+", type=Path)
    return p


def _train_split(n: int):
    """(corpus, split) with the training split sampled as `train classify --train-examples`."""
    from attnlab.data import load_chinese_reviews, stratified_split
    from attnlab.data.splits import stratified_sample

    corpus = load_chinese_reviews()
    split = stratified_split(corpus.labels, (0.8, 0.1, 0.1), 0)
    train = split["train"]
    split["train"] = [train[j] for j in stratified_sample([corpus.labels[i] for i in train], n, 0)]
    return corpus, split


def _probe(texts: list[str], labels: list[str]):
    """The frozen e5 and its probe (L2 1e-3) fitted on ``texts``."""
    import torch

    from attnlab.models.e5 import load_e5
    from benchmarks.classify.e5_recipes import _features, _logreg

    model, tokenizer = load_e5()
    model.eval()
    y = torch.tensor([int(label == "positive") for label in labels])
    head = _logreg(_features(model, tokenizer, texts), y, 1e-3)

    def p_positive(batch: list[str]) -> list[float]:
        with torch.no_grad():
            return torch.softmax(head(_features(model, tokenizer, batch)), -1)[:, 1].tolist()

    return p_positive


def score(args: argparse.Namespace) -> None:
    from attnlab.data.turns import clause_pool

    corpus, split = _train_split(args.train_examples)
    texts = [corpus.texts[i] for i in split["train"]]
    labels = [corpus.labels[i] for i in split["train"]]
    pool = clause_pool(texts, labels)
    p = _probe(texts, labels)([c.text for c in pool])
    rows = [
        {"text": c.text, "label": c.label, "source": c.source, "whole": c.whole,
         "p": round(pi if c.label == "positive" else 1 - pi, 4)}
        for c, pi in zip(pool, p)
    ]  # fmt: skip
    args.out.write_text(json.dumps(rows, ensure_ascii=False))
    print(f"{len(rows)} clauses scored -> {args.out}")


def compose(args: argparse.Namespace) -> None:
    from attnlab.data.english_sentiment import balanced_subsample, load_pang_lee
    from attnlab.data.sentiment import held_out_texts
    from attnlab.data.turns import Clause, clause_pool, compose_turns, select

    corpus, split = _train_split(args.train_examples)
    held = held_out_texts(corpus, split)
    rows: list[tuple[str, str]] = []
    if args.pang_lee:
        sample = balanced_subsample(load_pang_lee(), args.pang_lee, 0)
        rows += list(zip(sample.texts, sample.labels))
    if args.zh:
        scored = json.loads(args.pool.read_text())
        pool = [Clause(r["text"], r["label"], r["source"], r["whole"]) for r in scored]
        kept = select(pool, [r["p"] for r in scored], args.threshold)
        print("clauses kept:", dict(Counter(c.label for c in kept)))
        turns = compose_turns(kept, args.zh, args.seed, held_out=held)
        rows += list(zip(turns.texts, turns.labels))
    if args.en:
        english = load_pang_lee()
        pool = clause_pool(english.texts, english.labels, "en")
        turns = compose_turns(pool, args.en, args.seed, "en", held_out=held)
        rows += list(zip(turns.texts, turns.labels))
    with args.out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    print(f"{len(rows)} rows -> {args.out}")


def ensemble(args: argparse.Namespace) -> None:
    from attnlab.data.english_sentiment import balanced_subsample, load_pang_lee
    from attnlab.data.sentiment import TUTORIAL_EXAMPLES, load_ood
    from attnlab.infer.classifier import ClassifierRun

    corpus, split = _train_split(3000)
    english = balanced_subsample(load_pang_lee(), 2000, 0)
    texts = [corpus.texts[i] for i in split["train"]] + english.texts
    labels = [corpus.labels[i] for i in split["train"]] + english.labels
    probe = _probe(texts, labels)
    sets = {name: load_ood(name) for name in ("dev", "test")}
    tutorial = [t for t, _ in TUTORIAL_EXAMPLES]
    p_probe = {name: probe(c.texts) for name, (c, _) in sets.items()}
    p_probe["tutorial"] = probe(tutorial)
    for run_dir in args.dirs:
        run = ClassifierRun.load(run_dir)
        p_run = {name: [p["probs"]["positive"] for p in run.predict(c.texts)]
                 for name, (c, _) in sets.items()}  # fmt: skip
        p_run["tutorial"] = [p["probs"]["positive"] for p in run.predict(tutorial)]
        for w in (0.0, 0.25, 0.5, 0.75, 1.0):
            row: dict = {}
            for name, (c, tags) in sets.items():
                mixed = [w * a + (1 - w) * b for a, b in zip(p_probe[name], p_run[name])]
                hits = [(p >= 0.5) == (y == "positive") for p, y in zip(mixed, c.labels)]
                row[name] = round(sum(hits) / len(hits), 4)
                for key, want in (("contrast", "phenomenon"), ("film", "domain")):
                    sub = [h for h, t in zip(hits, tags) if t[want] == key]
                    row[f"{key}_{name}"] = round(sum(sub) / len(sub), 3)
            pairs = zip(p_probe["tutorial"], p_run["tutorial"])
            row["tutorial_p"] = [round(w * a + (1 - w) * b, 3) for a, b in pairs]
            print(run_dir, f"probe weight {w}", row)


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    {"score": score, "compose": compose, "ensemble": ensemble}[args.mode](args)


if __name__ == "__main__":
    main()
