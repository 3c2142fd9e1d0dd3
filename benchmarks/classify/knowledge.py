"""What extra knowledge buys the Chinese classifier: an ablation over knowledge sources.

    python -m benchmarks.classify.knowledge train --variants default,hownet --seeds 0,1,2
    python -m benchmarks.classify.knowledge report

`train` trains each variant × seed with `attnlab train classify` (one thread, bundled corpus,
split seed 0, so the in-domain validation and test splits are the ones every earlier run used)
into runs/knowledge/VARIANT-sSEED/ and writes record.json there: in-domain test accuracy and
macro-F1, out-of-domain (OOD) dev and test accuracy and macro-F1, the tutorial's three sentences
(label and probability), training wall time and the load average around it. A finished run is
reused, not retrained; run two `train` processes side by side with different variants to share
the load, then `report`.

`report` gathers every record, adds
* seed ensembles (the seeds' probabilities averaged, no extra training),
* temperature scaling fitted on the in-domain validation split (NLL and expected calibration
  error on OOD dev before and after; accuracy does not change),
* character 1-3-gram TF-IDF + logistic regression (C chosen on in-domain validation) given the
  same training texts as each variant,
and writes docs/results/classify_knowledge.{json,md}. Settings are chosen on OOD dev and
in-domain validation only; OOD test is scored, never read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from attnlab.data.prepare import prepare_texts
from attnlab.data.sentiment import OOD_DIR, TUTORIAL_EXAMPLES, load_ood, ood_files
from attnlab.infer.classifier import ClassifierRun
from attnlab.runs import training
from benchmarks import common

ROOT = common.ROOT
RESULTS = ROOT / "docs" / "results"
RUNS = ROOT / "runs" / "knowledge"

# The preset before this work (no extra sources): every variant states its fields in full, so
# the table means the same thing whatever the preset says today.
OLD_DEFAULT: dict[str, Any] = {
    "arch": "char",
    "extra_train": "",
    "lexicon_negation": 0.0,
    "lexicon_intensity": 0.0,
    "label_smoothing": 0.1,
    "members": 1,
    "epochs": 6,
    "attn_dropout": 0.1,  # the preset's value before the memory work (now 0)
}
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "default_3ep": {"epochs": 3},
    "hownet": {"extra_train": "hownet"},
    "hownet_3ep": {"extra_train": "hownet", "epochs": 3},
    "hownet+phrases_3ep": {
        "extra_train": "hownet",
        "lexicon_negation": 0.25,
        "lexicon_intensity": 0.25,
        "epochs": 3,
    },
    "dutir_3ep": {"extra_train": "dutir", "epochs": 3},
    "hownet_no_attn_dropout": {"extra_train": "hownet", "attn_dropout": 0.0},
    "hownet_no_attn_dropout_no_smoothing": {
        "extra_train": "hownet",
        "attn_dropout": 0.0,
        "label_smoothing": 0.0,
    },
    "hownet_no_attn_dropout+pretrain": {
        "extra_train": "hownet",
        "attn_dropout": 0.0,
        "pretrain": "peoples_daily,reviews",
        "pretrain_steps": 2000,
    },
    "hownet+dutir+phrases_3ep": {
        "extra_train": "hownet,dutir",
        "lexicon_negation": 0.25,
        "lexicon_intensity": 0.25,
        "epochs": 3,
    },
}
NOTES = {
    "default": "the preset before this work: bundled reviews only, 6 epochs",
    "default_3ep": "the same, 3 epochs (the cosine schedule over 3 epochs)",
    "hownet": "+ HowNet word lists as short examples, 6 epochs as the default",
    "hownet_3ep": "+ HowNet word lists as short examples, 3 epochs",
    "hownet_no_attn_dropout_no_smoothing": "the default now (HowNet, attention dropout 0) "
    "without label smoothing",
    "hownet_no_attn_dropout+pretrain": "the same, after 2,000 steps of masked-character "
    "pretraining of the encoder on People's Daily 1998 and the training split's texts",
    "hownet_no_attn_dropout": "HowNet, attention dropout 0 (PyTorch's fused CPU attention kernel "
    "runs only without dropout: the memory fix)",
    "hownet+phrases_3ep": "+ HowNet words; a quarter also negated (不+word, label flipped), a "
    "quarter with a degree adverb (非常+word); 3 epochs",
    "dutir_3ep": "+ DUTIR emotion words (academic-use terms), 3 epochs",
    "hownet+dutir+phrases_3ep": "+ both lexicons, a quarter negated, a quarter intensified; "
    "3 epochs",
}
# Runs that trained side by side (started together, one thread each, the same precision): only
# their times compare. (variant, seed) pairs; the report gives the ratio of the second to the first.
SIDE_BY_SIDE: list[tuple[tuple[str, int], tuple[str, int]]] = [
    (("default", 0), ("hownet+phrases_3ep", 0)),
    (("default", 2), ("hownet", 1)),
]


def overrides_of(variant: str, seed: int, precision: str = "auto") -> dict[str, Any]:
    """The full set of overrides of one run (precision pinned only when asked, so auto's
    load-dependent choice does not confound the timings of a side-by-side comparison)."""
    pinned = {} if precision == "auto" else {"precision": precision}
    return {
        **OLD_DEFAULT,
        **VARIANTS[variant],
        "seed": seed,
        "num_threads": 1,
        "tensorboard": False,
        **pinned,
    }


def run_dir(variant: str, seed: int) -> Path:
    return RUNS / f"{variant}-s{seed}"


def probabilities(run: ClassifierRun, texts: list[str]) -> list[float]:
    """P(positive) of each text."""
    return [p["probs"]["positive"] for p in run.predict(texts)]


def logits_of(run: ClassifierRun, texts: list[str], batch: int = 256) -> torch.Tensor:
    """Log-probabilities (N, C) of the run's model (an ensemble's averaged probabilities)."""
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            ids, lengths = run.encode(texts[i : i + batch])
            out.append(torch.log_softmax(run.model(ids, lengths), -1))
    return torch.cat(out)


def record_run(
    variant: str,
    seed: int,
    out: Path,
    wall_s: float | None = None,
    load_before=None,
    precision: str = "auto",
) -> dict:
    """Scores of one finished run, written to out/record.json (a rerun keeps the old timing)."""
    old_path = out / "record.json"
    if old_path.exists():
        old = json.loads(old_path.read_text(encoding="utf-8"))
        wall_s = old["process_wall_time_s"] if wall_s is None else wall_s
        load_before = old["load_average_before"] if load_before is None else load_before
        precision = old["overrides"].get("precision", precision)
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    run = ClassifierRun.load(out)
    ood = {}
    for name, path in ood_files().items():
        report = run.evaluate(data=str(path))
        ood[name] = {k: report[k] for k in ("accuracy", "macro_f1", "n")}
    examples = [
        {"text": text, "expected": want, "predicted": p["label"], "prob": p["probs"][p["label"]]}
        for (text, want), p in zip(
            TUTORIAL_EXAMPLES, run.predict([t for t, _ in TUTORIAL_EXAMPLES])
        )
    ]
    summary = results["summary"]
    data_report = json.loads((out / "data_report.json").read_text(encoding="utf-8"))
    record = {
        "variant": variant,
        "seed": seed,
        "overrides": overrides_of(variant, seed, precision),
        "test": {k: results["test"][k] for k in ("accuracy", "macro_f1", "n")},
        "val": {k: results["val"][k] for k in ("accuracy", "macro_f1", "n")},
        "ood": ood,
        "examples": examples,
        "train_wall_time_s": summary["wall_time_s"],
        "process_wall_time_s": wall_s,
        "steps": summary["steps"],
        "stop_reason": summary["stop_reason"],
        "precision": summary["precision"],
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "extra_training_examples": (data_report.get("extra_training") or {}).get("added", 0),
        "n_params": results["n_params"],
    }
    (out / "record.json").write_text(
        json.dumps(record, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )
    return record


def train(variants: list[str], seeds: list[int], precision: str = "auto") -> None:
    for variant in variants:
        if variant not in VARIANTS:
            raise SystemExit(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    for seed in seeds:
        for variant in variants:
            out = run_dir(variant, seed)
            if (out / "record.json").exists():
                print(f"{out}: done, reused", flush=True)
                continue
            if (out / "results.json").exists():
                print(f"{out}: trained already, scoring it", flush=True)
                record_run(variant, seed, out, precision=precision)
                continue
            load_before = os.getloadavg()
            started = time.perf_counter()
            print(f"{out}: training", flush=True)
            training.train("classify", out, overrides_of(variant, seed, precision), resume=False)
            wall = time.perf_counter() - started
            record = record_run(variant, seed, out, wall, load_before, precision)
            print(json.dumps({k: record[k] for k in ("variant", "seed", "test", "ood")}))


# ---------------------------------------------------------------------------- report


def mean_std(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "n": len(values),
    }


def ece(probs: torch.Tensor, gold: torch.Tensor, bins: int = 10) -> float:
    """Expected calibration error of the top class (Guo et al. 2017), equal-width bins."""
    conf, pred = probs.max(-1)
    hits = (pred == gold).float()
    total = 0.0
    for b in range(bins):
        in_bin = (conf > b / bins) & (conf <= (b + 1) / bins)
        if in_bin.any():
            total += in_bin.float().mean().item() * abs(
                hits[in_bin].mean().item() - conf[in_bin].mean().item()
            )
    return total


def fit_temperature(logp: torch.Tensor, gold: torch.Tensor) -> float:
    """The temperature T minimising the NLL of softmax(logp / T) (Guo et al. 2017, eq. 9)."""
    log_t = torch.zeros(1, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.1, max_iter=200)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(logp / log_t.exp(), gold)
        loss.backward()
        return loss

    opt.step(closure)
    return float(log_t.detach().exp())


def calibration(run: ClassifierRun, val_texts: list[str], val_labels: list[str]) -> dict:
    """Temperature scaling fitted on in-domain validation; effect on OOD dev and the tutorial."""
    idx = {label: i for i, label in enumerate(run.labels.labels)}
    val_gold = torch.tensor([idx[y] for y in val_labels])
    temp = fit_temperature(logits_of(run, val_texts), val_gold)
    dev, _ = load_ood("dev")
    dev_gold = torch.tensor([idx[y] for y in dev.labels])
    dev_logp = logits_of(run, dev.texts)
    tut_logp = logits_of(run, [t for t, _ in TUTORIAL_EXAMPLES])
    out: dict[str, Any] = {"temperature": temp}
    for name, t in (("before", 1.0), ("after", temp)):
        probs = torch.softmax(dev_logp / t, -1)
        out[name] = {
            "ood_dev_nll": float(torch.nn.functional.cross_entropy(dev_logp / t, dev_gold)),
            "ood_dev_ece": ece(probs, dev_gold),
            "tutorial_probs": torch.softmax(tut_logp / t, -1).max(-1).values.tolist(),
        }
    return out


def tfidf(train_texts, train_labels, val, evals) -> dict[str, Any]:
    """Char 1-3-gram TF-IDF + logistic regression, C chosen on in-domain validation accuracy."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    vec = TfidfVectorizer(analyzer="char", ngram_range=(1, 3), sublinear_tf=True, min_df=2)
    x = vec.fit_transform(train_texts)
    x_val = vec.transform(val[0])
    best = None
    for c in (0.5, 1.0, 2.0, 4.0, 8.0, 16.0):
        model = LogisticRegression(C=c, solver="liblinear", max_iter=1000).fit(x, train_labels)
        acc = float((model.predict(x_val) == val[1]).mean())
        if best is None or acc > best[0]:
            best = (acc, c, model)
    acc, c, model = best
    out: dict[str, Any] = {"C": c, "val_accuracy": acc}
    from sklearn.metrics import accuracy_score, f1_score

    for name, (texts, labels) in evals.items():
        pred = model.predict(vec.transform(texts))
        out[name] = {
            "accuracy": float(accuracy_score(labels, pred)),
            "macro_f1": float(f1_score(labels, pred, average="macro")),
            "n": len(labels),
        }
    tut = model.predict_proba(vec.transform([t for t, _ in TUTORIAL_EXAMPLES]))
    classes = list(model.classes_)
    out["examples"] = [
        {"expected": want, "predicted": classes[int(p.argmax())], "prob": float(p.max())}
        for (_, want), p in zip(TUTORIAL_EXAMPLES, tut)
    ]
    return out


