"""End-to-end tests of the BERT commands: embed, similarity, search, train mlm, fine-tuning.

MLM pretraining and fine-tuning run a tiny BERT on a synthetic English corpus (seconds on a
CPU); the embedding commands use the real all-MiniLM-L6-v2 checkpoint.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.cli import main
from attnlab.models.bert_folder import read_folder
from attnlab.runs import training

os.environ["HF_HUB_OFFLINE"] = "1"

TINY_MLM = [
    "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--d-ff", "64",
    "--vocab-size", "120", "--min-frequency", "1", "--max-len", "24",
    "--batch-size", "16", "--lr", "3e-3", "--warmup-ratio", "0",
    "--tensorboard", "false", "--precision", "fp32", "--num-threads", "1",
]  # fmt: skip
TRAIN = ["--tensorboard", "false", "--precision", "fp32", "--num-threads", "1"]
POSITIVE = ["great", "wonderful", "superb", "lovely"]
NEGATIVE = ["awful", "terrible", "boring", "dreadful"]
FILLER = ["the", "a", "movie", "film", "plot", "actor", "story", "was", "very", "and", "but"]


def write_corpus(root: Path, n: int = 240, seed: int = 0) -> tuple[Path, Path]:
    """A labelled CSV (one sentiment word decides the label) and the same texts as .txt."""
    rng = random.Random(seed)
    rows, texts = ["text,label"], []
    for i in range(n):
        label, words = ("positive", POSITIVE) if i % 2 else ("negative", NEGATIVE)
        body = [rng.choice(FILLER) for _ in range(rng.randint(4, 12))]
        body.insert(rng.randrange(len(body) + 1), rng.choice(words))
        rows.append(f"{' '.join(body)},{label}")
        texts.append(" ".join(body))
    (root / "reviews.csv").write_text("\n".join(rows) + "\n")
    (root / "reviews.txt").write_text("\n".join(texts) + "\n")
    return root / "reviews.csv", root / "reviews.txt"


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bert")
    csv_file, txt_file = write_corpus(root)
    run = root / "mlm"
    args = ["train", "mlm", "--data", str(txt_file), "--out", str(run), "--epochs", "6"]
    assert main(args + TINY_MLM) == 0
    return run, csv_file


def test_mlm_loss_falls_and_the_run_is_a_checkpoint(mlm_run):
    run, _ = mlm_run
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    val = [r["val_loss"] for r in records if r["split"] == "val"]
    assert len(val) == 6
    vocab = json.loads((run / "data_report.json").read_text())["vocab_size"]
    assert val[0] < np.log(vocab)  # better than uniform after one epoch
    assert val[-1] < val[0] - 0.3, val  # and still falling
    report = json.loads((run / "data_report.json").read_text())
    assert report["texts"] == {"train": 192, "val": 24} and report["test_texts_excluded"] == 24
    encoder, mlm, tokenizer, notes = read_folder(run / "checkpoint", with_mlm=True)
    assert notes == [] and mlm is not None
    assert encoder.cfg.d_model == 32 and tokenizer.vocab_size == vocab


def test_mlm_continues_from_a_checkpoint_with_its_tokenizer(mlm_run, tmp_path):
    run, csv_file = mlm_run
    out = tmp_path / "more"
    args = ["train", "mlm", "--arch", str(run), "--data", str(csv_file), "--out", str(out)]
    assert main(args + ["--max-steps", "2", "--max-len", "24"] + TRAIN) == 0
    before = (run / "tokenizer.json").read_text()
    assert (out / "checkpoint" / "tokenizer.json").read_text() == before
    config = json.loads((out / "config.json").read_text())
    report = json.loads((out / "data_report.json").read_text())
    assert report["init_from"] == str(run.resolve()) and config["bert"]["d_model"] == 32


def test_finetune_from_the_mlm_run_then_predict_and_eval(mlm_run, tmp_path, capsys):
    run, csv_file = mlm_run
    out = tmp_path / "ft"
    args = ["train", "classify", "--arch", str(run), "--data", str(csv_file), "--out", str(out)]
    assert main(args + ["--epochs", "8", "--lr", "2e-3", "--batch-size", "16"] + TRAIN) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["test"]["accuracy"] >= 0.85, results["test"]
    config = json.loads((out / "config.json").read_text())
    assert config["task"] == "classify" and config["model"]["d_model"] == 32
    capsys.readouterr()

    assert main(["predict", str(out), "--json", "a wonderful film", "the plot was dreadful"]) == 0
    preds = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["label"] for p in preds] == ["positive", "negative"]
    assert all(abs(sum(p["probs"].values()) - 1) < 1e-5 for p in preds)

    assert main(["eval", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["accuracy"] == pytest.approx(results["test"]["accuracy"])
    assert report["n"] == 24
    assert main(["eval", str(out), "--data", str(csv_file), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n"] == 240 and report["source"] == str(csv_file)


def test_pretrained_false_keeps_the_architecture_but_not_the_weights(mlm_run, tmp_path):
    from attnlab.infer.classifier import ClassifierRun

    run, csv_file = mlm_run
    overrides = {"arch": str(run), "data": str(csv_file), "pretrained": "false", "max_steps": "1"}
    overrides |= {"lr": "1e-9", "tensorboard": "false", "precision": "fp32", "warmup_ratio": "0"}
    training.train("classify", tmp_path / "scratch", overrides)
    model = ClassifierRun.load(tmp_path / "scratch").model
    pretrained, _, _, _ = read_folder(run / "checkpoint")
    word = model.bert.embeddings.word.weight
    assert word.shape == pretrained.embeddings.word.weight.shape
    assert not torch.allclose(word, pretrained.embeddings.word.weight, atol=1e-3)


def test_an_encoder_refuses_options_of_the_character_model(mlm_run, tmp_path, capsys):
    run, csv_file = mlm_run
    args = ["train", "classify", "--arch", str(run), "--data", str(csv_file), "--d-model", "64"]
    assert main(args + ["--out", str(tmp_path / "x")]) == 2
    assert "--d-model is a setting of --arch char" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# --------------------------------------------------------------------------- MiniLM commands


def test_embed_writes_unit_vectors_as_json_or_npy(tmp_path, capsys):
    assert main(["embed", "--arch", "minilm", "a cat", "a dog"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in rows] == ["a cat", "a dog"]
    vectors = np.array([r["vector"] for r in rows])
    assert vectors.shape == (2, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    out = ["--out", str(tmp_path / "v.npy")]
    assert main(["embed", "--arch", "minilm", "a cat", "a dog", *out]) == 0
    assert np.allclose(np.load(tmp_path / "v.npy"), vectors, atol=1e-6)
    assert main(["embed", "--arch", "minilm", "a cat", "--out", str(tmp_path / "v.csv")]) == 2
    assert ".npy or .json" in capsys.readouterr().err


def test_similarity_ranks_a_paraphrase_above_an_unrelated_sentence(capsys):
    minilm = ["--arch", "minilm"]
    assert main(["similarity", "A man is playing a guitar.", "Someone plays an instrument.",
                 *minilm]) == 0  # fmt: skip
    close = float(capsys.readouterr().out)
    assert main(["similarity", "A man is playing a guitar.", "Interest rates rose again.",
                 *minilm]) == 0  # fmt: skip
    far = float(capsys.readouterr().out)
    assert -1 <= far < close <= 1 and close - far > 0.3


def test_similarity_reads_chinese_with_the_multilingual_default(capsys):
    """The default encoder is e5: a Chinese paraphrase is closer than an unrelated sentence
    (MiniLM, English only, reads Chinese characters as unknown pieces)."""
    assert main(["similarity", "这部电影非常好看", "这部片子很精彩"]) == 0
    close = float(capsys.readouterr().out)
    assert main(["similarity", "这部电影非常好看", "明天早上股票市场下跌"]) == 0
    far = float(capsys.readouterr().out)
    assert -1 <= far < close <= 1


def test_search_returns_the_closest_lines_first(tmp_path, capsys):
    docs = tmp_path / "docs.txt"
    docs.write_text(
        "The cat sleeps on the sofa.\n\nStocks fell sharply on Monday.\n"
        "A guitarist played to a full stadium.\nHow to bake bread at home\n"
    )
    args = ["search", str(docs), "live music concert", "kitchen recipe", "-k", "2"]
    assert main([*args, "--arch", "minilm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "query: live music concert"
    assert lines[1].endswith("A guitarist played to a full stadium.")
    assert lines[4].endswith("How to bake bread at home")
    assert len(lines) == 6
    assert main(["search", str(docs), "stock market crash", "--json", "-k", "1"]) == 0  # e5
    hit = json.loads(capsys.readouterr().out)
    assert hit["text"] == "Stocks fell sharply on Monday." and hit["rank"] == 1
