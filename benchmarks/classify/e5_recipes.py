"""What pretraining buys the main job: multilingual-e5 recipes beside the floors, one split.

Two modes, one page (docs/results/classify_e5.md):

``probe``  the floors, measured here: a linear probe on the *frozen* e5 (attnlab's encoder,
           mean-pooled, "query: "), its L2 penalty chosen on validation from a grid, fitted on
           the same stratified training sample ``train classify --train-examples N`` draws (and
           on the whole training split); TF-IDF character 1-3-grams + logistic regression on the
           same texts. Scores: in-domain test (n = 1,736, the character model's split), OOD
           dev/test, the tutorial's three sentences.
``runs``   the fine-tuned recipes, read from `attnlab train classify` run folders (results.json,
           summary.json, config.json; each run's own command is its config): their scores, the
           tutorial sentences through the run's predict, wall and CPU time, and peak memory
           (the run's own record in results.json; runs from before it was recorded leave it
           blank). ``--recipe NAME`` (one per folder) groups runs of one recipe that differ
           only in the training seed: the ablation table gives each recipe's mean and range
           over its seeds, and the tutorial's third sentence in every seed.
``errors`` the out-of-domain film and series sentences that the given runs misread: each
           sentence with how many of the runs got it wrong and their p(positive), for the
           error analysis on the page.

The page is rendered from docs/results/classify_e5.json, which every mode updates.

    python -m benchmarks.classify.e5_recipes probe --train-examples 6000
    python -m benchmarks.classify.e5_recipes runs runs/a0 runs/a1 runs/a2 --recipe A --recipe A \
        --recipe A --name 'A, seed 0' --name 'A, seed 1' --name 'A, seed 2'
    python -m benchmarks.classify.e5_recipes errors runs/a0 runs/a1 runs/a2 --label A
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common import (
    RESULTS,
    command_line,
    load_average,
    machine,
    machine_line,
    set_threads,
)

STEM = "classify_e5"
PROBE_DECAYS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    probe = sub.add_parser("probe", help="frozen-e5 linear probe and TF-IDF floors")
    probe.add_argument("--train-examples", type=int, default=6000, help="0 = the whole split")
    probe.add_argument("--threads", type=int, default=1)
    probe.add_argument(
        "--probe-full", action="store_true", help="also probe on the whole training split"
    )
    probe.add_argument(
        "--extra-train",
        default="",
        help="also probe on the sample plus this corpus (as train classify --extra-train)",
    )
    runs = sub.add_parser("runs", help="collect fine-tuned run folders into the table")
    runs.add_argument("dirs", nargs="+", type=Path)
    runs.add_argument("--name", action="append", default=[], help="a label per run, in order")
    runs.add_argument(
        "--recipe",
        action="append",
        default=[],
        help="the recipe a run belongs to, in order (runs of one recipe differ only in seed)",
    )
    errors = sub.add_parser("errors", help="OOD film and series sentences the runs misread")
    errors.add_argument("dirs", nargs="+", type=Path)
    errors.add_argument("--label", required=True, help="what these runs are (a recipe's name)")
    return p


def _load() -> dict:
    path = RESULTS / f"{STEM}.json"
    return json.loads(path.read_text()) if path.exists() else {"floors": {}, "runs": {}}


def _splits(train_examples: int, extra_train: str = ""):
    """Texts and labels of train (sampled as the task samples), val, test, OOD, tutorial and
    ``extra_train``'s corpus (read as the task reads it)."""
    from attnlab.data import load_chinese_reviews, stratified_split
    from attnlab.data.sentiment import TUTORIAL_EXAMPLES, load_ood, ood_files
    from attnlab.data.splits import stratified_sample

    corpus = load_chinese_reviews()
    split = stratified_split(corpus.labels, (0.8, 0.1, 0.1), 0)
    full_train = list(split["train"])
    keep = stratified_sample([corpus.labels[i] for i in full_train], train_examples, 0)
    split["train"] = [full_train[j] for j in keep]
    out = {
        name: ([corpus.texts[i] for i in idx], [corpus.labels[i] for i in idx])
        for name, idx in split.items()
    }
    out["train_all"] = (
        [corpus.texts[i] for i in full_train],
        [corpus.labels[i] for i in full_train],
    )
    for name in ood_files():
        ood, tags = load_ood(name)
        out[f"ood_{name}"] = (ood.texts, ood.labels)
        out[f"contrast_{name}"] = (  # the 转折 sentences (虽然…但是, 可惜, 不过 …)
            [t for t, tag in zip(ood.texts, tags) if tag["phenomenon"] == "contrast"],
            [y for y, tag in zip(ood.labels, tags) if tag["phenomenon"] == "contrast"],
        )
    out["tutorial"] = ([t for t, _ in TUTORIAL_EXAMPLES], [label for _, label in TUTORIAL_EXAMPLES])
    if extra_train:
        from attnlab.data.sentiment import read_corpus

        extra = read_corpus(extra_train, "text", "label")
        out["extra"] = (extra.texts, extra.labels)
    return out


