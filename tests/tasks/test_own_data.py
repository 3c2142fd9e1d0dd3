"""`attnlab train classify --data FILE`: any labelled file, any label names, with the command
the README gives; the plan the run reads from the data before any model work.

The runs use the tiny random encoder of e5's layout (the ``tiny`` fixture), so each takes
seconds; the plan's rules are checked on their own without a model."""

from __future__ import annotations

import csv
import json
import math
import os
import random
from pathlib import Path

import pytest
from _cli import probe

from attnlab.cli import main
from attnlab.data.prepare import split_texts
from attnlab.errors import UserError
from attnlab.runs.training import build_config
from attnlab.tasks import classify_plan
from attnlab.tasks.classify_plan import (
    FULL_LR,
    FULL_MAX,
    IMBALANCE,
    MIN_CLEANING,
    SEEN_FULL,
    read_plan,
    sentiment_pair,
)

pytest.importorskip("semantra_multilingual")
os.environ["HF_HUB_OFFLINE"] = "1"

GOOD = ["剧情紧凑，演员出色，推荐", "好看，感动，值得一看", "音乐很棒，画面美", "非常喜欢这部片子",
        "服务周到，房间干净", "物流很快，包装完好"]  # fmt: skip
BAD = ["剧情拖沓，浪费时间", "难看，无聊透顶", "演技尴尬，不推荐", "特效廉价，故事混乱",
       "房间又小又吵", "客服态度很差"]  # fmt: skip
MIDDLE = ["一般般吧", "还行，凑合", "中规中矩", "没什么特别", "普普通通", "说不上好坏"]


def readme_command(data: Path, out: Path) -> list[str]:
    """The own-data command as README.md and README.zh-CN.md give it (after `attnlab`)."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    line = next(x for x in readme.splitlines() if "attnlab train classify --data" in x)
    command = line[line.index("attnlab train classify") :].split("`")[0].split()
    assert command[:5] == ["attnlab", "train", "classify", "--data", "reviews.csv"], command
    words = [str(data) if w == "reviews.csv" else w for w in command[1:]]
    return [str(out) if w == "runs/mine" else w for w in words]


def write_file(path: Path, rows: list[tuple[str, str]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    return path


def rows_of(classes: dict[str, list[str]], copies: int = 3) -> list[tuple[str, str]]:
    rows = [(f"{t}{'！' * k}", label) for label, texts in classes.items() for t in texts
            for k in range(copies)]  # fmt: skip
    random.Random(0).shuffle(rows)
    return rows


@pytest.mark.parametrize(
    "names",
    [("好评", "差评"), ("1", "0"), ("pos", "neg", "neutral")],
    ids=["chinese", "zero-one", "three-classes"],
)
def test_the_readme_command_trains_on_a_file_of_any_labels(tiny, tmp_path, capsys, names):
    """The README's own-data command, word for word, on a file labelled 好评/差评, 0/1 or with
    three classes: the run keeps the file's labels, says which steps apply, reports per class
    and draws the confusion matrix; predict answers with the file's labels."""
    classes = dict(zip(names, (GOOD, BAD, MIDDLE)))
    data = write_file(tmp_path / "own.csv", rows_of(classes))
    out = tmp_path / "run"
    assert main(readme_command(data, out)) == 0
    captured = capsys.readouterr()
    assert json.loads((out / "labels.json").read_text())["labels"] == sorted(names)
    config = json.loads((out / "config.json").read_text())
    assert config["data"]["turns"] == 0 and config["data"]["extra_train"] == ""
    assert "turns: off: the labels" in captured.err and "extra_train: off: pang_lee" in captured.err
    assert "per class on test" in captured.out and all(n in captured.out for n in names)
    assert (out / "confusion.png").stat().st_size > 0
    report = json.loads((out / "data_report.json").read_text())
    assert [s["step"] for s in report["plan"]["steps"]][:3] == ["blocks", "extra_train", "turns"]
    assert main(["predict", str(out), "--json", GOOD[0]]) == 0
    pred = json.loads(capsys.readouterr().out.splitlines()[0])
    assert set(pred["probs"]) == set(names)


def test_turns_and_film_sentences_keep_the_data_s_own_label_names(tiny, tmp_path, capsys):
    """--positive-label names the positive side of a pair: the English film sentences and the
    composed turns join with the data's own names, and the run's classes stay the file's (the
    top-block recipe, which adds the film sentences by itself)."""
    data = write_file(tmp_path / "own.csv", rows_of({"好评": GOOD, "差评": BAD}))
    out = tmp_path / "run"
    argv = readme_command(data, out) + ["--positive-label", "好评", "--turns", "6",
                                        "--turn-threshold", "0.5", "--max-steps", "2",
                                        "--train-layers", "1"]  # fmt: skip
    assert main(argv) == 0
    assert json.loads((out / "labels.json").read_text())["labels"] == ["好评", "差评"]
    turns = json.loads((out / "turns.json").read_text())
    assert sorted(set(turns["labels"])) == ["好评", "差评"] and len(turns["texts"]) == 6
    report = json.loads((out / "data_report.json").read_text())
    extra = report["extra_training"]
    assert set(extra["label_counts"]) == {"好评", "差评"}
    assert extra["added"] == report["split_sizes"]["train"]  # at most the data's own count


