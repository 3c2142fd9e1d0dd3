"""Lexicon marks: does telling the classifier where HowNet's sentiment words are help it off-domain?

    python -m benchmarks.classify.lexicon_marks prepare
    python -m benchmarks.classify.lexicon_marks train --variant marks --seed 0
    python -m benchmarks.classify.lexicon_marks report

Adding the HowNet word lists as short training examples (the character model's default,
extra_train = "hownet") teaches
the model the words; this experiment tries the other classic way of using a lexicon, as a
feature of the input (the word-level sentiment polarity of SentiLARE, Ke et al. 2020, in its
simplest form): before every HowNet word of two or more characters found in a text (greedy
longest match, left to right) a marker character is inserted, ⊕ before a positive word and ⊖
before a negative one, raw polarity with no negation rule: 剧情拖沓 -> 剧情⊖拖沓. The marker
is an ordinary character to the unchanged classifier, so the model learns what it means from
the reviews, and it fires on words the reviews never contained (⊕热血沸腾).

`prepare` writes the bundled reviews' default split (split seed 0: the validation and test
splits of every earlier run) with marks into runs/lexicon_marks/data/: train.tsv (reviews
only), train_lex.tsv (reviews + the HowNet words as examples, as the default adds them, marked
too), val.tsv, test.tsv, ood_dev.tsv, ood_test.tsv. No file of the corpus or of the OOD sets
(which contain no ⊕ or ⊖) is changed in any other way.

`train --variant marks|marks+lexicon --seed S` runs `attnlab train classify` on those files with
the default preset (one thread, fp32 pinned) into runs/lexicon_marks/VARIANT-sS/.

`report` scores every finished run on the marked validation, test and OOD sets and the
tutorial's three sentences (marked the same way), adds character 1-3-gram TF-IDF + logistic
regression on the same marked texts, and writes docs/results/classify_lexicon_marks.{json,md}.
The runs without marks are those of benchmarks/classify/knowledge.py (runs/knowledge/), whose
record.json files this report reads for the comparison row; OOD test is scored, never used to
choose anything.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.data.lexicons import load_lexicon
from attnlab.data.sentiment import TUTORIAL_EXAMPLES, load_ood
from attnlab.infer.classifier import ClassifierRun
from attnlab.tasks import classify
from benchmarks import common

ROOT = Path("runs/lexicon_marks")
DATA = ROOT / "data"
OUT = Path("docs/results/classify_lexicon_marks")
MARK = {"positive": "⊕", "negative": "⊖"}
MIN_WORD = 2  # HowNet's one-character entries (是, 中, 会 ...) would mark almost every text
VARIANTS = {"marks": "train", "marks+lexicon": "train_lex"}
LABELS = {
    "marks": "marks, trained on the reviews only",
    "marks+lexicon": "marks, trained on the reviews + the HowNet words (marked)",
}
BASELINE = Path("runs/knowledge")  # unmarked runs of benchmarks/classify/knowledge.py
BASELINES = {"hownet_no_attn_dropout": "the default (HowNet words as examples, no marks)"}


class Marker:
    """Greedy longest-match marking of HowNet words (two characters or more)."""

    def __init__(self) -> None:
        lex = load_lexicon("hownet")
        self.polarity = {w: lab for w, lab in zip(lex.texts, lex.labels) if len(w) >= MIN_WORD}
        self.longest = max(map(len, self.polarity))

    def __call__(self, text: str) -> str:
        out, i = [], 0
        while i < len(text):
            for n in range(min(self.longest, len(text) - i), MIN_WORD - 1, -1):
                label = self.polarity.get(text[i : i + n])
                if label is not None:
                    out.append(MARK[label] + text[i : i + n])
                    i += n
                    break
            else:
                out.append(text[i])
                i += 1
        return "".join(out)


def write_tsv(path: Path, texts: list[str], labels: list[str], mark: Marker) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(["text", "label"])
        for text, label in zip(texts, labels):
            w.writerow([mark(text).replace("\t", " ").replace("\n", " "), label])


def read_tsv(path: Path) -> tuple[list[str], list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return [r["text"] for r in rows], [r["label"] for r in rows]


def prepare() -> None:
    mark = Marker()
    DATA.mkdir(parents=True, exist_ok=True)
    prep = classify.prepare(classify.build_config(None, {}), ROOT / "_prep", resume=False)
    texts, labels = prep.texts_of("train")  # the reviews, then the HowNet words (lexicons=auto)
    n = len(prep.split["train"])
    write_tsv(DATA / "train.tsv", texts[:n], labels[:n], mark)
    write_tsv(DATA / "train_lex.tsv", texts, labels, mark)
    for name in ("val", "test"):
        write_tsv(DATA / f"{name}.tsv", *prep.texts_of(name), mark)
    for name in ("dev", "test"):
        corpus, _ = load_ood(name)
        write_tsv(DATA / f"ood_{name}.tsv", corpus.texts, corpus.labels, mark)
    print(f"marked files in {DATA}; tutorial sentences marked:")
    for text, _ in TUTORIAL_EXAMPLES:
        print("  " + mark(text))


def train(variant: str, seed: int) -> None:
    out = ROOT / f"{variant}-s{seed}"
    if (out / "results.json").exists():
        print(f"{out} is finished")
        return
    cmd = [
        sys.executable, "-m", "attnlab", "train", "classify", "--arch", "char", "--extra-train", "",
        "--data", str(DATA / f"{VARIANTS[variant]}.tsv"),
        "--val-data", str(DATA / "val.tsv"), "--test-data", str(DATA / "test.tsv"),
        "--out", str(out), "--seed", str(seed), "--num-threads", "1",
        "--precision", "fp32", "--ood-eval", "false",
    ]  # fmt: skip
    subprocess.run(cmd, check=True)


def score(run: ClassifierRun, texts: list[str], labels: list[str]) -> float:
    preds = [p["label"] for p in run.predict(texts)]
    return float(np.mean([p == y for p, y in zip(preds, labels)]))


def record_of(run_dir: Path, mark: Marker) -> dict[str, Any]:
    run = ClassifierRun.load(run_dir)
    rec: dict[str, Any] = {"run": str(run_dir)}
    for name in ("val", "test", "ood_dev", "ood_test"):
        rec[name] = score(run, *read_tsv(DATA / f"{name}.tsv"))
    preds = run.predict([mark(t) for t, _ in TUTORIAL_EXAMPLES])
    rec["tutorial"] = [
        {"expected": want, "predicted": p["label"], "prob": p["probs"][p["label"]]}
        for (_, want), p in zip(TUTORIAL_EXAMPLES, preds)
    ]
    return rec


def tfidf() -> dict[str, dict[str, float]]:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    out = {}
    val = read_tsv(DATA / "val.tsv")
    for variant, file in VARIANTS.items():
        texts, labels = read_tsv(DATA / f"{file}.tsv")
        vec = TfidfVectorizer(analyzer="char", ngram_range=(1, 3), sublinear_tf=True, min_df=2)
        x = vec.fit_transform(texts)
        best = None
        for c in (0.5, 1.0, 2.0, 4.0, 8.0, 16.0):
            model = LogisticRegression(C=c, solver="liblinear", max_iter=1000).fit(x, labels)
            acc = float(np.mean(model.predict(vec.transform(val[0])) == np.array(val[1])))
            if best is None or acc > best[0]:
                best = (acc, c, model)
        acc, c, model = best
        row = {"C": c, "val": acc}
        for name in ("test", "ood_dev", "ood_test"):
            t, y = read_tsv(DATA / f"{name}.tsv")
            row[name] = float(np.mean(model.predict(vec.transform(t)) == np.array(y)))
        out[variant] = row
    return out


def baseline_rows() -> dict[str, list[dict[str, Any]]]:
    out = {}
    for variant in BASELINES:
        recs = []
        for path in sorted(BASELINE.glob(f"{variant}-s*/record.json")):
            r = json.loads(path.read_text())
            recs.append(
                {
                    "run": str(path.parent),
                    "val": r["val"]["accuracy"],
                    "test": r["test"]["accuracy"],
                    "ood_dev": r["ood"]["dev"]["accuracy"],
                    "ood_test": r["ood"]["test"]["accuracy"],
                    "tutorial": r["examples"],
                }
            )
        if recs:
            out[variant] = recs
    return out


def ms(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def report() -> None:
    mark = Marker()
    runs: dict[str, list[dict[str, Any]]] = {}
    for variant in VARIANTS:
        for run_dir in sorted(ROOT.glob(f"{variant}-s*")):
            if (run_dir / "results.json").exists() and run_dir.name.rsplit("-s", 1)[0] == variant:
                print(f"scoring {run_dir}")
                runs.setdefault(variant, []).append(record_of(run_dir, mark))
    base = baseline_rows()
    result = {"runs": runs, "baselines": base, "tfidf": tfidf()}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.with_suffix(".json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    lines = [
        "# Lexicon marks: HowNet polarity as a feature of the input",
        "",
        "Produced by `python -m benchmarks.classify.lexicon_marks prepare; ... train --variant V "
        "--seed S; ... report` (see its docstring). Default preset, bundled reviews, split seed "
        "0, one thread, fp32. Every text (training, validation, test, OOD, tutorial) gets ⊕ "
        "before each positive and ⊖ before each negative HowNet word of two or more characters. "
        "Mean ± std over seeds.",
        "",
        "| variant | seeds | val acc | test acc | OOD dev acc | OOD test acc | tutorial "
        "(first seed) | right with p≥0.7 per seed |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    rows = [(BASELINES[k], v) for k, v in base.items()]
    rows += [(LABELS[k], v) for k, v in runs.items()]
    for name, recs in rows:
        tut = " / ".join(f"{t['predicted'][:3]} {t['prob']:.2f}" for t in recs[0]["tutorial"])
        right = "/".join(
            str(sum(t["predicted"] == t["expected"] and t["prob"] >= 0.7 for t in r["tutorial"]))
            for r in recs
        )
        cells = [ms([r[k] for r in recs]) for k in ("val", "test", "ood_dev", "ood_test")]
        lines.append(f"| {name} | {len(recs)} | " + " | ".join(cells) + f" | {tut} | {right} |")
    lines += [
        "",
        "Per seed, OOD dev: "
        + "; ".join(
            f"{name} " + " / ".join(f"{r['ood_dev']:.3f}" for r in recs) for name, recs in rows
        ),
        "",
        "TF-IDF (character 1-3-grams) + logistic regression on the same marked texts, C chosen "
        "on validation (unmarked, the same model scores 0.762 OOD dev / 0.800 OOD test with the "
        "HowNet words and 0.748 / 0.781 without: docs/results/classify_knowledge.md):",
        "",
        "| training texts | C | val | test | OOD dev | OOD test |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for variant, row in result["tfidf"].items():
        lines.append(
            f"| {variant} | {row['C']} | {row['val']:.3f} | {row['test']:.3f} | "
            f"{row['ood_dev']:.3f} | {row['ood_test']:.3f} |"
        )
    module = "python -m benchmarks.classify.lexicon_marks"
    command = f"{module} prepare; {module} train --variant V --seed S; {module} report"
    common.write_page(OUT.with_suffix(".md"), lines, command)
    print(f"wrote {OUT}.md and .json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare")
    t = sub.add_parser("train")
    t.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    t.add_argument("--seed", type=int, required=True)
    sub.add_parser("report")
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        prepare()
    elif args.cmd == "train":
        train(args.variant, args.seed)
    else:
        report()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