def _accuracy(pred: Sequence[str], gold: Sequence[str]) -> float:
    return sum(p == g for p, g in zip(pred, gold)) / len(gold)


def _features(model, tokenizer, texts: list[str], max_len: int = 128):
    import torch

    from attnlab.data import pad_batch
    from attnlab.models.bert import mean_pool

    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = torch.empty(len(texts), model.cfg.d_model, dtype=torch.float64)
    with torch.no_grad():
        for start in range(0, len(order), 64):
            rows = order[start : start + 64]
            ids, lengths = pad_batch(tokenizer.encode_batch([texts[i] for i in rows], max_len), 1)
            out[rows] = mean_pool(model(ids, lengths), lengths).double()
    return out


def _logreg(x, y, decay: float):
    """Mean cross-entropy + decay · ||W||² by L-BFGS, as the task's probe_first fits it."""
    import torch

    head = torch.nn.Linear(x.shape[1], 2).double()
    torch.nn.init.zeros_(head.weight), torch.nn.init.zeros_(head.bias)
    opt = torch.optim.LBFGS(head.parameters(), max_iter=500, tolerance_grad=1e-9,
                            history_size=20, line_search_fn="strong_wolfe")  # fmt: skip

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(head(x), y) + decay * head.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return head


def probe(args: argparse.Namespace) -> dict:
    import torch

    from attnlab.models.e5 import load_e5

    data = _splits(args.train_examples, args.extra_train)
    model, tokenizer = load_e5()
    model.eval()
    labels = sorted(set(data["train"][1]))
    feats, seconds = {}, {}
    for name, (texts, _) in data.items():
        if name == "train_all" and (args.train_examples == 0 or not args.probe_full):
            continue
        start = time.perf_counter()
        print(f"e5 features: {name} ({len(texts)} texts)", flush=True)
        feats[name] = _features(model, tokenizer, texts)
        seconds[name] = time.perf_counter() - start
    if "extra" in feats:  # the sample plus the extra corpus, as one training set
        feats["train_extra"] = torch.cat([feats["train"], feats.pop("extra")])
        data["train_extra"] = tuple(a + b for a, b in zip(data["train"], data.pop("extra")))
    floors = {}
    for train_name in ("train", "train_all", "train_extra"):
        if train_name not in feats:
            continue
        y = torch.tensor([labels.index(v) for v in data[train_name][1]])
        best = None
        for decay in PROBE_DECAYS:
            head = _logreg(feats[train_name], y, decay)
            val = _accuracy([labels[i] for i in head(feats["val"]).argmax(-1)], data["val"][1])
            if best is None or val > best[0]:
                best = (val, decay, head)
        val, decay, head = best
        row: dict = {"weight_decay": decay, "n_train": len(y), "val": val}
        with torch.no_grad():
            for name in (
                "test",
                "ood_dev",
                "ood_test",
                "contrast_dev",
                "contrast_test",
                "tutorial",
            ):
                if name in feats:
                    probs = torch.softmax(head(feats[name]), -1)[:, labels.index("positive")]
                    pred = [labels[i] for i in head(feats[name]).argmax(-1)]
                    row[name] = _accuracy(pred, data[name][1])
                    if name == "tutorial":
                        row["tutorial_p_positive"] = [round(float(p), 3) for p in probs]
        extra = f" with {args.extra_train}" if train_name == "train_extra" else ""
        floors[f"frozen e5 + linear probe ({len(y)} train{extra})"] = row
    for train_name in ("train", "train_all"):
        floors[f"TF-IDF char 1-3 + LR ({len(data[train_name][0])} train)"] = _tfidf(
            data, train_name
        )
    return {"floors": floors, "feature_seconds": seconds}