def plan_of(tmp_path: Path, rows: list[tuple[str, str]], **given):
    """The plan of a run of the bundled recipe on ``rows`` with the fields ``given``."""
    data = write_file(tmp_path / "plan.csv", rows)
    cfg = build_config("classify", None, {"data": str(data), **given})
    texts = split_texts(cfg.data, tmp_path, False)
    return cfg, read_plan(cfg, texts, encoder=True)


def test_the_plan_keeps_the_bundled_recipe_for_the_bundled_kind_of_data(tmp_path, monkeypatch):
    """More than FULL_MAX positive/negative texts: the preset's top blocks, the film sentences
    at most as many as the data's texts, the turns at most a third of them; label cleaning off
    below MIN_CLEANING training texts."""
    monkeypatch.setattr(classify_plan, "FULL_MAX", 10)  # the file below has more
    cfg, plan = plan_of(tmp_path, rows_of({"positive": GOOD, "negative": BAD}, copies=5))
    n = plan.n_train
    assert n > 10 and plan.pair == {"positive": "positive", "negative": "negative"}
    assert cfg.data.train_layers == 4 and cfg.train.lr == 5e-5 and cfg.train.lr_decay == 0.6
    assert cfg.data.extra_train == "pang_lee" and cfg.data.extra_train_examples == n
    assert cfg.data.turns == n // 3 and cfg.data.clean_labels == 0 and n < MIN_CLEANING
    assert cfg.train.epochs == 10 and cfg.train.monitor == "val_acc"
    pairless = "\n".join(plan_of(tmp_path, rows_of({"1": GOOD, "0": BAD}, copies=5))[1].lines())
    hint = "are not a positive/negative pair; --positive-label NAME turns it on"
    assert pairless.count(hint) == 2  # the film sentences and the turns


def test_a_small_set_trains_every_block_on_its_own_texts(tmp_path):
    """At most FULL_MAX training texts: every block at FULL_LR with no layer-wise decay, the
    film sentences and turns off (each saying how to add them back), epochs for SEEN_FULL
    examples; a value given on the command line is kept."""
    rows = rows_of({"positive": GOOD, "negative": BAD}, copies=5)
    cfg, plan = plan_of(tmp_path, rows)
    n = plan.n_train
    assert n <= FULL_MAX and cfg.data.train_layers == 0
    assert cfg.train.lr == FULL_LR and cfg.train.lr_decay == 1.0
    assert cfg.data.extra_train == "" and cfg.data.turns == 0
    assert cfg.train.epochs == min(10, math.ceil(SEEN_FULL / n))
    lines = "\n".join(plan.lines())
    assert "blocks: on (all): at most" in lines
    assert "--extra-train pang_lee adds them" in lines and "--turns N adds them" in lines
    pairless = "\n".join(plan_of(tmp_path, rows_of({"1": GOOD, "0": BAD}, copies=5))[1].lines())
    assert "--positive-label NAME with --extra-train pang_lee turns it on" in pairless
    assert "--positive-label NAME with --turns N turns it on" in pairless
    cfg, plan = plan_of(tmp_path, rows, train_layers=4, turns=5, lr=1e-4)
    assert cfg.data.train_layers == 4 and cfg.train.lr == 1e-4 and cfg.train.lr_decay == 0.6
    assert cfg.data.turns == 5 and cfg.data.extra_train == "pang_lee"
    assert "blocks: on (top 4): as given" in "\n".join(plan.lines())


def test_the_frozen_features_take_bf16_only_where_every_block_trains(monkeypatch):
    """Full fine-tuning (the plan's train_layers 0, or every one of the blocks) reads the
    probe's features in the precision training takes, bf16 on a CPU that has it; the top
    blocks' recipe, a run asked for fp32 and a CPU without bf16 keep float32."""
    from types import SimpleNamespace

    import torch

    from attnlab.tasks import classify_steps
    from attnlab.train import precision

    def dtype(train_layers: int, asked: str = "auto") -> torch.dtype | None:
        cfg = SimpleNamespace(data=SimpleNamespace(train_layers=train_layers),
                              model=SimpleNamespace(n_layers=12),
                              train=SimpleNamespace(precision=asked))  # fmt: skip
        return classify_steps.features_dtype(cfg, SimpleNamespace(device="cpu"))

    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: True)
    assert dtype(0) is torch.bfloat16 and dtype(12) is torch.bfloat16
    assert dtype(4) is None and dtype(11) is None and dtype(0, "fp32") is None
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: False)
    assert dtype(0) is None


