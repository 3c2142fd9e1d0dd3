"""`attnlab train classify --arch DIR` with a Hugging Face BERT directory the user downloaded
(bert-base-chinese's layout), here a tiny random one written by ``transformers`` with a Chinese
vocab.txt: nothing is downloaded. Parity of its tokens and hidden states is the verify check
``Chinese BERT dir``; this file runs it, then fine-tunes, predicts and refuses pickles."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.verify import registry
from attnlab.verify.check import PASS, run_check
from attnlab.verify.checks_bert_dir import write_tiny_chinese_bert

os.environ["HF_HUB_OFFLINE"] = "1"
TRAIN = ["--tensorboard", "false", "--precision", "fp32", "--num-threads", "1"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_tiny_chinese_bert(tmp_path_factory.mktemp("hf") / "bert-tiny-chinese")


def test_tokens_and_hidden_states_equal_hugging_face(seed):
    checks = {c.component: c for c in registry.CHECKS}
    row = run_check(checks["Chinese BERT dir: WordPiece ids + hidden states"], seed)
    assert row.status == PASS, row


def test_fine_tune_the_directory_on_the_bundled_reviews_then_predict(checkpoint, tmp_path, capsys):
    out = tmp_path / "ft"
    args = ["train", "classify", "--arch", str(checkpoint), "--out", str(out)]
    assert main(args + ["--max-examples", "200", "--max-steps", "3"] + TRAIN) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["task"] == "classify" and config["model"]["arch"] == str(checkpoint.resolve())
    assert config["data"]["data"] == "chinese_reviews"  # the preset's corpus
    assert config["data"]["extra_train"] == ""  # a folder's preset: no English sentences
    assert config["model"]["d_model"] == 32 and config["data"]["pretrained"]
    report = json.loads((out / "data_report.json").read_text())
    assert report["encoder"]["name"] == str(checkpoint.resolve())
    capsys.readouterr()

    texts = ["这部电影看得我热血沸腾，情节紧凑。", "鼋鼍蛟龙麟凤"]
    assert main(["predict", str(out), "--json", *texts]) == 0
    known, unseen = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert known["label"] in ("positive", "negative")
    assert sum(known["probs"].values()) == pytest.approx(1.0)
    assert known["unknown_share"] == 0.0 and not known["out_of_reach"]
    assert unseen["unknown_share"] > 0.5 and unseen["out_of_reach"]
    assert "word pieces" in unseen["warning"]


def test_the_run_starts_from_the_checkpoints_encoder_and_tokenizer(checkpoint, tmp_path):
    from attnlab.infer.classifier import ClassifierRun
    from attnlab.models.bert_folder import read_folder

    out = tmp_path / "ft0"
    args = ["train", "classify", "--arch", str(checkpoint), "--out", str(out), "--lr", "1e-12"]
    assert main(args + ["--max-examples", "40", "--max-steps", "1"] + TRAIN) == 0
    run = ClassifierRun.load(out)
    encoder, _, tokenizer, _ = read_folder(checkpoint)
    for name, value in encoder.state_dict().items():
        assert torch.allclose(run.model.bert.state_dict()[name], value, atol=1e-9), name
    text = "Good movies 很好看！"
    assert run.tokenizer.encode(text, 64) == tokenizer.encode(text, 64)


def test_a_pickle_checkpoint_is_refused_in_one_line(checkpoint, tmp_path, capsys):
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    for name in ("config.json", "vocab.txt"):
        (pickled / name).write_bytes((checkpoint / name).read_bytes())
    (pickled / "pytorch_model.bin").write_bytes(b"not read")
    args = ["train", "classify", "--arch", str(pickled), "--out", str(tmp_path / "x")]
    assert main(args + TRAIN) == 2
    err = capsys.readouterr().err.strip()
    assert "pytorch_model.bin is a pickle file, which attnlab never loads" in err
    assert "safe_serialization=True" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()