def _tfidf(data: dict, train_name: str) -> dict:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    vec = TfidfVectorizer(analyzer="char", ngram_range=(1, 3), sublinear_tf=True, min_df=2)
    x = vec.fit_transform(data[train_name][0])
    clf = LogisticRegression(C=4.0, max_iter=2000).fit(x, data[train_name][1])
    row: dict = {"n_train": len(data[train_name][0])}
    for name in ("val", "test", "ood_dev", "ood_test", "contrast_dev", "contrast_test", "tutorial"):
        if name in data:
            row[name] = _accuracy(clf.predict(vec.transform(data[name][0])), data[name][1])
    pos = list(clf.classes_).index("positive")
    row["tutorial_p_positive"] = [
        round(float(p[pos]), 3) for p in clf.predict_proba(vec.transform(data["tutorial"][0]))
    ]
    return row


def runs(args: argparse.Namespace) -> dict:
    from attnlab.data.sentiment import TUTORIAL_EXAMPLES
    from attnlab.infer.classifier import ClassifierRun

    out = {}
    names = args.name + [d.name for d in args.dirs[len(args.name) :]]
    recipes = args.recipe + names[len(args.recipe) :]
    for name, recipe, run_dir in zip(names, recipes, args.dirs):
        results = json.loads((run_dir / "results.json").read_text())
        summary = json.loads((run_dir / "summary.json").read_text())
        config = json.loads((run_dir / "config.json").read_text())
        run = ClassifierRun.load(run_dir)
        preds = run.predict([t for t, _ in TUTORIAL_EXAMPLES])
        size = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
        report = json.loads((run_dir / "data_report.json").read_text())
        by_domain = {
            split: results["ood"][split]["accuracy_by"]["domain"] for split in ("dev", "test")
        }
        out[name] = {
            "recipe": recipe,
            "config": {"data": config["data"], "train": config["train"]},
            "ood_domain": {
                f"{domain}_{split}": by_domain[split][domain]["accuracy"]
                for split in ("dev", "test")
                for domain in ("film", "series")
                if domain in by_domain[split]
            },
            "n_train": report["split_sizes"]["train"],  # the sample plus any extra_train
            "data": {
                k: config["data"].get(k)
                for k in (
                    "train_examples",
                    "extra_train",
                    "extra_train_examples",
                    "train_layers",
                    "clean_labels",
                    "clean_extra_train",
                    "probe_first",
                    "probe_examples",
                    "attn_dropout",
                )
            },  # fmt: skip
            "train": {
                k: config["train"][k] for k in ("lr", "epochs", "batch_size", "grad_accum", "seed")
            },
            "val": results["val"]["accuracy"],
            "test": results["test"]["accuracy"],
            "ood_dev": results["ood"]["dev"]["accuracy"],
            "ood_test": results["ood"]["test"]["accuracy"],
            **{
                f"contrast_{split}": results["ood"][split]["accuracy_by"]["phenomenon"]["contrast"][
                    "accuracy"
                ]
                for split in ("dev", "test")
            },
            "tutorial": _accuracy([p["label"] for p in preds], [w for _, w in TUTORIAL_EXAMPLES]),
            "tutorial_p_positive": [round(p["probs"]["positive"], 3) for p in preds],
            "wall_s": summary["wall_time_s"],
            "cpu_s": summary["cpu_time_s"],
            "peak_gib": round(results["process"]["peak_rss_mib"] / 1024, 2)
            if "process" in results
            else None,
            "run_folder_mb": round(size / 2**20, 1),
        }
    return {"runs": out}