def test_a_given_value_is_kept_and_one_that_cannot_apply_is_refused(tmp_path, monkeypatch):
    """A field set on the command line is never adapted; --turns or a sentiment corpus given
    for labels that are no pair is refused by the plan, before any encoder is opened."""
    import attnlab.tasks.classify_steps as steps

    monkeypatch.setattr(steps, "open_encoder", lambda *a: pytest.fail("opened the encoder"))
    rows = rows_of({"a": GOOD, "b": BAD, "c": MIDDLE})
    cfg, _ = plan_of(tmp_path, rows, epochs=2, clean_labels=0.3)
    assert cfg.train.epochs == 2 and cfg.data.clean_labels == 0.3
    with pytest.raises(UserError, match="--turns 50: the labels .* give --turns 0"):
        plan_of(tmp_path, rows, turns=50)
    with pytest.raises(UserError, match="--extra-train pang_lee adds positive/negative"):
        plan_of(tmp_path, rows, extra_train="pang_lee")
    with pytest.raises(UserError, match="--positive-label names one side of a pair"):
        plan_of(tmp_path, rows, positive_label="a")


def test_imbalanced_classes_choose_the_checkpoint_on_macro_f1(tmp_path):
    many, few = GOOD * 2, BAD[:2]
    rows = rows_of({"common": many, "rare": few}, copies=4)
    cfg, plan = plan_of(tmp_path, rows)
    assert plan.imbalance > IMBALANCE
    assert cfg.train.monitor == "val_macro_f1" and cfg.train.monitor_mode == "max"
    assert "imbalanced" in "\n".join(plan.lines())


def test_sentiment_pair():
    assert sentiment_pair(["negative", "positive"], "") == {"positive": "positive",
                                                            "negative": "negative"}  # fmt: skip
    assert sentiment_pair(["0", "1"], "1") == {"positive": "1", "negative": "0"}
    assert sentiment_pair(["0", "1"], "") is None
    with pytest.raises(UserError, match="not a label of the data"):
        sentiment_pair(["0", "1"], "2")


def test_a_bad_file_stops_before_any_model_work_naming_the_line(tiny, tmp_path, capsys):
    data = tmp_path / "own.csv"
    data.write_text("text,label\n很好,好评\n,差评\n", encoding="utf-8")
    out = tmp_path / "run"
    probe(capsys, readme_command(data, out), f"{data}:3")
    assert not out.exists()


def test_every_pretrained_encoder_of_the_registry_trains_by_name(tmp_path, monkeypatch):
    """A pretrained encoder registered under a new name is an --arch of `train classify` with
    no edit to the task: the task asks the registry, and the run records the name."""
    from _e5 import tiny_e5

    from attnlab.models import registry
    from attnlab.models.bert import BertConfig, BertModel
    from attnlab.models.pretrained import Pretrained

    def load() -> Pretrained:
        model, tokenizer = tiny_e5()
        return Pretrained("stand_in", model, tokenizer, 64, {"model": "a random stand-in"})

    entry = registry.ModelEntry("stand_in", "bert", BertConfig, BertModel, None,
                                registry.tokens(), load=load)  # fmt: skip
    registry.list_models()  # every module registered first
    monkeypatch.setitem(registry._ENTRIES, "stand_in", entry)
    data = write_file(tmp_path / "own.csv", rows_of({"a": GOOD, "b": BAD}))
    out = tmp_path / "run"
    argv = readme_command(data, out) + ["--arch", "stand_in", "--max-steps", "1"]
    assert main(argv) == 0
    assert json.loads((out / "config.json").read_text())["model"]["arch"] == "stand_in"


def test_a_turn_pool_emptied_by_a_setting_is_refused_naming_it(tmp_path, monkeypatch):
    """--turns with --turn-clauses 1 leaves one clause to compose from: refused by the plan,
    before any encoder is opened, naming --turn-clauses; without --turns the preset's turns
    are off and say why."""
    import attnlab.tasks.classify_steps as steps

    monkeypatch.setattr(steps, "open_encoder", lambda *a: pytest.fail("opened the encoder"))
    rows = rows_of({"positive": GOOD, "negative": BAD})
    with pytest.raises(UserError, match="--turns 8: .* among the --turn-clauses 1 sampled; give "
                                        "a larger --turn-clauses or --turns 0"):  # fmt: skip
        plan_of(tmp_path, rows, turns=8, turn_clauses=1)
    cfg, plan = plan_of(tmp_path, rows, turn_clauses=1, train_layers=1)  # turns on by rule
    assert cfg.data.turns == 0
    assert any(d.step == "turns" and not d.on and "clauses" in d.why for d in plan.decisions)


def test_a_threshold_no_clause_reaches_is_refused_naming_it(tiny, tmp_path, capsys):
    data = write_file(tmp_path / "own.csv", rows_of({"positive": GOOD, "negative": BAD}))
    out = tmp_path / "run"
    argv = readme_command(data, out) + ["--turns", "8", "--turn-threshold", "0.9999"]
    probe(capsys, argv, "--turns 8: the probe confirms", "give a lower --turn-threshold",
          after_training=True)  # fmt: skip
    assert not out.exists()