def report() -> None:
    records: dict[str, list[dict]] = {}
    for path in sorted(RUNS.glob("*/record.json")):
        rec = json.loads(path.read_text(encoding="utf-8"))
        if set(rec["ood"]) != set(ood_files()):  # recorded before the OOD files landed
            rec = record_run(rec["variant"], rec["seed"], path.parent)
        records.setdefault(rec["variant"], []).append(rec)
    rows: dict[str, Any] = {}
    for variant in [v for v in VARIANTS if v in records]:
        recs = sorted(records[variant], key=lambda r: r["seed"])
        row: dict[str, Any] = {
            "note": NOTES[variant],
            "overrides": VARIANTS[variant],
            "seeds": [r["seed"] for r in recs],
            "test_accuracy": mean_std([r["test"]["accuracy"] for r in recs]),
            "val_accuracy": mean_std([r["val"]["accuracy"] for r in recs]),
            "ood_dev_each": [round(r["ood"]["dev"]["accuracy"], 3) for r in recs],
            "ood": {
                name: mean_std([r["ood"][name]["accuracy"] for r in recs if name in r["ood"]])
                for name in ("dev", "test")
            },
            "ood_macro_f1": {
                name: mean_std([r["ood"][name]["macro_f1"] for r in recs if name in r["ood"]])
                for name in ("dev", "test")
            },
            "train_minutes": mean_std([r["train_wall_time_s"] / 60 for r in recs]),
            "train_minutes_each": [round(r["train_wall_time_s"] / 60, 1) for r in recs],
            "precision_each": [r["precision"] for r in recs],
            "train_cpu_minutes_each": [round(cpu_seconds(r) / 60, 1) for r in recs],
            "steps_each": [r["steps"] for r in recs],
            "examples": [
                [f"{e['predicted'][:3]} {e['prob']:.2f}" for e in r["examples"]] for r in recs
            ],
            "tutorial_right_p07": [
                sum(e["predicted"] == e["expected"] and e["prob"] >= 0.7 for e in r["examples"])
                for r in recs
            ],
            "load_average": [(r["load_average_before"] or [None])[0] for r in recs],
            "extra_training_examples": recs[0]["extra_training_examples"],
        }
        rows[variant] = row
    extras = ensembles_and_calibration(records)
    pairs = side_by_side(records)
    baselines = tfidf_rows(list(VARIANTS))  # every source set, trained neurally or not
    record = {
        "command": "python -m benchmarks.classify.knowledge train --variants V --seeds S; "
        "python -m benchmarks.classify.knowledge report",
        "variants": rows,
        "ensembles_and_calibration": extras,
        "side_by_side": pairs,
        "tfidf": baselines,
        "machine": common.machine(threads=1),
        "load_average_at_report": os.getloadavg(),
        "ood_dir": str(OOD_DIR.relative_to(ROOT)),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "classify_knowledge.json").write_text(
        json.dumps(record, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )
    common.write_page(RESULTS / "classify_knowledge.md", render(record), record["command"])
    print(render(record))


def cpu_seconds(rec: dict) -> float:
    """CPU time the training loop used (less swayed by other jobs than wall time)."""
    results = json.loads((run_dir(rec["variant"], rec["seed"]) / "results.json").read_text())
    return results["summary"]["cpu_time_s"]


def side_by_side(records: dict[str, list[dict]]) -> list[dict[str, Any]]:
    """Wall and CPU time of each SIDE_BY_SIDE pair whose runs both exist, as ratios."""
    by_key = {(r["variant"], r["seed"]): r for recs in records.values() for r in recs}
    out = []
    for a, b in SIDE_BY_SIDE:
        if a not in by_key or b not in by_key:
            continue
        ra, rb = by_key[a], by_key[b]
        wall = [ra["train_wall_time_s"] / 60, rb["train_wall_time_s"] / 60]
        cpu = [cpu_seconds(ra) / 60, cpu_seconds(rb) / 60]
        out.append(
            {
                "runs": [f"{a[0]}-s{a[1]}", f"{b[0]}-s{b[1]}"],
                "precision": [ra["precision"], rb["precision"]],
                "steps": [ra["steps"], rb["steps"]],
                "wall_minutes": [round(w, 1) for w in wall],
                "cpu_minutes": [round(c, 1) for c in cpu],
                "wall_ratio": round(wall[1] / wall[0], 2),
                "cpu_ratio": round(cpu[1] / cpu[0], 2),
                "load_average_before": [ra["load_average_before"], rb["load_average_before"]],
            }
        )
    return out


def ensembles_and_calibration(records: dict[str, list[dict]]) -> dict[str, Any]:
    """Per variant with several seeds: the seeds' averaged probabilities as one ensemble; per
    variant: temperature scaling of seed 0's (or the first) run."""
    out: dict[str, Any] = {}
    cfg = training.build_config("classify", None, {"arch": "char", "extra_train": ""})
    prep = prepare_texts(cfg.data, RUNS / "_prep", resume=False)  # only val/test are read
    val_texts, val_labels = prep.texts("val")
    test_texts, test_labels = prep.texts("test")
    dev, _ = load_ood("dev")
    test_ood, _ = load_ood("test") if "test" in ood_files() else (None, None)
    tut = [t for t, _ in TUTORIAL_EXAMPLES]
    for variant, recs in records.items():
        runs = [ClassifierRun.load(run_dir(variant, r["seed"])) for r in recs]
        entry: dict[str, Any] = {"calibration": calibration(runs[0], val_texts, val_labels)}
        if len(runs) > 1:
            sets = {"test": (test_texts, test_labels), "ood_dev": (dev.texts, dev.labels)}
            if test_ood is not None:
                sets["ood_test"] = (test_ood.texts, test_ood.labels)
            ens: dict[str, Any] = {"members": len(runs)}
            for name, (texts, labels) in sets.items():
                p = sum(torch.tensor(probabilities(r, texts)) for r in runs) / len(runs)
                pred = ["positive" if q > 0.5 else "negative" for q in p.tolist()]
                ens[name] = sum(a == b for a, b in zip(pred, labels)) / len(labels)
            p = sum(torch.tensor(probabilities(r, tut)) for r in runs) / len(runs)
            ens["examples"] = [
                f"{'pos' if q > 0.5 else 'neg'} {max(q, 1 - q):.2f}" for q in p.tolist()
            ]
            entry["seed_ensemble"] = ens
        out[variant] = entry
    return out


def tfidf_rows(variants: list[str], ood_splits: tuple[str, ...] = ("dev", "test")) -> dict:
    """TF-IDF + LR given each variant's training texts (the same split and extra sources)."""
    out = {}
    seen: dict[str, str] = {}
    for variant in variants:
        over = {k: v for k, v in overrides_of(variant, 0).items()
                if k.startswith("lexicon") or k in ("arch", "extra_train")}  # fmt: skip
        key = json.dumps(over, sort_keys=True)
        if key in seen:
            continue
        seen[key] = variant
        cfg = training.build_config("classify", None, over)
        prep = prepare_texts(cfg.data, RUNS / "_prep", resume=False)
        train_texts, train_labels = prep.texts("train")
        val = prep.texts("val")
        evals = {"test": prep.texts("test")}
        for name in [n for n in ood_files() if n in ood_splits]:
            corpus, _ = load_ood(name)
            evals[f"ood_{name}"] = (corpus.texts, corpus.labels)
        import numpy as np

        out[variant] = tfidf(train_texts, train_labels, (val[0], np.array(val[1])), evals)
    return out


def fmt(ms: dict[str, float]) -> str:
    if not ms or not ms.get("n"):
        return "–"
    return f"{ms['mean']:.3f} ± {ms['std']:.3f}" if ms["n"] > 1 else f"{ms['mean']:.3f}"


def render(record: dict) -> str:
    lines = [
        "# What extra knowledge buys the Chinese review classifier",
        "",
        f"Produced by `{record['command']}`. Bundled reviews, split seed 0 (the in-domain "
        "validation and test splits of every earlier run; extra sources join the training split "
        "only), 1 thread per run, two runs side by side on a shared machine. OOD = the "
        "hand-written out-of-domain sets in `src/attnlab/data/sentiment_ood/` (dev chooses, "
        "test is only scored). Mean ± std over seeds (n shown).",
        "",
        "| variant | seeds | in-domain val acc | in-domain test acc | OOD dev acc | OOD test acc | "
        "OOD test F1 | tutorial (3 sentences) | right with p≥0.7 | "
        "train wall min per seed (precision) | train CPU min per seed | steps | "
        "extra examples |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in record["variants"].items():
        examples = " / ".join(row["examples"][0])
        lines.append(
            f"| {name} | {len(row['seeds'])} | {fmt(row['val_accuracy'])} | "
            f"{fmt(row['test_accuracy'])} | "
            f"{fmt(row['ood']['dev'])} | {fmt(row['ood']['test'])} | "
            f"{fmt(row['ood_macro_f1']['test'])} | {examples} | "
            f"{'/'.join(map(str, row['tutorial_right_p07']))} | "
            f"{', '.join(map(str, row['train_minutes_each']))} "
            f"({', '.join(row['precision_each'])}) | "
            f"{', '.join(map(str, row['train_cpu_minutes_each']))} | "
            f"{', '.join(map(str, row['steps_each']))} | "
            f"{row['extra_training_examples']} |"
        )
    lines += [
        "",
        "Tutorial column: seed-first run's label and probability for 这部电影看得我热血沸腾，"
        "情节紧凑。(positive) / 剧情拖沓，演员演技一言难尽。(negative) / "
        "电影前半段很无聊，但是结局让我感动 (positive); the next column counts, per seed, the "
        "sentences right with p ≥ 0.7.",
        "",
        "OOD dev accuracy per seed: "
        + "; ".join(
            f"{name} {' / '.join(f'{a:.3f}' for a in row['ood_dev_each'])}"
            for name, row in record["variants"].items()
        )
        + ".",
        "",
        "## Seed ensembles and temperature scaling",
        "",
        "| variant | ensemble of seeds: test / OOD dev / OOD test | tutorial | T (fit on val) | "
        "OOD dev NLL before → after | OOD dev ECE before → after |",
        "|---|---|---|---:|---|---|",
    ]
    for name, entry in record["ensembles_and_calibration"].items():
        ens = entry.get("seed_ensemble")
        cal = entry["calibration"]
        ens_txt = (
            f"{ens['test']:.3f} / {ens['ood_dev']:.3f} / {ens.get('ood_test', float('nan')):.3f}"
            if ens
            else "–"
        )
        lines.append(
            f"| {name} | {ens_txt} | {' / '.join(ens['examples']) if ens else '–'} | "
            f"{cal['temperature']:.2f} | {cal['before']['ood_dev_nll']:.3f} → "
            f"{cal['after']['ood_dev_nll']:.3f} | {cal['before']['ood_dev_ece']:.3f} → "
            f"{cal['after']['ood_dev_ece']:.3f} |"
        )
    lines += [
        "",
        "## TF-IDF + logistic regression with the same training texts",
        "",
        "| training texts as in | C | in-domain test acc | OOD dev acc | OOD test acc | tutorial |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, row in record["tfidf"].items():
        ex = " / ".join(f"{e['predicted'][:3]} {e['prob']:.2f}" for e in row["examples"])
        lines.append(
            f"| {name} | {row['C']} | {row['test']['accuracy']:.3f} | "
            f"{row.get('ood_dev', {}).get('accuracy', float('nan')):.3f} | "
            f"{row.get('ood_test', {}).get('accuracy', float('nan')):.3f} | {ex} |"
        )
    lines += [
        "",
        "## Training time of runs that ran side by side",
        "",
        "| runs (first, second) | precision | steps | wall min | CPU min | wall ratio | "
        "CPU ratio | 1-min load at start |",
        "|---|---|---|---|---|---:|---:|---|",
    ]
    for pair in record["side_by_side"]:
        loads = " / ".join(f"{la[0]:.1f}" if la else "?" for la in pair["load_average_before"])
        lines.append(
            f"| {' + '.join(pair['runs'])} | {' / '.join(pair['precision'])} | "
            f"{' / '.join(map(str, pair['steps']))} | "
            f"{' / '.join(map(str, pair['wall_minutes']))} | "
            f"{' / '.join(map(str, pair['cpu_minutes']))} | {pair['wall_ratio']:.2f} | "
            f"{pair['cpu_ratio']:.2f} | {loads} |"
        )
    info = common.upgrade_machine(record["machine"])
    lines += [
        "",
        f"Machine: {info['cpu']}, {info['logical_cores']} logical cores shared with other jobs, "
        f"1 thread per run, Python {info['python']}, torch {info['torch']}. The 1-minute load "
        "average when each run started is in the JSON (`load_average`); wall times compare "
        "only between runs that ran side by side (the table above); the others overlapped in "
        "varying pairs at load 8-21. `precision=auto` chose fp32 or bf16 by a load-swayed probe "
        "in the earlier runs; the side-by-side `default` seed 2 / `hownet` seed 1 pair and "
        "`hownet` seed 2 were pinned with `train --precision fp32`.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train")
    tr.add_argument("--variants", default=",".join(VARIANTS))
    tr.add_argument("--seeds", default="0,1,2")
    tr.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "fp32", "bf16"],
        help="pin the training precision (auto picks by a timing probe, which load sways)",
    )
    sub.add_parser("report")
    explore = sub.add_parser("tfidf-dev", help="TF-IDF per variant on validation and OOD dev")
    explore.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args(argv)
    if args.command == "tfidf-dev":
        for name, row in tfidf_rows(args.variants.split(","), ("dev",)).items():
            tut = " / ".join(f"{e['predicted'][:3]} {e['prob']:.2f}" for e in row["examples"])
            print(
                f"{name}: C {row['C']} val {row['val_accuracy']:.4f} "
                f"OOD dev {row['ood_dev']['accuracy']:.4f} | {tut}",
                flush=True,
            )
    elif args.command == "train":
        train(args.variants.split(","), [int(s) for s in args.seeds.split(",")], args.precision)
    else:
        report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