def errors(args: argparse.Namespace) -> dict:
    """The OOD film and series sentences (dev and test) that any of the runs misreads, with
    each run's p(positive)."""
    from attnlab.data.sentiment import load_ood, ood_files
    from attnlab.infer.classifier import ClassifierRun

    loaded = [ClassifierRun.load(run_dir) for run_dir in args.dirs]
    rows = []
    for split in ood_files():
        corpus, tags = load_ood(split)
        keep = [i for i, tag in enumerate(tags) if tag["domain"] in ("film", "series")]
        texts = [corpus.texts[i] for i in keep]
        probs = [[p["probs"]["positive"] for p in run.predict(texts)] for run in loaded]
        for j, i in enumerate(keep):
            gold = corpus.labels[i]
            ps = [run_probs[j] for run_probs in probs]
            wrong = sum((p >= 0.5) != (gold == "positive") for p in ps)
            if wrong:
                rows.append({
                    "split": split, "text": corpus.texts[i], "label": gold,
                    "domain": tags[i]["domain"], "phenomenon": tags[i]["phenomenon"],
                    "wrong": wrong, "p_positive": [round(p, 3) for p in ps],
                })  # fmt: skip
    rows.sort(key=lambda r: (-r["wrong"], r["split"], r["text"]))
    return {"errors": {args.label: {"runs": [str(d) for d in args.dirs], "rows": rows}}}


def _mean_range(values: list[float]) -> str:
    """mean (min–max) to the digits a 210-sentence set resolves; the mean alone for one run."""
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.3f}"
    return f"{mean:.3f} ({min(values):.3f}–{max(values):.3f})"


