"""How high do classical models get on the bundled reviews? A sweep of n-gram features.

    pip install -e ".[bench]"      # jieba, for the word features
    python -m benchmarks.classify.classical_sweep

Same corpus cleaning and split as `benchmarks/classify/baselines.py` (stratified 80/10/10,
seed 0). Each variant is a linear model on sparse n-gram features: character n-grams of several
lengths, jieba word n-grams, both together, and NB-weighted features (Wang & Manning 2012, "NBSVM":
each feature scaled by its log-count ratio between the classes, then logistic regression). The
regularisation C is chosen on validation accuracy; test is scored once per variant with that C.
The point is the ceiling: if no variant moves far above the plain character TF-IDF baseline,
the corpus (noisy fragment labels), not the model family, limits accuracy.

Writes docs/results/classify_classical_sweep.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer
from sklearn.linear_model import LogisticRegression

from attnlab.data import load_chinese_reviews, stratified_split
from benchmarks import common

C_GRID = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def char_tfidf(lo: int, hi: int) -> TfidfVectorizer:
    return TfidfVectorizer(analyzer="char", ngram_range=(lo, hi), sublinear_tf=True, min_df=2)


def word_tfidf(lo: int, hi: int) -> TfidfVectorizer:
    return TfidfVectorizer(
        analyzer="word", token_pattern=r"\S+", ngram_range=(lo, hi), sublinear_tf=True, min_df=2
    )


def nb_scale(x_train: sp.csr_matrix, positive: np.ndarray) -> sp.dia_matrix:
    """Diagonal of log-count ratios r = log((p/|p|) / (q/|q|)), add-one smoothed (NBSVM eq. 2)."""
    p = 1 + np.asarray(x_train[positive].sum(0)).ravel()
    q = 1 + np.asarray(x_train[~positive].sum(0)).ravel()
    return sp.diags(np.log((p / p.sum()) / (q / q.sum())))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--name", default="classify_classical_sweep", help="results file stem")
    args = parser.parse_args(argv)
    out = common.RESULTS / args.name
    info = common.machine()
    try:
        import jieba
    except ImportError:
        raise SystemExit('the word features need jieba: pip install -e ".[bench]"') from None
    jieba.setLogLevel(60)
    corpus = load_chinese_reviews()
    texts, labels = list(corpus.texts), np.array(corpus.labels)
    split = stratified_split(list(labels), (0.8, 0.1, 0.1), seed=0)
    start = time.perf_counter()
    words = {t: " ".join(jieba.lcut(t)) for t in texts}
    print(f"jieba segmentation: {time.perf_counter() - start:.0f} s", flush=True)
    as_is: Callable[[str], str] = lambda t: t  # noqa: E731
    segmented: Callable[[str], str] = lambda t: words[t]  # noqa: E731
    variants = {
        "char 1-3 TF-IDF (the baseline)": ([(char_tfidf(1, 3), as_is)], False),
        "char 1-4 TF-IDF": ([(char_tfidf(1, 4), as_is)], False),
        "char 1-5 TF-IDF": ([(char_tfidf(1, 5), as_is)], False),
        "word 1-2 TF-IDF (jieba)": ([(word_tfidf(1, 2), segmented)], False),
        "word 1-3 TF-IDF (jieba)": ([(word_tfidf(1, 3), segmented)], False),
        "char 1-3 + word 1-2 TF-IDF": (
            [(char_tfidf(1, 3), as_is), (word_tfidf(1, 2), segmented)],
            False,
        ),
        "char 1-4 + word 1-2 TF-IDF": (
            [(char_tfidf(1, 4), as_is), (word_tfidf(1, 2), segmented)],
            False,
        ),
        "NB-weighted char 1-3 TF-IDF": ([(char_tfidf(1, 3), as_is)], True),
        "NB-weighted binary char 1-3 (NBSVM-style)": (
            [(CountVectorizer(analyzer="char", ngram_range=(1, 3), binary=True), as_is)],
            True,
        ),
        "NB-weighted char 1-4 + word 1-2 TF-IDF": (
            [(char_tfidf(1, 4), as_is), (word_tfidf(1, 2), segmented)],
            True,
        ),
    }
    parts = {name: [texts[i] for i in idx] for name, idx in split.items()}
    gold = {name: labels[idx] for name, idx in split.items()}
    results = {}
    for name, (featurizers, nb) in variants.items():
        start = time.perf_counter()
        blocks: dict[str, list] = {"train": [], "val": [], "test": []}
        for vectorizer, view in featurizers:
            blocks["train"].append(vectorizer.fit_transform([view(t) for t in parts["train"]]))
            for other in ("val", "test"):
                blocks[other].append(vectorizer.transform([view(t) for t in parts[other]]))
        x = {k: sp.hstack(v).tocsr() for k, v in blocks.items()}
        if nb:
            scale = nb_scale(x["train"], gold["train"] == "positive")
            x = {k: v @ scale for k, v in x.items()}
        by_c = {}
        for c in C_GRID:
            model = LogisticRegression(C=c, solver="liblinear", max_iter=2000).fit(
                x["train"], gold["train"]
            )
            val = float((model.predict(x["val"]) == gold["val"]).mean())
            by_c[c] = (val, model)
        best = max(C_GRID, key=lambda c: (by_c[c][0], -c))  # ties: the stronger regulariser
        test = float((by_c[best][1].predict(x["test"]) == gold["test"]).mean())
        results[name] = {
            "features": int(x["train"].shape[1]),
            "C": best,
            "val_accuracy": by_c[best][0],
            "test_accuracy": test,
            "seconds": round(time.perf_counter() - start, 1),
        }
        print(f"{name:45s} val {by_c[best][0]:.4f} test {test:.4f} (C={best})", flush=True)
    record = {
        "split": {k: len(v) for k, v in split.items()},
        "results": results,
        "machine": info,
        "jieba": jieba.__version__,
    }
    out.with_suffix(".json").write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    rows = [
        f"| {name} | {r['features']:,} | {r['C']:g} | {r['val_accuracy']:.4f} | "
        f"{r['test_accuracy']:.4f} |"
        for name, r in results.items()
    ]
    best_val = max(results, key=lambda n: results[n]["val_accuracy"])
    md = [
        "# Classical models on the bundled reviews: how high do n-gram features get?",
        "",
        "Produced by `python -m benchmarks.classify.classical_sweep`: logistic regression on "
        "sparse n-gram features, C chosen on validation accuracy from "
        f"{', '.join(f'{c:g}' for c in C_GRID)}; same split as every classifier result "
        f"(train {record['split']['train']}, val {record['split']['val']}, test "
        f"{record['split']['test']}). Word n-grams from jieba {record['jieba']} segmentation; "
        "NB-weighted: features scaled by their log-count ratio (Wang & Manning 2012).",
        "",
        "| features | number | C | val accuracy | test accuracy |",
        "|---|---:|---:|---:|---:|",
        *rows,
        "",
        f"The variant a validation-driven choice would pick ({best_val}) scores "
        f"{results[best_val]['test_accuracy']:.4f} on test.",
    ]
    out.with_suffix(".md").write_text(common.with_command(md, common.command_line()))
    print("\n".join(md))


if __name__ == "__main__":
    main()
