"""Classical baselines on the bundled Chinese review corpus, for the Transformer classifier to beat.

Uses the same corpus cleaning and the same split (`stratified_split(labels, (0.8, 0.1, 0.1),
seed=0)`) as the Transformer classifier. Methods:

- majority: always predict the most frequent training label;
- tfidf_lr: character 1-3-gram TF-IDF + logistic regression, C chosen on validation macro-F1 only;
- snownlp_bayes: snownlp's own word-level naive Bayes, retrained from scratch on our training split
  (its shipped model was trained on these very files, so it is never used).

Run: python -m benchmarks.classify.baselines  (writes docs/results/classify_baselines.{md,json})
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import importlib.metadata
import importlib.util
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score

from attnlab.data import load_chinese_reviews, stratified_split
from attnlab.data.io import atomic_write_text, write_json
from attnlab.data.splits import corpus_fingerprint
from benchmarks import common

C_GRID = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
SPLIT_RATIOS = (0.8, 0.1, 0.1)
SPLIT_SEED = 0

Texts = Sequence[str]
Labels = Sequence[str]


def log(message: str) -> None:
    """Progress line on stdout."""
    print(message, flush=True)


def scores(gold: Labels, predicted: Labels) -> dict[str, float]:
    """Accuracy and macro-F1."""
    return {
        "accuracy": float(accuracy_score(gold, predicted)),
        "macro_f1": float(f1_score(gold, predicted, average="macro")),
    }


def majority(train: tuple[Texts, Labels], evals: dict[str, Texts]) -> tuple[dict, dict]:
    """Predict the most frequent training label everywhere."""
    label = Counter(train[1]).most_common(1)[0][0]
    return {name: [label] * len(texts) for name, texts in evals.items()}, {"predicts": label}


def tfidf_lr(
    train: tuple[Texts, Labels], evals: dict[str, Texts], val_labels: Labels
) -> tuple[dict, dict]:
    """Char 1-3-gram TF-IDF + logistic regression; C picked on validation macro-F1."""
    vectorizer = TfidfVectorizer(analyzer="char", ngram_range=(1, 3), sublinear_tf=True, min_df=2)
    x_train = vectorizer.fit_transform(train[0])
    x_evals = {name: vectorizer.transform(texts) for name, texts in evals.items()}
    log(f"  tfidf: {x_train.shape[1]} features (fit on train only)")
    val_f1: dict[float, float] = {}
    models = {}
    for c in C_GRID:
        model = LogisticRegression(C=c, solver="liblinear", max_iter=1000)
        model.fit(x_train, train[1])
        val_f1[c] = scores(val_labels, model.predict(x_evals["val"]))["macro_f1"]
        models[c] = model
        log(f"  C={c:<5} val macro-F1 {val_f1[c]:.4f}")
    best = max(C_GRID, key=lambda c: (val_f1[c], -c))  # ties go to the stronger regulariser
    predictions = {name: models[best].predict(x).tolist() for name, x in x_evals.items()}
    details = {"C": best, "val_macro_f1_by_C": val_f1, "features": int(x_train.shape[1])}
    return predictions, details


def snownlp_bayes(train: tuple[Texts, Labels], evals: dict[str, Texts]) -> tuple[dict, dict]:
    """snownlp's naive Bayes retrained on our train split, saved to and reloaded from a temp dir."""
    from snownlp import sentiment  # importing loads the shipped model, which we never touch

    shipped = Path(sentiment.data_path + ".3")
    shipped_hash = hashlib.sha256(shipped.read_bytes()).hexdigest()
    neg = [t for t, y in zip(*train) if y == "negative"]
    pos = [t for t, y in zip(*train) if y == "positive"]
    log(f"  training on {len(neg)} negative + {len(pos)} positive docs (segmentation is slow)")
    trained = sentiment.Sentiment()
    trained.train(neg, pos)
    with tempfile.TemporaryDirectory() as tmp:
        model_path = os.path.join(tmp, "sentiment.marshal")
        trained.save(model_path)
        model = sentiment.Sentiment()
        model.load(model_path)
    predictions = {
        name: ["positive" if model.classify(t) > 0.5 else "negative" for t in texts]
        for name, texts in evals.items()
    }
    if hashlib.sha256(shipped.read_bytes()).hexdigest() != shipped_hash:
        raise RuntimeError(f"{shipped} changed; the installed snownlp model must not be touched")
    return predictions, {"words": "snownlp seg + stopword filter", "threshold": 0.5}


def run_method(
    name: str, fn: Callable[[], tuple[dict, dict]], gold: dict[str, Labels]
) -> dict[str, object]:
    """Time one method and score its val/test predictions."""
    log(f"[{name}]")
    start = time.perf_counter()
    predictions, details = fn()
    seconds = time.perf_counter() - start
    result = {name_: scores(gold[name_], predictions[name_]) for name_ in gold}
    log(
        f"  test accuracy {result['test']['accuracy']:.4f}, "
        f"macro-F1 {result['test']['macro_f1']:.4f}  ({seconds:.1f} s)"
    )
    return {**result, "seconds": round(seconds, 2), "details": details}