def recipe_table(runs: dict) -> list[str]:
    """One row per recipe: the mean and range over its seeds of every score, and the third
    tutorial sentence's p(positive) in each seed."""
    groups: dict[str, list[dict]] = {}
    for r in runs.values():
        if "recipe" in r:
            groups.setdefault(r["recipe"], []).append(r)
    if not groups:
        return []
    lines = [
        "## Ablations: each recipe over its training seeds",
        "",
        "Mean (min–max) over the seeds. OOD 转折: the 38 dev and 38 test sentences whose "
        "sentiment turns. Third sentence: p(positive) of 电影前半段很无聊，但是结局让我感动 in "
        "each seed (≥ 0.8 is the target). Wall time and peak memory: the largest of the seeds.",
        "",
        "| recipe | seeds | val | test | OOD dev | OOD test | 转折 dev | 转折 test "
        "| film dev / test | third sentence | wall min | peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for recipe, rs in groups.items():
        keys = ("val", "test", "ood_dev", "ood_test", "contrast_dev", "contrast_test")
        cells = [_mean_range([r[k] for r in rs]) for k in keys]
        film = " / ".join(
            f"{sum(r['ood_domain'][k] for r in rs) / len(rs):.3f}"
            for k in ("film_dev", "film_test")
            if all(k in r.get("ood_domain", {}) for r in rs)
        )
        third = ", ".join(f"{r['tutorial_p_positive'][2]:.2f}" for r in rs)
        wall = max(r["wall_s"] for r in rs) / 60
        peaks = [r["peak_gib"] for r in rs if r.get("peak_gib")]
        peak = f"{max(peaks):.2f}" if peaks else ""
        lines.append(
            f"| {recipe} | {len(rs)} | " + " | ".join(cells)
            + f" | {film} | {third} | {wall:.1f} | {peak} |"
        )  # fmt: skip
    return lines + [""]


def error_lines(data: dict) -> list[str]:
    """The misread OOD film and series sentences of each labelled group of runs."""
    lines = []
    for label, e in data.get("errors", {}).items():
        n = len(e["runs"])
        lines += [
            f"## OOD film and series sentences misread: {label}",
            "",
            f"{len(e['rows'])} sentences wrong in at least one of {n} runs; p(positive) per run.",
            "",
            "| split | text | label | phenomenon | wrong in | p(positive) |",
            "|---|---|---|---|---|---|",
        ]
        for r in e["rows"]:
            ps = ", ".join(f"{p:.2f}" for p in r["p_positive"])
            lines.append(
                f"| {r['split']} | {r['text']} | {r['label']} | {r['phenomenon']} "
                f"| {r['wrong']} of {n} | {ps} |"
            )
        lines += ["", *error_reading(label, data["errors"]), ""]
    return lines


def _always_wrong(group: dict) -> list[dict]:
    return [r for r in group["rows"] if r["wrong"] == len(group["runs"])]


def error_reading(label: str, groups: dict) -> list[str]:
    """What the misread sentences are, counted: those wrong in every run by their label and
    phenomenon, and beside each other group, which of its always-wrong sentences every run
    here reads right (what the recipes' difference moved) and the reverse."""
    always = _always_wrong(groups[label])
    praise = sum(r["label"] == "positive" for r in always)
    kinds: dict[str, int] = {}
    for r in always:
        kinds[r["phenomenon"]] = kinds.get(r["phenomenon"], 0) + 1
    by_kind = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
    lines = [
        f"Wrong in every run: {len(always)}, of them {praise} positive sentences read as "
        f"negative (by phenomenon: {by_kind})."
    ]
    here = {r["text"] for r in groups[label]["rows"]}
    for other, group in groups.items():
        if other == label:
            continue
        fixed = [r["text"] for r in _always_wrong(group) if r["text"] not in here]
        broken = sorted({r["text"] for r in always} - {r["text"] for r in group["rows"]})
        lines.append(
            f"Beside «{other}»: {len(fixed)} of its always-wrong sentences are right in every "
            f"run here{''.join(': ' + '; '.join(fixed) for _ in fixed[:1])}; {len(broken)} "
            f"right in every run there are wrong in every run here"
            f"{''.join(': ' + '; '.join(broken) for _ in broken[:1])}."
        )
    return lines


def render(data: dict) -> list[str]:
    lines = [
        "# The main job with multilingual-e5-small: recipes beside the floors",
        "",
        machine_line(data["machine"]),
        "",
        "One split (the character model's: seed 0, 80/10/10; in-domain test n = 1,736), OOD "
        "dev/test n = 210 each, the tutorial's three sentences (accuracy, then p(positive) of "
        "each: the first and third are positive, the second negative). OOD 转折: the 38 dev and "
        "38 test sentences whose sentiment turns (虽然…但是, 不过, 可惜 …). The single-seed pilots "
        "that chose which levers to measure, with their commands, are in "
        "[classify_e5_pilots.md](classify_e5_pilots.md).",
        "",
        "| recipe | train | val | test | OOD dev | OOD test | OOD 转折 dev / test | tutorial "
        "| p(positive) | wall s | CPU s | peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ablations = recipe_table(data.get("runs", {}))
    if ablations:  # under the page's introduction: the recipes first, every run below
        lines[6:6] = ablations
    rows = {**data.get("floors", {}), **data.get("runs", {})}
    for name, r in rows.items():
        n = r.get("n_train", "")
        p = ", ".join(f"{v:.2f}" for v in r.get("tutorial_p_positive", []))
        cells = [f"{r[k]:.4f}" if isinstance(r.get(k), float) else "" for k in
                 ("val", "test", "ood_dev", "ood_test")]  # fmt: skip
        tut = f"{r['tutorial']:.2f}" if "tutorial" in r else ""
        turn = " / ".join(f"{r[k]:.2f}" for k in ("contrast_dev", "contrast_test") if k in r)
        cells.append(turn)
        wall = f"{r['wall_s']:.0f}" if "wall_s" in r else ""
        cpu = f"{r['cpu_s']:.0f}" if "cpu_s" in r else ""
        peak = f"{r['peak_gib']:.2f}" if r.get("peak_gib") else ""
        lines.append(
            f"| {name} | {n} | " + " | ".join(cells) + f" | {tut} | {p} | {wall} | {cpu} | {peak} |"
        )
    lines.append(
        "\nEach fine-tuned row is a run of `attnlab train classify --out DIR` with the settings "
        "below (the rest from presets/classify.toml); the table reads its folder."
    )
    for name, r in data.get("runs", {}).items():
        lines.append(
            f"\n{name}: data {r['data']}, train {r['train']}, run folder {r['run_folder_mb']} MB"
        )
    return lines + [""] + error_lines(data)


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    info = machine(threads=set_threads(getattr(args, "threads", 1)))
    data = _load()
    result = {"probe": probe, "runs": runs, "errors": errors}[args.mode](args)
    for key, value in result.items():
        data.setdefault(key, {}).update(value) if isinstance(value, dict) else None
    info["load_average_at_end"] = load_average()
    data["machine"] = info
    data.setdefault("commands", {})[command_line(argv)] = args.mode  # every command that ran
    from benchmarks.common import write_results

    write_results(STEM, data, render(data), command="; ".join(data["commands"]))


if __name__ == "__main__":
    main()