def to_markdown(report: dict) -> str:
    """The human-readable results page."""
    rows = [
        "| method | val macro-F1 | test accuracy | test macro-F1 | wall time (fit + predict) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in report["methods"].items():
        rows.append(
            f"| {name} | {r['val']['macro_f1']:.4f} | {r['test']['accuracy']:.4f} | "
            f"{r['test']['macro_f1']:.4f} | {r['seconds']:.1f} s |"
        )
    split_rows = ["| split | negative | positive | total |", "|---|---:|---:|---:|"]
    for name, counts in report["split"].items():
        split_rows.append(
            f"| {name} | {counts.get('negative', 0)} | {counts.get('positive', 0)} | "
            f"{sum(counts.values())} |"
        )
    stats = report["corpus"]["stats"]
    corpus_rows = [
        "| label | raw lines | empty | duplicates removed | contradictory dropped | final |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label in stats["final"]:
        corpus_rows.append(
            f"| {label} | {stats['raw_lines'][label]} | {stats['empty_lines'][label]} | "
            f"{stats['duplicates_removed'][label]} | {stats['contradictory_dropped'][label]} | "
            f"{stats['final'][label]} |"
        )
    corpus_rows.append(f"| total | | | | | {stats['total']} |")
    tfidf = report["methods"]["tfidf_lr"]["details"]
    grid = ", ".join(f"{c:g}: {f:.4f}" for c, f in tfidf["val_macro_f1_by_C"].items())
    machine = "\n".join(f"- {k}: {v}" for k, v in report["machine"].items())
    return f"""# Classification baselines: Chinese reviews (snownlp corpus)

Generated by `python -m benchmarks.classify.baselines` on {report["date"]}; total wall time
{report["total_seconds"]:.0f} s. The Transformer classifier must be compared on the same corpus and
split: `load_chinese_reviews()` and `stratified_split(labels, (0.8, 0.1, 0.1), seed=0)`.

{chr(10).join(rows)}

- **majority**: always predicts `{report["methods"]["majority"]["details"]["predicts"]}`, the most
  frequent training label.
- **tfidf_lr**: character 1-3-gram TF-IDF (sublinear tf, min_df=2, fit on train only,
  {tfidf["features"]} features) + liblinear logistic regression. C was chosen on validation
  macro-F1 only ({grid}), giving C = {tfidf["C"]:g}; the test split was scored once, with that C.
- **snownlp_bayes**: snownlp's word-level naive Bayes (`sentiment.Sentiment().train(neg, pos)`,
  snownlp segmentation + stop-word filter) retrained from scratch on our training split, saved to
  and reloaded from a temporary directory; positive if P(positive) > 0.5. The model shipped with
  snownlp is never used: it was trained on these very files, test split included.

## Corpus and split

Source: {report["corpus"]["source"].split(": ", 1)[0]}, one review per line in two files
(negative, positive); SHA-256 of the cleaned texts in order: `{report["corpus"]["texts_sha256"]}`.
Cleaning: strip whitespace, drop empty lines, keep one copy of repeated
texts, drop the {stats["contradictory_texts"]} texts that occur under both labels.

{chr(10).join(corpus_rows)}

{chr(10).join(split_rows)}

## Machine

{machine}

Wall times are single runs; the load average shows whether other jobs shared the CPU.
"""


def main(argv: Sequence[str] | None = None) -> None:
    """Run all baselines and write the results files."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path("docs/results"))
    args = parser.parse_args(argv)
    if importlib.util.find_spec("snownlp") is None:
        raise SystemExit("snownlp is needed for this baseline: pip install snownlp==0.12.3")

    total_start = time.perf_counter()
    versions = {p: importlib.metadata.version(p) for p in ("scikit-learn", "numpy", "snownlp")}
    machine = common.machine(**versions)  # before the work: the load average shows other jobs
    corpus = load_chinese_reviews()
    split = stratified_split(corpus.labels, SPLIT_RATIOS, seed=SPLIT_SEED)
    texts = {name: [corpus.texts[i] for i in idx] for name, idx in split.items()}
    labels = {name: [corpus.labels[i] for i in idx] for name, idx in split.items()}
    log(f"corpus: {len(corpus)} examples; split sizes { {k: len(v) for k, v in split.items()} }")
    train = (texts["train"], labels["train"])
    evals = {"val": texts["val"], "test": texts["test"]}
    gold = {"val": labels["val"], "test": labels["test"]}

    methods = {
        "majority": run_method("majority", lambda: majority(train, evals), gold),
        "tfidf_lr": run_method("tfidf_lr", lambda: tfidf_lr(train, evals, labels["val"]), gold),
        "snownlp_bayes": run_method("snownlp_bayes", lambda: snownlp_bayes(train, evals), gold),
    }
    report = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "corpus": {
            "source": corpus.source,
            "texts_sha256": corpus_fingerprint(corpus.texts),
            "stats": corpus.stats,
        },
        "split_spec": {"ratios": list(SPLIT_RATIOS), "seed": SPLIT_SEED},
        "split": {name: dict(sorted(Counter(y).items())) for name, y in labels.items()},
        "methods": methods,
        "machine": machine,
        "total_seconds": round(time.perf_counter() - total_start, 1),
    }
    write_json(args.out_dir / "classify_baselines.json", report)
    page = common.with_command(to_markdown(report), common.command_line())
    atomic_write_text(args.out_dir / "classify_baselines.md", page)
    log(f"wrote {args.out_dir}/classify_baselines.md and .json")


if __name__ == "__main__":
    main()
